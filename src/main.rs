//! `balancer`: the webhooks, the controller and the tools in one binary (see `balancer --help`).

use std::process::ExitCode;

use balancer::cli::{self, Cli};
use clap::Parser;

fn main() -> ExitCode {
    // One process-wide crypto provider (ring) for every rustls user, servers and clients alike.
    let _ = rustls::crypto::ring::default_provider().install_default();
    cli::main(Cli::parse())
}
