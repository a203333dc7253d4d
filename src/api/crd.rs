//! The CustomResourceDefinition, both versions merged.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig, WebhookConversion,
};
use kube::CustomResourceExt;
use kube::core::crd::{MergeError, merge_crds};

use super::{v1alpha1, v1beta1};
use crate::deploy::{CONVERT_PATH, INSTALL_NAMESPACE, SERVING_CERTIFICATE, WEBHOOK_SERVICE};

/// The version stored in etcd, and the one the operator works on.
pub const STORAGE_VERSION: &str = v1beta1::VERSION;

/// The CustomResourceDefinition: both versions, v1beta1 stored, converted by our webhook.
///
/// The API server reaches `/convert` through the webhook Service, with the CA cert-manager
/// injects (or that the README's manual path patches in).
pub fn crd() -> Result<CustomResourceDefinition, MergeError> {
    let mut crd = merge_crds(vec![v1beta1::Balancer::crd(), v1alpha1::Balancer::crd()], STORAGE_VERSION)?;
    crd.metadata.annotations = Some(BTreeMap::from([(
        "cert-manager.io/inject-ca-from".to_string(),
        format!("{INSTALL_NAMESPACE}/{SERVING_CERTIFICATE}"),
    )]));
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    name: WEBHOOK_SERVICE.into(),
                    namespace: INSTALL_NAMESPACE.into(),
                    path: Some(CONVERT_PATH.into()),
                    port: Some(443),
                }),
                ..WebhookClientConfig::default()
            }),
            conversion_review_versions: vec!["v1".into()],
        }),
    });
    Ok(crd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GROUP, KIND};

    #[test]
    fn crd_identity_matches_the_go_project() {
        let crd = crd().expect("the versions merge");
        assert_eq!(crd.metadata.name.as_deref(), Some("balancers.exposer.hliangzhao.io"));
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, KIND);
        assert_eq!(crd.spec.names.short_names, Some(vec!["bal".to_string()]));
        let versions: Vec<_> = crd.spec.versions.iter().map(|v| (v.name.as_str(), v.served, v.storage)).collect();
        assert_eq!(versions, [("v1beta1", true, true), ("v1alpha1", true, false)]);
        for version in &crd.spec.versions {
            assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "{}", version.name);
        }
        let scale = crd.spec.versions[0].subresources.as_ref().and_then(|s| s.scale.as_ref()).expect("v1beta1 scales");
        assert_eq!(
            (
                scale.spec_replicas_path.as_str(),
                scale.status_replicas_path.as_str(),
                scale.label_selector_path.as_deref()
            ),
            (".spec.replicas", ".status.replicas", Some(".status.selector"))
        );
    }
}
