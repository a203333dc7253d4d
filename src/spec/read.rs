//! The one spec reader: a Balancer's `spec` from a review's text or a stored object's JSON,
//! naming the exact field whose shape is wrong.

use serde_json::Value;
use serde_json::value::RawValue;

use super::report::FieldError;
use crate::api::BalancerSpec;
use crate::util::bounded::ObjectOnly;

/// Reads a review's `spec` text, naming the exact field that has the wrong shape.
///
/// Read first without tracking the path, which costs an allocation per key read (measured in
/// the README's performance section); only a spec that does not read is read again, to name
/// the field at fault.
pub fn read_spec(spec: Option<&RawValue>) -> Result<BalancerSpec, FieldError> {
    match spec {
        None => Err(FieldError::new("spec", "is required")),
        Some(raw) => match serde_json::from_str::<ObjectOnly<BalancerSpec>>(raw.get()) {
            Ok(spec) => Ok(spec.0),
            Err(_) => spec_from(&mut serde_json::Deserializer::from_str(raw.get())),
        },
    }
}

/// Reads `spec` from an object's JSON, naming the exact field that has the wrong shape.
pub fn parse_spec(data: &Value) -> Result<BalancerSpec, FieldError> {
    match data.get("spec") {
        None | Some(Value::Null) => Err(FieldError::new("spec", "is required")),
        Some(spec) => spec_from(spec),
    }
}

/// The one way a spec is read, from a review's text or from a stored object alike.
fn spec_from<'de, D>(deserializer: D) -> Result<BalancerSpec, FieldError>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize::<_, ObjectOnly<BalancerSpec>>(deserializer).map(|spec| spec.0).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
        FieldError { field, detail: without_position(e.inner()) }
    })
}

/// serde_json's message without " at line L column C", which would point into the spec's
/// text rather than anywhere the user wrote.
fn without_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match message.strip_suffix(&position) {
        Some(bare) if e.line() > 0 => bare.to_string(),
        _ => message,
    }
}
