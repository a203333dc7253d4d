//! AdmissionReview handling: from request bytes to the review the API server expects back.
//!
//! Transport-free so that the server, the benches and `balancer check` share it.
//! A body that is not a usable review is a [`BadRequest`] (HTTP 400); a usable
//! review always gets an answer carrying its `uid`, even when the object in it
//! is not a valid Balancer (then `allowed: false` says what is wrong).
//!
//! Reviews are read in one pass into lean borrowed structs that keep only what
//! the rules need; everything else is skipped without being built, and the spec
//! is read from its raw JSON text. Answers are bounded: whatever a client sends,
//! the answer is at most [`MAX_ANSWER_BYTES`](super::review::MAX_ANSWER_BYTES).

use std::borrow::Cow;

use base64::Engine;
use kube::core::admission::{AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::review::{BadRequest, REVIEW_API_VERSION, ReviewKind, read_request};
use crate::api::{BalancerSpec, GROUP, KIND};
use crate::spec::report::{MAX_DETAIL_BYTES, MAX_FIELD_BYTES, MAX_LISTED_ERRORS, bounded, unlisted};
use crate::spec::{FieldError, ObjectName, SpecPolicy, admit, defaults_patch, denial_message, read_spec, unchangeable};
use crate::util::echo::cut;

/// Most warnings returned in one answer.
pub const MAX_WARNINGS: usize = 16;

/// Which webhook serves a review; the metrics' `webhook` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Webhook {
    /// `POST /validate`.
    Validate,
    /// `POST /mutate`.
    Mutate,
}

/// How a review ended; the metrics' `outcome` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
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
    /// The webhook as its metrics label names it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Outcome {
    /// The outcome as its metrics label names it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The answer to one review, ready to serialize.
pub struct Answer {
    /// The review to send back.
    pub review: AdmissionReview<DynamicObject>,
    /// How it ended, for the metrics.
    pub outcome: Outcome,
}

impl Answer {
    /// The review as the API server expects it on the wire, written in one pass.
    ///
    /// kube's `AdmissionResponse` serializes `patch` as an array of byte values;
    /// the AdmissionReview API defines it as base64 (`[]byte` in Go), which is
    /// also what `curl` users and other API server versions expect.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let Some(response) = &self.review.response else {
            return serde_json::to_vec(&self.review);
        };
        let wire = WireReview {
            api_version: REVIEW_API_VERSION,
            kind: "AdmissionReview",
            response: WireResponse {
                uid: &response.uid,
                allowed: response.allowed,
                status: &response.result,
                patch: response.patch.as_deref().map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
                patch_type: response.patch.as_ref().map(|_| "JSONPatch"),
                warnings: response.warnings.as_deref(),
            },
        };
        let mut out = Vec::with_capacity(512);
        serde_json::to_writer(&mut out, &wire)?;
        Ok(out)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    api_version: &'a str,
    kind: &'a str,
    response: WireResponse<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    status: &'a Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a [String]>,
}

// What a review is read into: only what the rules need, borrowed from the body where
// it can be. Unknown fields are skipped by serde without being built.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    #[serde(borrow)]
    kind: KindIn<'a>,
    operation: Operation,
    #[serde(default, borrow)]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    object: Option<ObjectIn<'a>>,
    #[serde(default, borrow)]
    old_object: Option<ObjectIn<'a>>,
}

#[derive(Deserialize)]
struct KindIn<'a> {
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ObjectIn<'a> {
    #[serde(default, borrow)]
    metadata: MetaIn<'a>,
    /// Read as text first: the rules parse it into a typed spec, naming the field at fault.
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaIn<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    generate_name: Option<Cow<'a, str>>,
    #[serde(default)]
    deletion_timestamp: Option<IgnoredAny>,
}

/// Parses `body` and answers it with `webhook`'s rules, defaulting with `defaults`.
pub fn review(webhook: Webhook, body: &[u8], defaults: &SpecPolicy) -> Result<Answer, BadRequest> {
    let request = read_request(ReviewKind::Admission, body, |r: &RequestIn<'_>| &r.uid)?;
    let allowed = allowed(&request.uid);
    let (response, outcome) = match balancer_write(&request) {
        None => (allowed, Outcome::Allowed),
        // The spec is neither validated nor defaulted again: a Balancer stored under looser
        // rules can still be relabelled and deleted, since such an edit leaves its spec alone.
        Some(_) if spec_unchanged(&request) => (allowed, Outcome::Allowed),
        Some(None) => {
            let missing = FieldError::new("request.object", "is required for CREATE and UPDATE");
            (deny(allowed, &request, vec![missing]), Outcome::Denied)
        }
        Some(Some(object)) => match read_spec(object.spec) {
            Err(unreadable) => (deny(allowed, &request, vec![unreadable]), Outcome::Denied),
            Ok(spec) => match webhook {
                Webhook::Validate => validate(allowed, &request, object, spec, defaults),
                Webhook::Mutate => mutate(allowed, &spec, defaults),
            },
        },
    };
    Ok(Answer { review: response.into_review(), outcome })
}

/// An allowed response carrying `uid`.
fn allowed(uid: &str) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid.to_string();
    response.allowed = true;
    response.result = Status::default();
    response
}

