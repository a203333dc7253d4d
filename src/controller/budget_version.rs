//! The proxy's PodDisruptionBudget, in the `policy` version the cluster serves.
//!
//! `policy/v1` exists from Kubernetes 1.21; older clusters (the v1.20 test clusters among them)
//! serve only `policy/v1beta1`, which 1.25 removed. The controller asks the API server once at
//! start which one it serves and uses that one. Both have the same fields for what the
//! operator sets (`maxUnavailable`, `selector`), so one builder makes both.

use k8s_openapi::api::policy::v1 as policy_v1;
use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The `policy` version a cluster serves PodDisruptionBudgets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PolicyVersion {
    V1,
    V1beta1,
}

impl PolicyVersion {
    /// `policy/v1` when the API server lists PodDisruptionBudgets there, else `policy/v1beta1`.
    pub(super) async fn served(client: &kube::Client) -> Result<PolicyVersion, kube::Error> {
        match client.list_api_group_resources("policy/v1").await {
            Ok(list) if list.resources.iter().any(|r| r.name == "poddisruptionbudgets") => Ok(PolicyVersion::V1),
            Ok(_) => Ok(PolicyVersion::V1beta1),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(PolicyVersion::V1beta1),
            Err(e) => Err(e),
        }
    }
}

/// `policy/v1beta1` PodDisruptionBudget: the fields of `policy/v1`'s under the older version,
/// for clusters before Kubernetes 1.21 (k8s-openapi no longer has the type).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetV1beta1 {
    #[serde(default = "api_version")]
    pub api_version: String,
    #[serde(default = "kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodDisruptionBudgetSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodDisruptionBudgetStatus>,
}

fn api_version() -> String {
    "policy/v1beta1".into()
}

fn kind() -> String {
    "PodDisruptionBudget".into()
}

impl From<policy_v1::PodDisruptionBudget> for PodDisruptionBudgetV1beta1 {
    fn from(budget: policy_v1::PodDisruptionBudget) -> Self {
        PodDisruptionBudgetV1beta1 {
            api_version: api_version(),
            kind: kind(),
            metadata: budget.metadata,
            spec: budget.spec,
            status: budget.status,
        }
    }
}

impl k8s_openapi::Resource for PodDisruptionBudgetV1beta1 {
    const API_VERSION: &'static str = "policy/v1beta1";
    const GROUP: &'static str = "policy";
    const KIND: &'static str = "PodDisruptionBudget";
    const VERSION: &'static str = "v1beta1";
    const URL_PATH_SEGMENT: &'static str = "poddisruptionbudgets";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for PodDisruptionBudgetV1beta1 {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn the_v1beta1_budget_is_the_v1_one_under_the_older_version() {
        let mut v1 = policy_v1::PodDisruptionBudget::default();
        v1.metadata.name = Some("b-proxy".into());
        let older = PodDisruptionBudgetV1beta1::from(v1);
        let json = serde_json::to_value(&older).unwrap();
        assert_eq!(
            (json["apiVersion"].as_str(), json["kind"].as_str()),
            (Some("policy/v1beta1"), Some("PodDisruptionBudget"))
        );
        assert_eq!(
            PodDisruptionBudgetV1beta1::url_path(&(), Some("ns")),
            "/apis/policy/v1beta1/namespaces/ns/poddisruptionbudgets"
        );
        let without_type: PodDisruptionBudgetV1beta1 =
            serde_json::from_value(serde_json::json!({"metadata": {}})).unwrap();
        assert_eq!(without_type.api_version, "policy/v1beta1", "a cached body has no apiVersion");
    }
}
