//! What can fail in a reconcile, and the one way an API error is built.

use crate::proxy::OwnerError;

#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {verb} {kind} {name}: {source}")]
    Api { verb: &'static str, kind: String, name: String, source: kube::Error },
    #[error(transparent)]
    Owner(#[from] OwnerError),
    #[error("{kind} {name} already exists and is not controlled by this Balancer; rename or remove it")]
    Conflict { kind: String, name: String },
    #[error("backend Service {name} has no cluster IP (was its clusterIP set to None by hand?)")]
    NoClusterIp { name: String },
    #[error("cannot read the cached {kind} {name}: {source}")]
    Unreadable { kind: String, name: String, source: serde_json::Error },
}

/// What kind of failure an [`Error`] is: the one list, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
pub enum ErrorKind {
    /// The API server refused a request, or did not answer.
    ApiError,
    /// An object could not be read or built.
    InvalidObject,
    /// A child's name is taken by an object the Balancer does not control.
    Conflict,
    /// A backend Service has no cluster IP (one set to `None` by hand, say).
    #[strum(serialize = "NoClusterIP")]
    NoClusterIp,
}

impl ErrorKind {
    /// Every kind, so the metrics can start each series at zero.
    pub const ALL: [ErrorKind; 4] =
        [ErrorKind::ApiError, ErrorKind::InvalidObject, ErrorKind::Conflict, ErrorKind::NoClusterIp];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Error {
    /// The API server refused (or never answered) `verb` on the `kind` named `name`.
    pub fn api(verb: &'static str, kind: impl Into<String>, name: impl Into<String>, source: kube::Error) -> Error {
        Error::Api { verb, kind: kind.into(), name: name.into(), source }
    }

    /// The error's kind, as the metrics label it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Api { .. } => ErrorKind::ApiError,
            Error::Owner(_) | Error::Unreadable { .. } => ErrorKind::InvalidObject,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::NoClusterIp { .. } => ErrorKind::NoClusterIp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_values_are_the_documented_ones() {
        let kinds = ErrorKind::ALL.map(ErrorKind::as_str);
        assert_eq!(kinds, ["ApiError", "InvalidObject", "Conflict", "NoClusterIP"]);
    }
}
