//! The JSON shape of every error balancer's HTTP servers answer with: `{"error": "..."}`.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// `status` with `{"error": message}`.
pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    json_bytes(status, json!({ "error": message }).to_string().into_bytes())
}

/// `status` with a JSON body.
pub(crate) fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A 404 in the same JSON shape as the other errors.
pub(crate) async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}
