//! `taskmesh token` and protected mode as an operator meets them: the real
//! binary, `serve --auth` with a bootstrap token from the environment, tokens
//! made, used (from the environment and from a file), listed, revoked and
//! then refused — and never printed where they should not be, `--help`
//! included.

use std::path::Path;
use std::process::{Command, Output};

use taskmesh_testkit::free_port;
use taskmesh_testkit::process::spawn_server;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");

/// Runs the binary with `args` and `envs` (TASKMESH_TOKEN only as given).
async fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(&args)
            .env_remove("TASKMESH_TOKEN")
            .env_remove("TASKMESH_SERVER")
            .env_remove("TASKMESH_BOOTSTRAP_TOKEN")
            .envs(envs)
            .output()
            .expect("run taskmesh")
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_made_used_listed_revoked_and_then_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let bootstrap = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let envs = [("TASKMESH_BOOTSTRAP_TOKEN", bootstrap.as_str())];
    let _server = spawn_server(BIN.as_ref(), dir.path(), (grpc, http), &["--auth"], &envs).await;
    let url = format!("http://127.0.0.1:{grpc}");
    let boot = [("TASKMESH_TOKEN", bootstrap.as_str())];

    // Text output: the secret alone on stdout, the rest on stderr.
    let out = run(
        &[
            "token",
            "create",
            "--server",
            &url,
            "--namespace",
            "shop",
            "--role",
            "submitter",
        ],
        &boot,
    )
    .await;
    let secret = ok(&out, "token create").trim().to_string();
    assert!(
        secret.starts_with("tmk_") && secret.len() == 4 + 12 + 1 + 64,
        "{secret:?}"
    );
    assert!(text(&out.stderr).contains("shown once"));
    assert!(
        !text(&out.stderr).contains(&secret),
        "the secret is on stdout only"
    );
    // JSON output names the public id.
    let out = run(
        &[
            "token",
            "create",
            "--server",
            &url,
            "--namespace",
            "shop",
            "--role",
            "reader",
            "--name",
            "dashboards",
            "--expires",
            "30d",
            "--output",
            "json",
        ],
        &boot,
    )
    .await;
    let made: serde_json::Value =
        serde_json::from_str(&ok(&out, "token create --output json")).unwrap();
    let reader_id = made["id"].as_str().unwrap().to_string();
    assert!(made["token"].as_str().unwrap().contains(&reader_id));

    // The submitter's token works from the environment and from a file.
    let submitted = run(
        &["submit", "--server", &url, "echo", "--payload", "{}"],
        &[("TASKMESH_TOKEN", &secret)],
    )
    .await;
    ok(&submitted, "submit with TASKMESH_TOKEN");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let listed = run(
        &["list", "--server", &url, "--token-file", path(&file)],
        &[],
    )
    .await;
    assert!(ok(&listed, "list with --token-file").contains("echo"));
    // Without a token: refused, and says how to authenticate.
    let refused = run(&["list", "--server", &url], &[]).await;
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("missing or invalid token"),
        "{}",
        text(&refused.stderr)
    );

    // Listed with status and expiry, never with secrets.
    let id = &secret[4..16];
    let list = ok(
        &run(
            &["token", "list", "--server", &url, "--namespace", "shop"],
            &boot,
        )
        .await,
        "token list",
    );
    assert!(!list.contains(&secret));
    let line = |list: &str, id: &str| {
        list.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} in {list}"))
            .to_string()
    };
    assert!(line(&list, id).contains("live"), "{list}");
    assert!(line(&list, id).contains("never"), "{list}");
    assert!(
        !line(&list, &reader_id).contains("never"),
        "an expiry is shown: {list}"
    );

    // Revoked: listed as such, and refused at once.
    ok(
        &run(&["token", "revoke", "--server", &url, id], &boot).await,
        "token revoke",
    );
    let list = ok(
        &run(
            &["token", "list", "--server", &url, "--namespace", "shop"],
            &boot,
        )
        .await,
        "token list",
    );
    assert!(line(&list, id).contains("revoked"), "{list}");
    let after = run(&["list", "--server", &url], &[("TASKMESH_TOKEN", &secret)]).await;
    assert!(!after.status.success(), "a revoked token still works");
    assert!(text(&after.stderr).contains("missing or invalid token"));
    assert!(
        !text(&after.stderr).contains(&secret),
        "an error never shows the secret"
    );
}

#[tokio::test]
async fn serve_beyond_loopback_without_auth_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = format!("0.0.0.0:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let data = path(dir.path());
    let out = run(
        &[
            "serve",
            "--data-dir",
            data,
            "--grpc-addr",
            &grpc,
            "--http-addr",
            &http,
        ],
        &[],
    )
    .await;
    assert!(!out.status.success(), "serve started open on {grpc}");
    let err = text(&out.stderr);
    assert!(
        err.contains("protected mode") && err.contains("--auth"),
        "{err}"
    );
    assert!(
        !err.contains("authentication is off"),
        "refused before warning: {err}"
    );
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn help_never_shows_a_secret_from_the_environment() {
    let secrets = [
        (
            "TASKMESH_DATABASE_URL",
            "postgres://app:hunter2-db@db.internal/tm",
        ),
        (
            "TASKMESH_REDIS_URL",
            "redis://:hunter2-redis@redis.internal:6379",
        ),
        ("TASKMESH_CALLBACK_SECRET", "hunter2-callbacks"),
    ];
    for command in [&["serve", "--help"][..], &["dev", "--help"][..]] {
        let out = run(command, &secrets).await;
        let help = ok(&out, "--help");
        assert!(help.contains("--database-url"), "{help}");
        assert!(
            !help.contains("hunter2"),
            "a secret in `{}`:\n{help}",
            command.join(" ")
        );
    }
}