/// The object of a Balancer CREATE or UPDATE (itself `None` when missing); `None` when
/// the rules do not apply (another kind, a subresource, a DELETE or CONNECT).
fn balancer_write<'r, 'a>(request: &'r RequestIn<'a>) -> Option<Option<&'r ObjectIn<'a>>> {
    let is_balancer = request.kind.group == GROUP && request.kind.kind == KIND;
    let is_write = matches!(request.operation, Operation::Create | Operation::Update);
    let is_subresource = request.sub_resource.as_deref().is_some_and(|s| !s.is_empty());
    if !is_balancer || !is_write || is_subresource {
        return None;
    }
    Some(request.object.as_ref())
}

/// An UPDATE that leaves the spec alone (labels, finalizers, deletion).
fn spec_unchanged(request: &RequestIn<'_>) -> bool {
    if request.operation != Operation::Update {
        return false;
    }
    let (Some(new), Some(old)) = (&request.object, &request.old_object) else { return false };
    // Only the API server sets deletionTimestamp, when the object is deleted: an update of an
    // object being deleted is let through, so that its finalizers can be removed.
    if new.metadata.deletion_timestamp.is_some() && old.metadata.deletion_timestamp.is_some() {
        return true;
    }
    match (new.spec, old.spec) {
        (None, None) => true,
        (Some(new), Some(old)) if new.get() == old.get() => true,
        // The same spec written differently (key order, spacing) is still the same spec.
        (Some(new), Some(old)) => match (read_spec(Some(new)), read_spec(Some(old))) {
            (Ok(new), Ok(old)) => new == old,
            _ => false,
        },
        _ => false,
    }
}

fn object_name<'a>(object: &'a ObjectIn<'_>) -> ObjectName<'a> {
    ObjectName::from_meta(object.metadata.name.as_deref(), object.metadata.generate_name.as_deref())
}

fn validate(
    response: AdmissionResponse,
    request: &RequestIn<'_>,
    object: &ObjectIn<'_>,
    spec: BalancerSpec,
    defaults: &SpecPolicy,
) -> (AdmissionResponse, Outcome) {
    // What may not change from the stored object (read leniently: one that does not read has
    // nothing to compare with).
    let unchangeable = match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => read_spec(old.spec).map(|old| unchangeable(&old, &spec)).unwrap_or_default(),
        _ => Vec::new(),
    };
    let (mut response, warnings) = match admit(object_name(object), spec, defaults) {
        Ok(admitted) if unchangeable.is_empty() => (response, admitted.warnings().to_vec()),
        Ok(admitted) => (deny(response, request, unchangeable), admitted.warnings().to_vec()),
        Err(mut report) => {
            report.errors.extend(unchangeable);
            (deny(response, request, report.errors), report.warnings)
        }
    };
    if !warnings.is_empty() {
        response.warnings = Some(bounded_warnings(&warnings));
    }
    let outcome = if response.allowed { Outcome::Allowed } else { Outcome::Denied };
    (response, outcome)
}

fn mutate(response: AdmissionResponse, spec: &BalancerSpec, defaults: &SpecPolicy) -> (AdmissionResponse, Outcome) {
    // Serializing a patch of strings and numbers cannot fail; if it ever did,
    // refusing is safer than letting an undefaulted object through.
    let refuse = |response: AdmissionResponse, e: &dyn std::fmt::Display| {
        (response.deny(format!("internal error: cannot encode the defaults patch: {e}")), Outcome::Denied)
    };
    match defaults_patch(spec, defaults) {
        Ok(patch) if patch.0.is_empty() => (response, Outcome::Allowed),
        Ok(patch) => match response.clone().with_patch(patch) {
            Ok(patched) => (patched, Outcome::Patched),
            Err(e) => refuse(response, &e),
        },
        Err(e) => refuse(response, &e),
    }
}

/// Refuses the request the way the API server reports invalid objects:
/// `Balancer "x" is invalid: [field: problem, ...]`, HTTP 422, reason `Invalid`,
/// and one cause per field so clients can point at each (the first
/// [`MAX_LISTED_ERRORS`], then how many more).
fn deny(response: AdmissionResponse, request: &RequestIn<'_>, errors: Vec<FieldError>) -> AdmissionResponse {
    let name = request.name.as_deref().unwrap_or("");
    let message = denial_message(name, &errors);
    let mut causes: Vec<StatusCause> = errors
        .iter()
        .take(MAX_LISTED_ERRORS)
        .map(bounded)
        // As the API server's own: the field in `field`, the problem alone in `message`
        // (kubectl prints them as `* <field>: <message>`).
        .map(|e| StatusCause { reason: "FieldValueInvalid".into(), message: e.detail, field: e.field })
        .collect();
    if let Some(more) = unlisted(&errors) {
        causes.push(StatusCause { reason: "FieldValueTooMany".into(), message: more, field: String::new() });
    }
    let details = StatusDetails {
        name: cut(name, MAX_FIELD_BYTES).into_owned(),
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

fn bounded_warnings(warnings: &[String]) -> Vec<String> {
    let mut kept: Vec<String> =
        warnings.iter().take(MAX_WARNINGS).map(|w| cut(w, MAX_DETAIL_BYTES).into_owned()).collect();
    let more = warnings.len().saturating_sub(MAX_WARNINGS);
    if more > 0 {
        kept.push(format!("and {more} more warnings"));
    }
    kept
}
