//! `balancer crd`: the CustomResourceDefinition as YAML.

use std::process::ExitCode;

use super::io::{fail, out};

/// Runs `balancer crd`.
pub(super) fn command() -> ExitCode {
    let crd = match crate::api::crd() {
        Ok(crd) => crd,
        Err(e) => return fail(&format!("cannot merge the CRD's versions: {e}")),
    };
    match serde_saphyr::to_string(&crd) {
        Ok(yaml) => out(&yaml),
        Err(e) => fail(&format!("cannot encode the CRD: {e}")),
    }
}
