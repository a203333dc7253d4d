//! The command line (`balancer <command>`), with every `run` flag also settable by environment
//! variable: what each command does, reading files and writing answers.

pub mod args;
pub mod canary;
mod certs;
pub mod check;
pub mod convert;
mod crd;
pub mod ingress_nginx;
mod io;
mod proxy_metrics;
pub mod render;
mod yaml;

use std::process::ExitCode;

pub use args::{Cli, Command, RunArgs};

use io::fail;

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
        Command::FromIngressNginx(args) => ingress_nginx::command(&args),
        Command::ProxyMetrics(args) => proxy_metrics::command(args),
        Command::Canary(args) => canary::command(&args),
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
