//! Reading task logs back in tests: every stored line (all pages) and a
//! live follow.

use std::time::Duration;

use taskmesh::v1 as pb;
use taskmesh::v1::task_api_client::TaskApiClient;
use tonic::transport::Channel;

/// Every stored line of task `id` (all pages, 3 lines a page so paging is
/// exercised) and what each attempt kept, as the last page said.
pub async fn read_logs(
    api: &TaskApiClient<Channel>,
    id: &str,
) -> (Vec<pb::TaskLogEntry>, Vec<pb::AttemptLogs>) {
    let mut api = api.clone();
    let (mut lines, mut token) = (Vec::new(), String::new());
    loop {
        let page = api
            .get_task_logs(pb::GetTaskLogsRequest {
                task_id: id.into(),
                page_size: 3,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("GetTaskLogs")
            .into_inner();
        let done = page.end || page.lines.is_empty();
        lines.extend(page.lines);
        token = page.next_page_token;
        if done {
            return (lines, page.attempts);
        }
    }
}

/// The messages of `lines`, in order.
pub fn messages(lines: &[pb::TaskLogEntry]) -> Vec<String> {
    lines.iter().map(|l| l.message.clone()).collect()
}

/// Follows task `id`'s lines with `WatchTaskLogs` until the stream ends
/// (the task ended), failing the test after `limit`; calls `on_first`
/// with the task as read just after the first lines arrived (so a test
/// can show they came while it ran).
pub async fn follow_logs(
    api: &TaskApiClient<Channel>,
    id: &str,
    limit: Duration,
) -> (Vec<pb::TaskLogEntry>, Option<pb::Task>) {
    let mut api = api.clone();
    let follow = async {
        let mut stream = api
            .watch_task_logs(pb::WatchTaskLogsRequest {
                task_id: id.into(),
                ..Default::default()
            })
            .await
            .expect("WatchTaskLogs")
            .into_inner();
        let (mut lines, mut at_first) = (Vec::new(), None);
        while let Some(answer) = stream.message().await.expect("WatchTaskLogs stream") {
            if at_first.is_none() && !answer.lines.is_empty() {
                at_first = Some(crate::get(&mut api.clone(), id).await);
            }
            lines.extend(answer.lines);
        }
        (lines, at_first)
    };
    tokio::time::timeout(limit, follow)
        .await
        .unwrap_or_else(|_| panic!("following task {id}'s logs did not end within {limit:?}"))
}
