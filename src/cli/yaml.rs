//! YAML files as the CLI reads them: documents, Balancers among them (also inside a `List`), and
//! one document through the spec pipeline, of either API version.

use serde_json::Value;
use serde_json::value::to_raw_value;

use crate::api::conversion::{Version, convert};
use crate::api::{GROUP, KIND};
use crate::spec::{Admitted, FieldError, ObjectName, Report, SpecPolicy, admit, parse_spec};

#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: not valid YAML: {reason}")]
pub struct YamlError {
    pub source_name: String,
    pub reason: String,
}

/// Every document of a (multi-document) YAML text, read as data.
pub(super) fn yaml_documents(source_name: &str, text: &str) -> Result<Vec<Value>, YamlError> {
    serde_saphyr::from_multiple(text)
        .map_err(|e| YamlError { source_name: source_name.to_string(), reason: e.to_string() })
}

/// A Balancer document (its apiVersion is checked when it is read).
pub(super) fn is_balancer(doc: &Value) -> bool {
    doc.get("kind").and_then(Value::as_str) == Some(KIND)
}

/// What `kubectl get -o yaml` prints for several objects.
pub(super) fn is_list(kind: &str) -> bool {
    kind == "List" || kind == "BalancerList"
}

/// The Balancer documents of a (multi-document) YAML text, with their 1-based positions.
/// The Balancers among the items of a `List` (what `kubectl get -o yaml` prints) are returned
/// too, each with the position of the `List`'s document.
pub(super) fn balancer_documents(source_name: &str, text: &str) -> Result<Vec<(usize, Value)>, YamlError> {
    let mut balancers = Vec::new();
    for (i, mut doc) in yaml_documents(source_name, text)?.into_iter().enumerate() {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
        match doc.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) if is_list(&kind) => {
                balancers.extend(items.into_iter().filter(is_balancer).map(|item| (i + 1, item)));
            }
            _ if is_balancer(&doc) => balancers.push((i + 1, doc)),
            _ => {}
        }
    }
    Ok(balancers)
}

/// `metadata.name`, or `generateName*`, or empty.
pub(super) fn doc_name(doc: &Value) -> String {
    let meta = doc.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str).unwrap_or("");
    match (field("name"), field("generateName")) {
        ("", "") => String::new(),
        ("", prefix) => format!("{prefix}*"),
        (name, _) => name.to_string(),
    }
}

pub(super) fn doc_kind(doc: &serde_json::Value) -> String {
    doc.get("kind").and_then(serde_json::Value::as_str).unwrap_or("").to_string()
}

/// One document of either version through the spec pipeline: v1alpha1 is converted to
/// v1beta1 first, as the API server would before calling the webhooks.
pub(super) fn admit_document(doc: &Value, defaults: &SpecPolicy) -> Result<Admitted, Report> {
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let hub = match Version::from_api_version(api_version) {
        Some(Version::V1beta1) => parse_spec(doc),
        Some(Version::V1alpha1) => as_v1beta1(doc).and_then(|doc| parse_spec(&doc)),
        None => Err(FieldError {
            field: "apiVersion".into(),
            detail: format!("must be {GROUP}/v1beta1 or {GROUP}/v1alpha1, got {api_version:?}"),
        }),
    };
    let spec = hub.map_err(invalid)?;
    let meta = doc.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
    admit(ObjectName::from_meta(field("name"), field("generateName")), spec, defaults)
}

/// A document converted to v1beta1 (see [`crate::api::conversion`]).
fn as_v1beta1(doc: &Value) -> Result<Value, FieldError> {
    convert_document(doc, Version::V1beta1)
}

/// A Balancer document converted to `to`, exactly as the conversion webhook would.
pub(super) fn convert_document(doc: &Value, to: Version) -> Result<Value, FieldError> {
    let failed = |detail: String| FieldError { field: "apiVersion".into(), detail };
    let text = to_raw_value(doc).map_err(|e| failed(e.to_string()))?;
    let converted = convert(&text, to).map_err(|e| failed(format!("cannot convert: {e}")))?;
    serde_json::from_str(converted.get()).map_err(|e| failed(e.to_string()))
}

fn invalid(error: FieldError) -> Report {
    Report { errors: vec![error], warnings: vec![] }
}
