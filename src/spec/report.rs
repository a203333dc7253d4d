//! What is wrong with a Balancer, and how it is said: field errors, the report of one spec, and
//! the denial message the webhook, the controller and the CLI all print.

use std::fmt;

use crate::api::KIND;
use crate::util::echo::cut;

/// How many random characters the API server appends to a `generateName`.
const GENERATED_SUFFIX_LEN: usize = 5;

/// One rule violation at one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field, e.g. `spec.backends[1].weight`.
    pub field: String,
    /// What is wrong with it.
    pub detail: String,
}

impl FieldError {
    /// A problem `detail` with the field at `field`.
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError { field: field.into(), detail: detail.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// The verdict on one Balancer: hard errors and legal-but-suspicious warnings.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Every rule broken, in the order they were checked.
    pub errors: Vec<FieldError>,
    /// Legal but suspicious things, for the webhook's warnings.
    pub warnings: Vec<String>,
}

impl Report {
    /// Whether no rule is broken.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    pub(crate) fn error(&mut self, field: impl Into<String>, detail: impl Into<String>) {
        self.errors.push(FieldError { field: field.into(), detail: detail.into() });
    }
}

/// The Balancer's name as the validating webhook sees it: `metadata.name`,
/// or `metadata.generateName` plus the suffix the API server will add.
#[derive(Debug, Clone, Copy)]
pub enum ObjectName<'a> {
    /// `metadata.name`.
    Name(&'a str),
    /// `metadata.generateName`: the API server adds a suffix.
    GenerateName(&'a str),
    /// Neither (a request without a name).
    Unknown,
}

impl<'a> ObjectName<'a> {
    /// The name a Balancer's metadata gives.
    pub fn from_meta(name: Option<&'a str>, generate_name: Option<&'a str>) -> Self {
        match (name.filter(|n| !n.is_empty()), generate_name.filter(|n| !n.is_empty())) {
            (Some(name), _) => ObjectName::Name(name),
            (None, Some(prefix)) => ObjectName::GenerateName(prefix),
            (None, None) => ObjectName::Unknown,
        }
    }

    /// The final name for messages; generated characters show as `?`.
    pub(crate) fn display(&self) -> String {
        match self {
            ObjectName::Name(n) => n.to_string(),
            ObjectName::GenerateName(p) => format!("{p}{}", "?".repeat(GENERATED_SUFFIX_LEN)),
            ObjectName::Unknown => String::new(),
        }
    }

    /// Length of the final name, when it can be known.
    pub(crate) fn len(&self) -> Option<usize> {
        match self {
            ObjectName::Name(n) => Some(n.len()),
            ObjectName::GenerateName(p) => Some(p.len() + GENERATED_SUFFIX_LEN),
            ObjectName::Unknown => None,
        }
    }
}

/// Most field errors listed in a denial; the rest are counted ("and N more").
pub(crate) const MAX_LISTED_ERRORS: usize = 16;

/// Largest encoded size of an echoed field path or name.
pub(crate) const MAX_FIELD_BYTES: usize = 256;
/// Largest encoded size of one problem or warning.
pub(crate) const MAX_DETAIL_BYTES: usize = 512;

/// `Balancer "x" is invalid: a` for one error, `... is invalid: [a, b]` for several,
/// listing the first [`MAX_LISTED_ERRORS`] and counting the rest; echoed text is cut.
pub fn denial_message(name: &str, errors: &[FieldError]) -> String {
    let mut list: Vec<String> = errors.iter().take(MAX_LISTED_ERRORS).map(|e| bounded(e).to_string()).collect();
    list.extend(unlisted(errors));
    let joined = match list.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    if name.is_empty() {
        format!("{KIND} is invalid: {joined}")
    } else {
        format!("{KIND} {:?} is invalid: {joined}", cut(name, MAX_FIELD_BYTES))
    }
}

/// "and N more errors", when some were left out of a denial.
pub(crate) fn unlisted(errors: &[FieldError]) -> Option<String> {
    let more = errors.len().saturating_sub(MAX_LISTED_ERRORS);
    (more > 0).then(|| format!("and {more} more errors"))
}

/// A field error whose echoed text fits the answer's budget.
pub(crate) fn bounded(error: &FieldError) -> FieldError {
    FieldError {
        field: cut(&error.field, MAX_FIELD_BYTES).into_owned(),
        detail: cut(&error.detail, MAX_DETAIL_BYTES).into_owned(),
    }
}
