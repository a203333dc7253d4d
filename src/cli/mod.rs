//! The command line (`balancer <command>`), with every `run` flag also settable by environment
//! variable: what each command does, reading files and writing answers.

pub mod args;
mod certs;
pub mod check;
pub mod convert;
mod crd;
mod proxy_metrics;
pub mod render;
mod yaml;

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

pub use args::{Cli, Command, RunArgs};

use crate::manager;
use crate::runtime::logging::init_logging;

/// Runs one command to its end.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Certs(args) => certs::command(&args),
        Command::Crd => crd::command(),
        Command::Check(args) => check::command(&args),
        Command::Render(args) => render::command(&args),
        Command::Convert(args) => convert::command(&args),
        Command::ProxyMetrics(args) => proxy_metrics::command(args),
    }
}

/// `balancer run`: serves until SIGTERM or SIGINT.
fn run(args: RunArgs) -> ExitCode {
    init_logging(args.log_format.into(), &args.log_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(manager::run(args.config())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "balancer stopped");
            fail(&e.to_string())
        }
    }
}

/// Reads `path`, and prints what `transform` makes of its name and text, or the error.
fn rewrite<E: std::fmt::Display>(path: &Path, transform: impl FnOnce(&str, &str) -> Result<String, E>) -> ExitCode {
    let (name, text) = match read_input(path) {
        Ok(input) => input,
        Err(message) => return fail(&message),
    };
    match transform(&name, &text) {
        Ok(yaml) => out(&yaml),
        Err(e) => fail(&e.to_string()),
    }
}

/// A file's name and text; `-` is standard input.
fn read_input(path: &Path) -> Result<(String, String), String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| format!("cannot read standard input: {e}"))?;
        return Ok(("<stdin>".to_string(), text));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok((path.display().to_string(), text))
}

/// Writes to stdout; a closed pipe (`balancer crd | head`) is not an error worth a panic.
fn out(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot write to standard output: {e}")),
    }
}

fn fail(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "error: {message}");
    ExitCode::from(2)
}
