//! The domain of taskmesh: tasks and their state machine, retry and backoff,
//! ids, the [`Clock`], validation and the error vocabulary shared by gRPC and
//! REST.
//!
//! Architecture invariant: this crate does no I/O and knows nothing of tonic,
//! sqlx or redis. Every transition of a task is computed here by the pure
//! function [`state::apply`]; the store only persists its result with a
//! compare-and-set on the task's version.

pub mod auth;
pub mod breaker;
pub mod broadcast;
pub mod callback;
pub mod clock;
pub mod egress;
pub mod error;
pub mod id;
pub mod logs;
pub mod retention;
pub mod retry;
pub mod schedule;
pub mod state;
pub mod task;
pub mod timetable;
pub mod validate;
pub mod workflow;

pub use callback::{CallbackDelivery, CallbackJob, CallbackOutcome, CallbackPolicy, CallbackState};
pub use clock::{Clock, FakeClock, SystemClock, UnixMillis};
pub use error::ErrorCode;
pub use state::{
    AttemptChange, Event, ReleaseReason, TaskState, Transition, TransitionError, apply,
};
pub use task::{
    AttemptOutcome, AttemptRecord, Concurrency, NewTask, RetryPolicy, ShardOf, StateTimes,
    Strategy, TaskRecord,
};
