//! Logs: one `tracing` subscriber for the process, as text or JSON lines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Installs the global `tracing` subscriber; `RUST_LOG` overrides `default_level`.
pub(crate) fn init_logging(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: `kubectl logs` and log pipelines get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        // Its fallback report of a failed write uses eprintln!, which panics when stderr is gone.
        .log_internal_errors(false);
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
