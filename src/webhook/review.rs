//! The envelope both reviews share, AdmissionReview and ConversionReview: the one served
//! apiVersion, a request with a uid the answer can carry, and what makes a body unusable.

use std::borrow::Cow;

use serde::Deserialize;

use crate::spec::report::MAX_FIELD_BYTES;
use crate::util::bounded::ObjectOnly;
use crate::util::echo::cut;

/// Largest answer the webhook sends, whatever the request: every echoed value is cut to fit.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Longest `request.uid` accepted; the API server's are 36 characters.
pub const MAX_UID_BYTES: usize = 256;

/// Largest encoded size of the reason a body is not a usable review.
const MAX_BAD_REQUEST_BYTES: usize = 1024;

/// The only AdmissionReview version served (the webhook configurations ask for v1).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// The only ConversionReview version served (the CRD asks for v1).
pub const CONVERSION_REVIEW_API_VERSION: &str = "apiextensions.k8s.io/v1";

/// Which review a body was sent as (the webhook server answers two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReviewKind {
    /// An AdmissionReview.
    Admission,
    /// A ConversionReview.
    Conversion,
}

impl ReviewKind {
    /// The one apiVersion served for this review.
    pub fn served(self) -> &'static str {
        match self {
            ReviewKind::Admission => REVIEW_API_VERSION,
            ReviewKind::Conversion => CONVERSION_REVIEW_API_VERSION,
        }
    }

    /// What every review gets checked for before it is answered: the one served apiVersion,
    /// and a request with a uid the answer can carry.
    fn checked<R>(self, api_version: &str, request: Option<R>, uid: impl Fn(&R) -> &str) -> Result<R, BadRequest> {
        if api_version != self.served() {
            return Err(BadRequest::UnsupportedVersion(self, cut(api_version, MAX_FIELD_BYTES).into_owned()));
        }
        let request = request.ok_or(BadRequest::MissingRequest(self))?;
        match uid(&request).len() {
            0 => Err(BadRequest::MissingUid),
            n if n > MAX_UID_BYTES => Err(BadRequest::UidTooLong(n)),
            _ => Ok(request),
        }
    }
}

impl std::fmt::Display for ReviewKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReviewKind::Admission => "AdmissionReview",
            ReviewKind::Conversion => "ConversionReview",
        })
    }
}

/// Why a body cannot be answered as a review at all.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadRequest {
    #[error("the body is not a usable {0}: {1}")]
    Malformed(ReviewKind, String),
    #[error("unsupported {0} apiVersion {1:?}: only {served} is served", served = .0.served())]
    UnsupportedVersion(ReviewKind, String),
    #[error("the {0} has no request")]
    MissingRequest(ReviewKind),
    #[error("request.uid must not be empty")]
    MissingUid,
    #[error("request.uid must be at most {MAX_UID_BYTES} bytes, got {0}")]
    UidTooLong(usize),
}

fn json_error(e: &serde_json::Error) -> String {
    cut(&e.to_string(), MAX_BAD_REQUEST_BYTES).into_owned()
}

/// A review as read: the apiVersion and the request, `R` being each review's own request.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a, R> {
    #[serde(borrow)]
    api_version: Cow<'a, str>,
    /// An object only: serde would otherwise read a struct from an array, field by field.
    #[serde(default = "none")]
    request: Option<ObjectOnly<R>>,
}

fn none<R>() -> Option<R> {
    None
}

/// Reads a `kind` review from `body` and checks its envelope; `uid` finds the request's uid.
pub(super) fn read_request<'a, R: Deserialize<'a>>(
    kind: ReviewKind,
    body: &'a [u8],
    uid: impl Fn(&R) -> &str,
) -> Result<R, BadRequest> {
    let review: ReviewIn<'a, R> =
        serde_json::from_slice(body).map_err(|e| BadRequest::Malformed(kind, json_error(&e)))?;
    kind.checked(&review.api_version, review.request.map(|request| request.0), uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        uid: Cow<'a, str>,
    }

    fn read(body: &str) -> Result<String, BadRequest> {
        read_request(ReviewKind::Conversion, body.as_bytes(), |r: &Request<'_>| &r.uid).map(|r| r.uid.into_owned())
    }

    #[test]
    fn a_request_is_read_from_an_object_only() {
        let envelope =
            |request: &str| format!(r#"{{"apiVersion":"{CONVERSION_REVIEW_API_VERSION}","request":{request}}}"#);
        assert_eq!(read(&envelope(r#"{"uid":"u-1"}"#)), Ok("u-1".to_string()));
        // serde would read the struct from an array, field by field: "apiVersion" as the uid.
        let array = read(&envelope(r#"["apiVersion"]"#));
        assert!(matches!(array, Err(BadRequest::Malformed(ReviewKind::Conversion, _))), "{array:?}");
    }
}
