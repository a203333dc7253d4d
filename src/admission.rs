//! AdmissionReview handling: from request bytes to the review the API server expects back.
//!
//! Transport-free so that the server, the benches and `balancer check` share it.
//! A body that is not a usable review is a [`BadRequest`] (HTTP 400); a usable
//! review always gets an answer carrying its `uid`, even when the object in it
//! is not a valid Balancer (then `allowed: false` says what is wrong).

use base64::Engine;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use serde_json::Value;

use crate::api::{BalancerSpec, GROUP, KIND};
use crate::defaulting::defaults_patch;
use crate::validation::{self, FieldError, ObjectName};

/// The only AdmissionReview version served (the webhook configurations ask for v1).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// Which webhook serves a review.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Webhook {
    Validate,
    Mutate,
}

/// How a review ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed with no changes.
    Allowed,
    /// Refused: the Balancer breaks a rule or is not a Balancer at all.
    Denied,
    /// Allowed with a JSON Patch of defaults.
    Patched,
    /// The HTTP request itself was unusable (HTTP 4xx).
    BadRequest,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::Validate => "validate",
            Webhook::Mutate => "mutate",
        }
    }
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Patched => "patched",
            Outcome::BadRequest => "bad_request",
        }
    }
}

impl EncodeLabelValue for Webhook {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        self.as_str().encode(encoder)
    }
}

/// Why a body cannot be answered as a review at all.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadRequest {
    #[error("the body is not an AdmissionReview: {0}")]
    Malformed(String),
    #[error("unsupported AdmissionReview apiVersion {0:?}: only {REVIEW_API_VERSION} is served")]
    UnsupportedVersion(String),
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    #[error("request.uid must not be empty")]
    MissingUid,
}

/// The answer to one review, ready to serialize.
pub struct Answer {
    pub review: AdmissionReview<DynamicObject>,
    pub outcome: Outcome,
}

impl Answer {
    /// The review as the API server expects it on the wire.
    ///
    /// kube's `AdmissionResponse` serializes `patch` as an array of byte values;
    /// the AdmissionReview API defines it as base64 (`[]byte` in Go), which is
    /// also what `curl` users and other API server versions expect, so it is
    /// re-encoded here.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let Some(patch) = self.review.response.as_ref().and_then(|r| r.patch.as_deref()) else {
            return serde_json::to_vec(&self.review);
        };
        let mut value = serde_json::to_value(&self.review)?;
        if let Some(slot) = value.pointer_mut("/response/patch") {
            *slot = Value::String(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        serde_json::to_vec(&value)
    }
}

/// Parses `body` and answers it with `webhook`'s rules.
pub fn review(webhook: Webhook, body: &[u8]) -> Result<Answer, BadRequest> {
    let request = parse_request(body)?;
    let response = AdmissionResponse::from(&request);
    let (response, outcome) = match balancer_in(&request) {
        None => (response, Outcome::Allowed),
        Some(Err(invalid)) => (deny(response, &request, invalid), Outcome::Denied),
        Some(Ok(spec)) => match webhook {
            Webhook::Validate if exempt_update(&request) => (response, Outcome::Allowed),
            Webhook::Validate => validate(response, &request, &spec),
            Webhook::Mutate => mutate(response, &spec),
        },
    };
    Ok(Answer { review: response.into_review(), outcome })
}

fn parse_request(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, BadRequest> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let review: AdmissionReview<DynamicObject> =
        serde_path_to_error::deserialize(&mut de).map_err(|e| BadRequest::Malformed(path_error(&e)))?;
    if review.types.api_version != REVIEW_API_VERSION {
        return Err(BadRequest::UnsupportedVersion(review.types.api_version));
    }
    let request: AdmissionRequest<DynamicObject> = review.try_into().map_err(|_| BadRequest::MissingRequest)?;
    if request.uid.is_empty() {
        return Err(BadRequest::MissingUid);
    }
    Ok(request)
}

/// Why the object under review cannot be checked as a Balancer.
struct NotABalancer(Vec<FieldError>);

/// The Balancer spec under review: `None` when the rules do not apply
/// (another kind, a subresource, a DELETE or CONNECT).
fn balancer_in(request: &AdmissionRequest<DynamicObject>) -> Option<Result<BalancerSpec, NotABalancer>> {
    let is_balancer = request.kind.group == GROUP && request.kind.kind == KIND;
    let is_write = matches!(request.operation, Operation::Create | Operation::Update);
    if !is_balancer || !is_write || request.sub_resource.is_some() {
        return None;
    }
    let Some(object) = &request.object else {
        return Some(Err(NotABalancer(vec![field_error("request.object", "is required for CREATE and UPDATE")])));
    };
    Some(parse_spec(&object.data).map_err(|e| NotABalancer(vec![e])))
}

