//! `balancer check`: the webhook's defaulting and validation, offline, on YAML files.

use std::fmt::Write as _;

use serde_json::Value;

use crate::admission::parse_spec;
use crate::api::{GROUP, KIND, VERSION};
use crate::defaulting::with_defaults;
use crate::validation::{FieldError, ObjectName, Report, validate};

/// The verdict on one Balancer document.
#[derive(Debug)]
pub struct Finding {
    /// 1-based position of the document in its file.
    pub document: usize,
    pub name: String,
    pub report: Report,
}

#[derive(Debug, thiserror::Error)]
#[error("{source_name}: not valid YAML: {reason}")]
pub struct YamlError {
    pub source_name: String,
    pub reason: String,
}

/// The Balancer documents of a (multi-document) YAML text, with their 1-based positions.
/// The items of a `List` (what `kubectl get -o yaml` prints) count as its document's.
pub fn balancer_documents(source_name: &str, text: &str) -> Result<Vec<(usize, Value)>, YamlError> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| YamlError { source_name: source_name.to_string(), reason: e.to_string() })?;
    let is_balancer = |doc: &Value| doc.get("kind").and_then(Value::as_str) == Some(KIND);
    let mut balancers = Vec::new();
    for (i, mut doc) in documents.into_iter().enumerate() {
        match doc.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) if doc.get("kind").and_then(Value::as_str) == Some("List") => {
                balancers.extend(items.into_iter().filter(is_balancer).map(|item| (i + 1, item)));
            }
            _ if is_balancer(&doc) => balancers.push((i + 1, doc)),
            _ => {}
        }
    }
    Ok(balancers)
}

/// Checks every Balancer in a (multi-document) YAML text; other kinds are skipped.
pub fn check_yaml(source_name: &str, text: &str) -> Result<Vec<Finding>, YamlError> {
    Ok(balancer_documents(source_name, text)?
        .into_iter()
        .map(|(document, doc)| Finding { document, name: doc_name(&doc), report: check_document(&doc) })
        .collect())
}

/// `metadata.name`, or `generateName*`, or empty.
pub fn doc_name(doc: &Value) -> String {
    let meta = doc.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str).unwrap_or("");
    match (field("name"), field("generateName")) {
        ("", "") => String::new(),
        ("", prefix) => format!("{prefix}*"),
        (name, _) => name.to_string(),
    }
}

/// Defaults then validates one document, exactly as the two webhooks would in sequence.
pub fn check_document(doc: &Value) -> Report {
    let expected = format!("{GROUP}/{VERSION}");
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api_version != expected {
        return invalid(FieldError {
            field: "apiVersion".into(),
            detail: format!("must be {expected}, got {api_version:?}"),
        });
    }
    let spec = match parse_spec(doc) {
        Ok(spec) => with_defaults(&spec),
        Err(e) => return invalid(e),
    };
    let meta = doc.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
    validate(ObjectName::from_meta(field("name"), field("generateName")), &spec)
}

fn invalid(error: FieldError) -> Report {
    Report { errors: vec![error], warnings: vec![] }
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
