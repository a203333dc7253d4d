use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine;
use clap::Parser;

use balancer::check;
use balancer::cli::{CertsArgs, CheckArgs, Cli, Command, ConvertArgs, RenderArgs};
use balancer::run;
use balancer::telemetry::{LogFormat, init_logging};
use balancer::tls;

fn main() -> ExitCode {
    // One process-wide crypto provider (ring) for every rustls user, servers and clients alike.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run_server(*args),
        Command::Certs(args) => certs(&args),
        Command::Crd => crd(),
        Command::Check(args) => check_files(&args),
        Command::Render(args) => render(&args),
        Command::Convert(args) => convert(&args),
    }
}

fn run_server(args: balancer::cli::RunArgs) -> ExitCode {
    init_logging(args.log_format, &args.log_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(run::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "balancer stopped");
            fail(&e.to_string())
        }
    }
}

fn certs(args: &CertsArgs) -> ExitCode {
    init_logging(LogFormat::Text, "warn");
    let validity = Duration::from_secs(args.validity_days * 24 * 3600);
    let generated = match tls::generate(&args.dns_names, validity) {
        Ok(g) => g,
        Err(e) => return fail(&e.to_string()),
    };
    if let Err(e) = generated.write_to(&args.out) {
        return fail(&e.to_string());
    }
    let dir = args.out.display();
    let _ = writeln!(
        std::io::stderr(),
        "wrote {dir}/{}, {dir}/{} and {dir}/{}; the caBundle for the webhook configurations is:",
        tls::CA_FILE,
        tls::CERT_FILE,
        tls::KEY_FILE
    );
    out(&format!("{}\n", base64::engine::general_purpose::STANDARD.encode(generated.ca_pem)))
}

fn crd() -> ExitCode {
    let crd = match balancer::api::crd() {
        Ok(crd) => crd,
        Err(e) => return fail(&format!("cannot merge the CRD's versions: {e}")),
    };
    match serde_saphyr::to_string(&crd) {
        Ok(yaml) => out(&yaml),
        Err(e) => fail(&format!("cannot encode the CRD: {e}")),
    }
}

fn check_files(args: &CheckArgs) -> ExitCode {
    let mut invalid = false;
    for path in &args.files {
        let (name, text) = match read_input(path) {
            Ok(input) => input,
            Err(message) => return fail(&message),
        };
        match check::check_yaml(&name, &text, &args.spec_policy()) {
            Ok(findings) => {
                invalid |= findings.iter().any(|f| !f.report.is_valid());
                let _ = std::io::stdout().write_all(check::render(&name, &findings).as_bytes());
            }
            Err(e) => return fail(&e.to_string()),
        }
    }
    if invalid { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

fn render(args: &RenderArgs) -> ExitCode {
    let (name, text) = match read_input(&args.file) {
        Ok(input) => input,
        Err(message) => return fail(&message),
    };
    match balancer::render::render_yaml(&name, &text, &args.namespace, &args.proxy.settings()) {
        Ok(yaml) => out(&yaml),
        Err(e) => fail(&e.to_string()),
    }
}

fn convert(args: &ConvertArgs) -> ExitCode {
    let (name, text) = match read_input(&args.file) {
        Ok(input) => input,
        Err(message) => return fail(&message),
    };
    match balancer::convert::convert_yaml(&name, &text, args.to.into()) {
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
