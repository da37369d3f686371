//! The one SQL implementation of [`Store`](crate::Store): every algorithm
//! of the store — compare-and-set transitions and their batches, claims,
//! creates with idempotency, schedule fires, the callback outbox, the
//! leader fence, lists and paging — written once over the [`Backend`] seam.
//!
//! A backend supplies only what truly differs between databases: its SQL
//! dialect (placeholders, JSON columns, locking clauses; see `dialect`),
//! transactions and statement execution, its bulk write form, the database
//! clock, its wake-up transport, and its error-code table (`crate::error`).
//!
//! Layout: `backend` is the seam, `dialect` and `statements` the SQL,
//! `rows` the column lists and arguments; `tasks` creates and reads tasks,
//! `transitions` and `batch` write events, `claims` claims READY tasks,
//! `callbacks` the outbox, `schedules` and `fires` the schedules, and
//! `store_impl` implements the trait by calling them.

mod backend;
mod batch;
mod callbacks;
mod claims;
mod dialect;
mod fires;
mod rows;
mod schedules;
mod statements;
mod store_impl;
mod tasks;
mod transitions;

use std::sync::Arc;

pub use backend::{Args, Backend, Val};
pub(crate) use backend::{args, bind_all};
pub use batch::Batch;
pub use dialect::{BulkForm, Dialect, LADDER, Ladder};
pub use statements::{Statements, list_index};

pub use crate::decode::Columns;

use crate::wake::Channels;
use crate::{ScheduleChange, TaskChange};

/// A [`Store`](crate::Store) on the database behind backend `B`. Cheap to
/// clone: clones share the backend (its pools) and the change channels.
pub struct SqlStore<B: Backend> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    backend: B,
    channels: Arc<Channels>,
}

impl<B: Backend> Clone for SqlStore<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B: Backend + std::fmt::Debug> std::fmt::Debug for SqlStore<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.inner.backend)
            .finish()
    }
}

impl<B: Backend> SqlStore<B> {
    /// A store on `backend`, publishing to `channels` (which the backend's
    /// wake-up transport also feeds with other processes' changes).
    pub(crate) fn new(backend: B, channels: Arc<Channels>) -> Self {
        Self {
            inner: Arc::new(Inner { backend, channels }),
        }
    }

    /// The backend.
    pub(crate) fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The statements of the backend's dialect.
    pub(crate) fn sql(&self) -> &'static Statements {
        self.inner.backend.sql()
    }

    /// Publishes committed changes to this process's subscribers and
    /// announces them to the other processes.
    pub(crate) fn publish(&self, tasks: &[TaskChange], schedules: &[ScheduleChange]) {
        if tasks.is_empty() && schedules.is_empty() {
            return;
        }
        self.inner.channels.send(tasks, schedules);
        self.inner.backend.announce(tasks, schedules);
    }

    fn channels(&self) -> &Channels {
        &self.inner.channels
    }
}
