//! `taskmesh logs ID [--follow]`: a task's log lines, read a page at a time
//! (`GetTaskLogs`) or followed until the task ends (`WatchTaskLogs`).

use clap::Args;
use taskmesh::v1 as pb;

use crate::client::{Common, Output, connect, print_json, status_error, ts};

/// `taskmesh logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Task id.
    task_id: String,
    /// Keep printing lines as they are stored, until the task has ended.
    #[arg(long, short)]
    follow: bool,
    /// Only this attempt's lines (1-based); all attempts by default.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    attempt: Option<u32>,
    #[command(flatten)]
    common: Common,
}

/// `taskmesh logs`.
pub async fn run(args: LogsArgs) -> anyhow::Result<()> {
    let mut api = connect(&args.common).await?;
    let attempt = args.attempt.unwrap_or(0);
    let namespace = args.common.namespace.clone();
    let output = args.common.output;
    let mut token = String::new();
    // What is stored now, page by page.
    let attempts = loop {
        let page = api
            .get_task_logs(pb::GetTaskLogsRequest {
                task_id: args.task_id.clone(),
                attempt,
                page_size: 1_000,
                page_token: token.clone(),
                namespace: namespace.clone(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        for line in &page.lines {
            print_line(line, output)?;
        }
        if !page.next_page_token.is_empty() {
            token = page.next_page_token.clone();
        }
        if page.end || page.lines.is_empty() {
            break page.attempts;
        }
    };
    if !args.follow {
        notes(&attempts);
        return Ok(());
    }
    // Then what comes, until the task has ended.
    let mut stream = api
        .watch_task_logs(pb::WatchTaskLogsRequest {
            task_id: args.task_id.clone(),
            attempt,
            page_token: token,
            namespace: namespace.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    while let Some(answer) = stream.message().await.map_err(status_error)? {
        for line in &answer.lines {
            print_line(line, output)?;
        }
    }
    let last = api
        .get_task_logs(pb::GetTaskLogsRequest {
            task_id: args.task_id,
            attempt,
            page_size: 1,
            page_token: String::new(),
            namespace,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    notes(&last.attempts);
    Ok(())
}

fn print_line(line: &pb::TaskLogEntry, output: Output) -> anyhow::Result<()> {
    match output {
        // One JSON object per line (JSON Lines), so a follow can be piped.
        Output::Json => print_compact(line),
        Output::Text => {
            let level = pb::LogLevel::try_from(line.level)
                .map(|l| l.as_str_name().trim_start_matches("LOG_LEVEL_"))
                .unwrap_or("?");
            println!(
                "{} {level:<5} [{}] {}",
                ts(&line.time),
                line.attempt,
                printable(&line.message)
            );
            Ok(())
        }
    }
}

/// A worker's text as it may reach a terminal: control characters (an
/// escape sequence could move the cursor or rewrite what was printed) are
/// shown escaped, tabs kept.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return text.into();
    }
    text.chars()
        .map(|c| match c {
            '\t' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect::<String>()
        .into()
}

/// `TaskLogEntry`'s descriptor, decoded once for a whole follow (`None`
/// if the embedded descriptor set lacks it).
fn entry_descriptor() -> Option<&'static prost_reflect::MessageDescriptor> {
    static DESC: std::sync::OnceLock<Option<prost_reflect::MessageDescriptor>> =
        std::sync::OnceLock::new();
    DESC.get_or_init(|| {
        prost_reflect::DescriptorPool::decode(taskmesh::FILE_DESCRIPTOR_SET)
            .ok()?
            .get_message_by_name("taskmesh.v1.TaskLogEntry")
    })
    .as_ref()
}

fn print_compact(line: &pb::TaskLogEntry) -> anyhow::Result<()> {
    // `print_json` pretty-prints; one entry per line reads better here.
    let Some(desc) = entry_descriptor() else {
        return print_json(line, "taskmesh.v1.TaskLogEntry");
    };
    let dynamic = prost_reflect::DynamicMessage::decode(
        desc.clone(),
        prost::Message::encode_to_vec(line).as_slice(),
    )?;
    println!("{}", serde_json::to_string(&dynamic)?);
    Ok(())
}

/// What was not kept, on stderr (the lines stay alone on stdout).
fn notes(attempts: &[pb::AttemptLogs]) {
    for a in attempts {
        if a.truncated {
            eprintln!(
                "attempt {}: truncated at the server's cap ({} lines, {} bytes kept; {} more refused)",
                a.attempt, a.lines, a.bytes, a.truncated_lines
            );
        }
        if a.dropped > 0 {
            eprintln!(
                "attempt {}: the worker dropped {} lines (its buffer was full)",
                a.attempt, a.dropped
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped_for_the_terminal() {
        assert_eq!(super::printable("plain\ttext"), "plain\ttext");
        assert_eq!(
            super::printable("a\u{1b}[2Jb\nc\u{7}"),
            "a\\u{1b}[2Jb\\nc\\u{7}"
        );
    }
}
