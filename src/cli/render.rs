//! `balancer render`: the children the controller would apply, offline, as YAML.

use std::fmt::Write as _;
use std::process::ExitCode;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use super::args::RenderArgs;
use super::io::rewrite;
use super::yaml::{YamlError, admit_document, balancer_documents, doc_name};
use crate::api::{GROUP, KIND, STORAGE_VERSION};
use crate::proxy::{BackendTarget, Owner, ProxySettings, backend_services, proxy, proxy_disruption_budget};
use crate::spec::denial_message;

/// Stands in for the uid the API server assigns, which a file does not have.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Yaml(#[from] YamlError),
    #[error("{source_name}: document {document}: {message}")]
    Invalid { source_name: String, document: usize, message: String },
    #[error("cannot encode YAML: {0}")]
    Encode(String),
}

/// Every child object of every Balancer in `text`, as multi-document YAML, in apply order.
pub fn render_yaml(
    source_name: &str,
    text: &str,
    namespace: &str,
    settings: &ProxySettings,
) -> Result<String, RenderError> {
    let mut out = String::new();
    for (document, doc) in balancer_documents(source_name, text)? {
        let name = doc_name(&doc);
        let invalid = |message: String| RenderError::Invalid { source_name: source_name.into(), document, message };
        let spec =
            admit_document(&doc, &settings.policy).map_err(|report| invalid(denial_message(&name, &report.errors)))?;
        let namespace = doc.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(namespace);
        let owner = Owner {
            identity: name.clone(),
            name: name.clone(),
            namespace: namespace.to_string(),
            reference: OwnerReference {
                api_version: format!("{GROUP}/{STORAGE_VERSION}"),
                kind: KIND.into(),
                name: name.clone(),
                uid: PLACEHOLDER_UID.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        };
        let proxy = proxy(&owner, &spec, settings, &BackendTarget::previews(&spec));
        let _ = writeln!(out, "# Balancer {namespace}/{name} ({source_name}, document {document})");
        let _ = writeln!(out, "# ownerReferences carry a placeholder uid; the API server assigns the real one.");
        let _ = writeln!(out, "# nginx.conf names the backend Services; the controller writes their cluster IPs.");
        for service in &backend_services(&owner, &spec) {
            push_document(&mut out, service)?;
        }
        push_document(&mut out, &proxy.config_map)?;
        push_document(&mut out, &proxy.deployment)?;
        if spec.replicas() > 1 {
            push_document(&mut out, &proxy_disruption_budget(&owner))?;
        }
        push_document(&mut out, &proxy.front_service)?;
    }
    Ok(out)
}

fn push_document(out: &mut String, object: &impl serde::Serialize) -> Result<(), RenderError> {
    let yaml = serde_saphyr::to_string(object).map_err(|e| RenderError::Encode(e.to_string()))?;
    out.push_str("---\n");
    out.push_str(&yaml);
    Ok(())
}

/// Runs `balancer render`.
pub(super) fn command(args: &RenderArgs) -> ExitCode {
    let settings = args.proxy.settings();
    rewrite(&args.file, |name, text| render_yaml(name, text, &args.namespace, &settings))
}
