//! ConversionReview handling: from request bytes to the review the API server expects back.
//!
//! Transport-free, like [`admission`](super::admission). A body that is not a usable review is a
//! [`BadRequest`] (HTTP 400); a usable review always gets an answer carrying its `uid`,
//! `Success` with every object converted, or `Failure` saying which object could not be.
//! Objects are converted one at a time from their own text (see [`crate::api::conversion`]),
//! so memory follows the body's size, which the server bounds.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::review::{BadRequest, CONVERSION_REVIEW_API_VERSION, ReviewKind, read_request};
use crate::api::conversion::{Version, convert_into};
use crate::util::echo::cut;

/// Most objects one review may carry: a list page of the API server is 500.
pub const MAX_CONVERSION_OBJECTS: usize = 10_000;

/// Largest encoded size of a failure message.
const MAX_MESSAGE_BYTES: usize = 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    #[serde(rename = "desiredAPIVersion", borrow)]
    desired_api_version: Cow<'a, str>,
    #[serde(borrow)]
    objects: Objects<'a>,
}

/// The objects to convert, each as its own text, at most [`MAX_CONVERSION_OBJECTS`].
struct Objects<'a>(Vec<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Objects<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectsVisitor;
        impl<'de> Visitor<'de> for ObjectsVisitor {
            type Value = Vec<&'de RawValue>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a list of at most {MAX_CONVERSION_OBJECTS} objects")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut objects = Vec::new();
                while let Some(object) = seq.next_element::<&RawValue>()? {
                    if objects.len() == MAX_CONVERSION_OBJECTS {
                        let message = format_args!("must have at most {MAX_CONVERSION_OBJECTS} objects");
                        return Err(serde::de::Error::custom(message));
                    }
                    objects.push(object);
                }
                Ok(objects)
            }
        }
        deserializer.deserialize_seq(ObjectsVisitor).map(Objects)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'a str,
    kind: &'a str,
    response: ResponseOut<'a>,
}

/// A `Failure` answer (a `Success` is written object by object, see [`convert_all`]).
#[derive(Serialize)]
struct ResponseOut<'a> {
    uid: &'a str,
    result: ResultOut,
}

#[derive(Serialize)]
struct ResultOut {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

/// The answer to one ConversionReview, encoded, and whether every object converted.
pub struct Converted {
    /// The ConversionReview answer, encoded.
    pub body: Vec<u8>,
    /// Whether every object was converted.
    pub success: bool,
}

/// Parses `body` and converts its objects to the desired version.
pub fn conversion_review(body: &[u8]) -> Result<Converted, BadRequest> {
    let malformed = |reason: String| BadRequest::Malformed(ReviewKind::Conversion, reason);
    let request = read_request(ReviewKind::Conversion, body, |r: &RequestIn<'_>| &r.uid)?;
    let uid: &str = &request.uid;
    match convert_all(&request, body.len()) {
        Ok(body) => Ok(Converted { body, success: true }),
        Err(message) => {
            let review = ReviewOut {
                api_version: CONVERSION_REVIEW_API_VERSION,
                kind: "ConversionReview",
                response: ResponseOut { uid, result: ResultOut { status: "Failure", message: Some(message) } },
            };
            let body = serde_json::to_vec(&review).map_err(|e| malformed(e.to_string()))?;
            Ok(Converted { body, success: false })
        }
    }
}

/// The whole `Success` answer, each object converted straight into it (the answer is about
/// the size of the request, and nothing else is held); or why the first object that cannot
/// be converted was refused.
fn convert_all(request: &RequestIn<'_>, size_hint: usize) -> Result<Vec<u8>, String> {
    let Some(to) = Version::from_api_version(&request.desired_api_version) else {
        let desired = cut(&request.desired_api_version, 256);
        return Err(format!("desiredAPIVersion {desired:?} is not a served version of Balancers"));
    };
    let mut out = Vec::with_capacity(size_hint + 256);
    out.extend_from_slice(b"{\"apiVersion\":\"");
    out.extend_from_slice(CONVERSION_REVIEW_API_VERSION.as_bytes());
    out.extend_from_slice(b"\",\"kind\":\"ConversionReview\",\"response\":{\"uid\":");
    serde_json::to_writer(&mut out, &*request.uid).map_err(|e| e.to_string())?;
    out.extend_from_slice(b",\"result\":{\"status\":\"Success\"},\"convertedObjects\":[");
    for (i, object) in request.objects.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        convert_into(object, to, &mut out)
            .map_err(|e| cut(&format!("objects[{i}]: {e}"), MAX_MESSAGE_BYTES).into_owned())?;
    }
    out.extend_from_slice(b"]}}");
    Ok(out)
}