/// Reads `spec` from an object's JSON, naming the exact field that has the wrong shape.
pub fn parse_spec(data: &Value) -> Result<BalancerSpec, FieldError> {
    let spec = match data.get("spec") {
        None | Some(Value::Null) => return Err(field_error("spec", "is required")),
        Some(spec) => spec,
    };
    require_objects(spec)?;
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
        field_error(&field, &e.into_inner().to_string())
    })
}

/// serde's derived structs also read a JSON array of their fields in order;
/// the API (and the CRD schema) only has objects, so arrays are refused up front.
fn require_objects(spec: &Value) -> Result<(), FieldError> {
    let not_object = |field: String, value: &Value| {
        Err(field_error(&field, &format!("must be an object, got {}", json_type(value))))
    };
    let Value::Object(fields) = spec else {
        return not_object("spec".into(), spec);
    };
    for list in ["ports", "backends"] {
        if let Some(Value::Array(items)) = fields.get(list) {
            for (i, item) in items.iter().enumerate() {
                if !item.is_object() {
                    return not_object(format!("spec.{list}[{i}]"), item);
                }
            }
        }
    }
    Ok(())
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn field_error(field: &str, detail: &str) -> FieldError {
    FieldError { field: field.to_string(), detail: detail.to_string() }
}

fn path_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    match e.path().to_string().as_str() {
        "." | "?" => e.inner().to_string(),
        path => format!("{path}: {}", e.inner()),
    }
}

/// An UPDATE that leaves the spec alone (labels, finalizers, deletion) is not judged again:
/// a Balancer stored before the rules existed, or under looser ones, can still be
/// relabelled and deleted.
fn exempt_update(request: &AdmissionRequest<DynamicObject>) -> bool {
    if request.operation != Operation::Update {
        return false;
    }
    let (Some(new), Some(old)) = (&request.object, &request.old_object) else { return false };
    new.metadata.deletion_timestamp.is_some() || new.data.get("spec") == old.data.get("spec")
}

fn object_name(request: &AdmissionRequest<DynamicObject>) -> ObjectName<'_> {
    match &request.object {
        Some(o) => ObjectName::from_meta(o.metadata.name.as_deref(), o.metadata.generate_name.as_deref()),
        None => ObjectName::Unknown,
    }
}

fn validate(
    response: AdmissionResponse,
    request: &AdmissionRequest<DynamicObject>,
    spec: &BalancerSpec,
) -> (AdmissionResponse, Outcome) {
    let report = validation::validate(object_name(request), spec);
    let mut response = if report.is_valid() { response } else { deny(response, request, NotABalancer(report.errors)) };
    if !report.warnings.is_empty() {
        response.warnings = Some(report.warnings);
    }
    let outcome = if response.allowed { Outcome::Allowed } else { Outcome::Denied };
    (response, outcome)
}

fn mutate(response: AdmissionResponse, spec: &BalancerSpec) -> (AdmissionResponse, Outcome) {
    let patch = defaults_patch(spec);
    if patch.0.is_empty() {
        return (response, Outcome::Allowed);
    }
    match response.clone().with_patch(patch) {
        Ok(patched) => (patched, Outcome::Patched),
        // Serializing a patch of strings and numbers cannot fail; if it ever did,
        // refusing is safer than letting an undefaulted object through.
        Err(e) => (response.deny(format!("internal error: cannot encode the defaults patch: {e}")), Outcome::Denied),
    }
}

/// Refuses the request the way the API server reports invalid objects:
/// `Balancer "x" is invalid: [field: problem, ...]`, HTTP 422, reason `Invalid`,
/// and one cause per field so clients can point at each.
fn deny(
    response: AdmissionResponse,
    request: &AdmissionRequest<DynamicObject>,
    invalid: NotABalancer,
) -> AdmissionResponse {
    let errors = invalid.0;
    let message = denial_message(&request.name, &errors);
    let causes = errors
        .iter()
        // As the API server's own: the field in `field`, the problem alone in `message`
        // (kubectl prints them as `* <field>: <message>`).
        .map(|e| StatusCause { reason: "FieldValueInvalid".into(), message: e.detail.clone(), field: e.field.clone() })
        .collect();
    let details = StatusDetails {
        name: request.name.clone(),
        group: GROUP.into(),
        kind: KIND.into(),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    };
    let mut response = response.deny(&message);
    response.result = Status::failure(&message, "Invalid").with_code(422).with_details(details);
    response
}

/// `Balancer "x" is invalid: a` for one error, `... is invalid: [a, b]` for several.
pub fn denial_message(name: &str, errors: &[FieldError]) -> String {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let joined = match list.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    if name.is_empty() {
        format!("{KIND} is invalid: {joined}")
    } else {
        format!("{KIND} {name:?} is invalid: {joined}")
    }
}
