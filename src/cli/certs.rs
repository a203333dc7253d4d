//! `balancer certs`: a CA and a serving certificate, for clusters without cert-manager.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine;

use super::args::CertsArgs;
use super::io::{fail, out};
use crate::runtime::logging::{LogFormat, init_logging};
use crate::runtime::tls;

/// Runs `balancer certs`: writes the files, prints the base64 caBundle.
pub(super) fn command(args: &CertsArgs) -> ExitCode {
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
