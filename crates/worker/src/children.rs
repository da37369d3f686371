//! A handler's child tasks: work it submits under the task it runs
//! (`parent_task_id`), with the worker's own token (a worker token may
//! submit children and nothing else). Cancelling the parent cancels them;
//! [`Children::fan_out`] adds a join, a step that runs once every child has
//! succeeded and receives their outputs by name (map / reduce).
//!
//! Submits go to the first of the worker's servers over a connection of
//! their own, made on first use. Give each child a `client_request_id`
//! derived from the parent's id (as the examples do) so a handler run
//! again after a lost attempt adds no second set.

use std::sync::{Arc, OnceLock};

use taskmesh::v1::{self as pb, task_api_client::TaskApiClient};
use tonic::transport::Channel;

use crate::{Error, Secret, WorkerOptions};

/// Where a worker's handlers submit their children: made once per worker.
pub(crate) struct ApiLink {
    server: String,
    tls: Option<crate::ClientTls>,
    token: Option<Secret>,
    namespace: String,
    channel: OnceLock<Channel>,
}

impl ApiLink {
    /// The link of a worker with `opts` (none without a server).
    pub(crate) fn of(opts: &WorkerOptions) -> Option<Arc<Self>> {
        Some(Arc::new(Self {
            server: opts.servers.first()?.clone(),
            tls: opts.tls.clone(),
            token: opts.token.clone(),
            namespace: opts.namespace.clone(),
            channel: OnceLock::new(),
        }))
    }

    fn client(&self) -> Result<TaskApiClient<Channel>, Error> {
        if let Some(c) = self.channel.get() {
            return Ok(TaskApiClient::new(c.clone()));
        }
        let channel = crate::ClientTls::endpoint(self.tls.as_ref(), &self.server)?
            .connect_timeout(std::time::Duration::from_secs(5))
            .connect_lazy();
        let channel = self.channel.get_or_init(|| channel).clone();
        Ok(TaskApiClient::new(channel))
    }

    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, Error> {
        let mut request = tonic::Request::new(message);
        crate::wire::bearer(self.token.as_ref(), &mut request)?;
        Ok(request)
    }
}

/// Submits child tasks of the task a handler runs ([`TaskContext::children`](crate::TaskContext::children)).
#[derive(Clone)]
pub struct Children {
    parent_task_id: String,
    link: Option<Arc<ApiLink>>,
}

impl std::fmt::Debug for Children {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field("parent_task_id", &self.parent_task_id)
            .field("connected", &self.link.is_some())
            .finish()
    }
}

impl Children {
    pub(crate) fn new(parent_task_id: String, link: Option<Arc<ApiLink>>) -> Self {
        Self {
            parent_task_id,
            link,
        }
    }

    /// Children of `parent_task_id` that cannot be submitted (a context
    /// made outside a worker, as in a handler's unit test): every submit
    /// is [`Error::InvalidOptions`].
    pub fn detached(parent_task_id: impl Into<String>) -> Self {
        Self::new(parent_task_id.into(), None)
    }

    /// The parent: the task this handler runs.
    pub fn parent_task_id(&self) -> &str {
        &self.parent_task_id
    }

    fn link(&self) -> Result<&ApiLink, Error> {
        self.link.as_deref().ok_or_else(|| {
            Error::InvalidOptions(
                "this context is detached from a worker: no server to submit to".into(),
            )
        })
    }

    /// Submits one child task (its `parent_task_id`, and its namespace when
    /// empty, are filled in).
    pub async fn submit(
        &self,
        mut task: pb::SubmitTaskRequest,
    ) -> Result<pb::SubmitTaskResponse, Error> {
        let link = self.link()?;
        task.parent_task_id = self.parent_task_id.clone();
        if task.namespace.is_empty() {
            task.namespace = link.namespace.clone();
        }
        let answer = link.client()?.submit_task(link.request(task)?).await?;
        Ok(answer.into_inner())
    }

    /// Submits many children in one call (one commit); each entry is
    /// answered on its own, as `SubmitTasks` answers.
    pub async fn submit_many(
        &self,
        tasks: Vec<pb::SubmitTaskRequest>,
    ) -> Result<pb::SubmitTasksResponse, Error> {
        let link = self.link()?;
        let tasks = tasks
            .into_iter()
            .map(|mut t| {
                t.parent_task_id = self.parent_task_id.clone();
                if t.namespace.is_empty() {
                    t.namespace = link.namespace.clone();
                }
                t
            })
            .collect();
        let request = link.request(pb::SubmitTasksRequest { tasks })?;
        Ok(link.client()?.submit_tasks(request).await?.into_inner())
    }

    /// Fans out: `children` (named steps without dependencies) and, when
    /// given, `join`, a step that depends on every child and receives their
    /// outputs by name, submitted as one workflow under the parent (all of
    /// it or nothing). `client_request_id` makes it idempotent (empty for
    /// none). The children's failure policy is the workflow's default:
    /// a failed child cancels the rest and the join — unless the join has
    /// `after_parents_end` set, which runs it once every child has ended,
    /// whatever its end, with the failed ones' errors in
    /// [`TaskContext::parent_errors`](crate::TaskContext::parent_errors).
    pub async fn fan_out(
        &self,
        children: Vec<pb::WorkflowStepSpec>,
        join: Option<pb::WorkflowStepSpec>,
        client_request_id: &str,
    ) -> Result<pb::SubmitWorkflowResponse, Error> {
        let link = self.link()?;
        let mut steps: Vec<pb::WorkflowStepSpec> = children
            .into_iter()
            .map(|mut c| {
                c.depends_on.clear();
                c
            })
            .collect();
        if let Some(mut join) = join {
            join.depends_on = steps.iter().map(|s| s.name.clone()).collect();
            steps.push(join);
        }
        let request = link.request(pb::SubmitWorkflowRequest {
            steps,
            client_request_id: client_request_id.to_string(),
            namespace: link.namespace.clone(),
            parent_task_id: self.parent_task_id.clone(),
            ..Default::default()
        })?;
        Ok(link.client()?.submit_workflow(request).await?.into_inner())
    }
}
