//! Log set-up for the long-running subcommands.

use clap::Args;
use taskmesh_cli::env;
use taskmesh_cli::telemetry::TracingGuard;

/// Logging flags shared by `serve`, `dev` and `worker`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = env::LOG_FORMAT, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Log filter, e.g. "info" or "taskmesh_dispatcher=debug,info".
    #[arg(long, env = env::LOG, default_value = "info")]
    log: String,
}

impl LogArgs {
    /// Installs the global subscriber (logs go to stderr; spans go over
    /// OTLP when the `OTEL_*` variables ask for it) for a program exported
    /// as `service`. Keep the guard for the life of the program.
    pub fn init(&self, service: &str) -> TracingGuard {
        taskmesh_cli::telemetry::init_tracing(&self.log, self.log_format == "json", service)
    }
}
