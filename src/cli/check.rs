//! `balancer check`: the webhook's defaulting and validation, offline, on YAML files.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use serde_json::Value;

use super::args::CheckArgs;
use super::io::{fail, read_input};
use super::yaml::{YamlError, admit_document, balancer_documents, doc_name};
use crate::spec::{Report, SpecPolicy};

/// The verdict on one Balancer document.
#[derive(Debug)]
pub struct Finding {
    /// 1-based position of the document in its file.
    pub document: usize,
    /// The Balancer's name, or where it was read when it has none.
    pub name: String,
    /// Every rule it breaks, and its warnings.
    pub report: Report,
}

/// Checks every Balancer in a (multi-document) YAML text; other kinds are skipped.
pub fn check_yaml(source_name: &str, text: &str, defaults: &SpecPolicy) -> Result<Vec<Finding>, YamlError> {
    Ok(balancer_documents(source_name, text)?
        .into_iter()
        .map(|(document, doc)| Finding { document, name: doc_name(&doc), report: check_document(&doc, defaults) })
        .collect())
}

/// Defaults then validates one document, exactly as the two webhooks would in sequence.
pub fn check_document(doc: &Value, defaults: &SpecPolicy) -> Report {
    match admit_document(doc, defaults) {
        Ok(admitted) => Report { errors: vec![], warnings: admitted.warnings().to_vec() },
        Err(report) => report,
    }
}

/// Human-readable lines for one file's findings, as `balancer check` prints them.
pub fn render(source_name: &str, findings: &[Finding]) -> String {
    let mut out = String::new();
    if findings.is_empty() {
        let _ = writeln!(out, "{source_name}: no Balancer found");
    }
    for finding in findings {
        let what = format!("{source_name}: document {} (Balancer {:?})", finding.document, finding.name);
        if finding.report.is_valid() {
            let _ = writeln!(out, "{what}: valid");
        } else {
            let _ = writeln!(out, "{what}: invalid");
            for error in &finding.report.errors {
                let _ = writeln!(out, "  error: {error}");
            }
        }
        for warning in &finding.report.warnings {
            let _ = writeln!(out, "  warning: {warning}");
        }
    }
    out
}

/// Runs `balancer check`: exit code 1 when a Balancer is invalid.
pub(super) fn command(args: &CheckArgs) -> ExitCode {
    let mut invalid = false;
    for path in &args.files {
        let (name, text) = match read_input(path) {
            Ok(input) => input,
            Err(message) => return fail(&message),
        };
        match check_yaml(&name, &text, &args.policy.spec_policy()) {
            Ok(findings) => {
                invalid |= findings.iter().any(|f| !f.report.is_valid());
                let _ = std::io::stdout().write_all(render(&name, &findings).as_bytes());
            }
            Err(e) => return fail(&e.to_string()),
        }
    }
    if invalid { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
