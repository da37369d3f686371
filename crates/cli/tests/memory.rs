//! Memory under large lists, against a real `taskmesh serve` process: 100
//! tasks with 1 MiB payloads, then eight concurrent `ListTasks
//! page_size=1000` calls, repeated, in the default (summary) view and in
//! the full view. The server used to load and encode every payload of
//! every call (161 MB → 1.18 GB); now a summary page reads no bodies and a
//! full page reads only the bodies that fit in one answer, so its resident
//! memory stays under 300 MB — sampled every 10 ms from /proc while the
//! calls run. Paging through the full view still returns every payload.

use std::collections::HashSet;
use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh_testkit::process::spawn_server;
use taskmesh_testkit::*;

const BIN: &str = env!("CARGO_BIN_EXE_taskmesh");
const TASKS: usize = 100;
const MIB: usize = 1024 * 1024;

/// Resident memory of `pid` in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

async fn list(
    api: &mut taskmesh::v1::task_api_client::TaskApiClient<tonic::transport::Channel>,
    view: pb::TaskView,
    page_token: String,
) -> pb::ListTasksResponse {
    api.list_tasks(pb::ListTasksRequest {
        page_size: 1000,
        view: view as i32,
        page_token,
        ..Default::default()
    })
    .await
    .expect("list")
    .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_lists_keep_the_server_under_300_mb() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (free_port(), free_port());
    let mut server = spawn_server(BIN.as_ref(), dir.path(), (grpc, http), &[], &[]).await;
    let pid = server.pid();
    let mut api = api(([127, 0, 0, 1], grpc).into()).await;
    for i in 0..TASKS {
        let mut data = vec![b'x'; MIB - 64];
        data[0] = b'0' + (i % 10) as u8;
        api.submit_task(pb::SubmitTaskRequest {
            handler: "nobody-serves-this".into(),
            payload: Some(pb::Payload {
                data,
                content_type: "application/octet-stream".into(),
            }),
            ..Default::default()
        })
        .await
        .expect("submit");
    }
    let before = rss(pid);

    // Sample while the calls run.
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss(pid));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            peak
        })
    };
    let mut summary_pages = Vec::new();
    let mut full_pages = Vec::new();
    for _round in 0..3 {
        let mut calls = Vec::new();
        for i in 0..8 {
            let mut api = api.clone();
            let view = if i % 2 == 0 {
                pb::TaskView::Unspecified
            } else {
                pb::TaskView::Full
            };
            calls.push(tokio::spawn(async move {
                (view, list(&mut api, view, String::new()).await)
            }));
        }
        for c in calls {
            let (view, page) = c.await.unwrap();
            match view {
                pb::TaskView::Full => full_pages.push(page),
                _ => summary_pages.push(page),
            }
        }
    }
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    println!(
        "server RSS {} MB before the lists, peak {} MB during 24 concurrent page_size=1000 calls",
        before / 1_000_000,
        peak / 1_000_000
    );
    assert!(peak < 300_000_000, "peak RSS {peak} bytes");

    for page in &summary_pages {
        assert_eq!(page.tasks.len(), TASKS, "a summary page holds every task");
        assert!(page.next_page_token.is_empty());
        assert!(
            page.tasks.iter().all(|t| t.payload.is_none()),
            "no bodies in the summary view"
        );
    }
    for page in &full_pages {
        let bytes: usize = page
            .tasks
            .iter()
            .map(|t| t.payload.as_ref().map_or(0, |p| p.data.len()))
            .sum();
        assert!(!page.tasks.is_empty() && page.tasks.len() < TASKS);
        assert!(bytes <= 4 * MIB, "a full page fits one answer: {bytes}");
        assert!(!page.next_page_token.is_empty(), "and says where to go on");
    }

    // Paging through the full view returns every task with its payload.
    let mut seen = HashSet::new();
    let mut token = String::new();
    for _ in 0..TASKS {
        let page = list(&mut api, pb::TaskView::Full, token).await;
        for t in &page.tasks {
            assert_eq!(t.payload.as_ref().unwrap().data.len(), MIB - 64);
            assert!(seen.insert(t.task_id.clone()), "no task twice");
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), TASKS);
    server.kill();
}
