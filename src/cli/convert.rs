//! `balancer convert`: Balancers in a YAML file rewritten to another API version.

use std::process::ExitCode;

use super::args::ConvertArgs;
use super::io::rewrite;
use super::yaml::{YamlError, convert_document, doc_kind, is_balancer, is_list, yaml_documents};
use crate::api::conversion::Version;
use crate::spec::FieldError;

/// Why `balancer convert` cannot rewrite a file.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum ConvertFileError {
    #[error(transparent)]
    Yaml(#[from] YamlError),
    #[error("{source_name}: document {document}: {reason}")]
    Document { source_name: String, document: usize, reason: String },
    #[error("cannot encode YAML: {0}")]
    Encode(String),
}

/// `balancer convert`: every Balancer in a (multi-document) YAML text rewritten to `to`, the
/// way the conversion webhook does it; other documents are copied as they are. Comments and
/// key order are not kept (the text is read as data).
pub fn convert_yaml(source_name: &str, text: &str, to: Version) -> Result<String, ConvertFileError> {
    let documents = yaml_documents(source_name, text)?;
    let mut out = String::new();
    for (i, mut doc) in documents.into_iter().enumerate() {
        let failed = |e: FieldError| ConvertFileError::Document {
            source_name: source_name.into(),
            document: i + 1,
            reason: e.detail,
        };
        if is_balancer(&doc) {
            doc = convert_document(&doc, to).map_err(failed)?;
        } else if is_list(&doc_kind(&doc))
            && let Some(items) = doc.get_mut("items").and_then(serde_json::Value::as_array_mut)
        {
            for item in items.iter_mut().filter(|item| is_balancer(item)) {
                *item = convert_document(item, to).map_err(failed)?;
            }
        }
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&doc).map_err(|e| ConvertFileError::Encode(e.to_string()))?);
    }
    Ok(out)
}

/// Runs `balancer convert`.
pub(super) fn command(args: &ConvertArgs) -> ExitCode {
    rewrite(&args.file, |name, text| convert_yaml(name, text, args.to.into()))
}
