//! Log set-up for the long-running subcommands.

use clap::Args;
use taskmesh_cli::env;
use tracing_subscriber::EnvFilter;

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
    /// Installs the global subscriber (logs go to stderr).
    pub fn init(&self) {
        let filter = EnvFilter::try_new(&self.log).unwrap_or_else(|_| EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        if self.log_format == "json" {
            builder.json().init();
        } else {
            builder.init();
        }
    }
}
