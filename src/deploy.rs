//! The facts `deploy/` must agree with: names, paths and the RBAC the operator needs. Each is
//! checked against the manifests by the manifests test, so the code and the YAML cannot drift.

/// The field manager of every write, and the events' reporting controller.
pub const FIELD_MANAGER: &str = "balancer";
/// Where `deploy/` runs the webhook Service that also answers conversions.
pub const WEBHOOK_SERVICE: &str = "balancer-webhook";
/// The namespace `deploy/` installs into.
pub const INSTALL_NAMESPACE: &str = "balancer-system";
/// The cert-manager Certificate whose CA is injected into the CRD and webhook configurations.
pub const SERVING_CERTIFICATE: &str = "balancer-serving-cert";
/// Path of the conversion webhook on the TLS server.
pub const CONVERT_PATH: &str = "/convert";

/// One RBAC grant: API group, resource, verbs.
pub type Permission = (&'static str, &'static str, &'static [&'static str]);

/// Every cluster-wide permission the controller uses; `deploy/rbac.yaml` grants exactly these.
/// Reads come from watch caches (list, watch) of balancer's own children; a child is created with
/// a POST (create), changed with a forced server-side apply (patch, which may also create), and
/// read (get) only when its name turns out to be taken, or before the first apply to a child a
/// POST created (see `own_created_fields`).
pub const CLUSTER_PERMISSIONS: &[Permission] = &[
    ("exposer.hliangzhao.io", "balancers", &["list", "watch"]),
    ("exposer.hliangzhao.io", "balancers/status", &["patch"]),
    // Never called: clusters enforcing OwnerReferencesPermissionEnforcement require it to set
    // blockOwnerDeletion on the children's ownerReferences.
    ("exposer.hliangzhao.io", "balancers/finalizers", &["update"]),
    ("", "services", &["get", "list", "watch", "create", "patch", "delete"]),
    ("", "configmaps", &["get", "list", "watch", "create", "patch"]),
    // The backend Services' ready endpoints, from their EndpointSlices, for the status (read only).
    ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
    // delete: for the Go operator's proxy Deployment, once this operator's proxy serves (see
    // `migration`).
    ("apps", "deployments", &["get", "list", "watch", "create", "patch", "delete"]),
    ("policy", "poddisruptionbudgets", &["get", "list", "watch", "create", "patch", "delete"]),
    // The proxy pods' own identity, with the metrics sidecar: a ServiceAccount and a Role that
    // lets it read its Balancer's ConfigMap only. The API server lets the operator grant only
    // what it holds itself (`get`, `list`, `watch` on ConfigMaps): no `bind` or `escalate`.
    ("", "serviceaccounts", &["get", "list", "watch", "create", "patch"]),
    ("rbac.authorization.k8s.io", "roles", &["get", "list", "watch", "create", "patch"]),
    ("rbac.authorization.k8s.io", "rolebindings", &["get", "list", "watch", "create", "patch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    // Gateway API, when the cluster serves it: Gateways of balancer's GatewayClasses and their
    // routes become proxies. Reads from watch caches; writes to the status of those objects
    // only. Every Service, since a route may name any (slimmed in the cache), and the
    // namespaces' labels, for `allowedRoutes.namespaces.from: Selector`.
    ("gateway.networking.k8s.io", "gatewayclasses", &["list", "watch"]),
    ("gateway.networking.k8s.io", "gatewayclasses/status", &["patch"]),
    ("gateway.networking.k8s.io", "gateways", &["list", "watch"]),
    ("gateway.networking.k8s.io", "gateways/status", &["patch"]),
    // As for Balancers: to set blockOwnerDeletion on a Gateway's children.
    ("gateway.networking.k8s.io", "gateways/finalizers", &["update"]),
    ("gateway.networking.k8s.io", "tcproutes", &["list", "watch"]),
    ("gateway.networking.k8s.io", "tcproutes/status", &["patch"]),
    ("gateway.networking.k8s.io", "udproutes", &["list", "watch"]),
    ("gateway.networking.k8s.io", "udproutes/status", &["patch"]),
    ("gateway.networking.k8s.io", "tlsroutes", &["list", "watch"]),
    ("gateway.networking.k8s.io", "tlsroutes/status", &["patch"]),
    ("gateway.networking.k8s.io", "referencegrants", &["list", "watch"]),
    ("", "namespaces", &["list", "watch"]),
    // The protected /metrics endpoint reviews scrapers' tokens.
    ("authentication.k8s.io", "tokenreviews", &["create"]),
    ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
];

/// Leader election's permissions, in the operator's own namespace.
pub const LEADER_ELECTION_PERMISSIONS: &[Permission] =
    &[("coordination.k8s.io", "leases", &["get", "create", "update"])];

/// The Role, in the operator's own namespace, for the Secret holding the key that signs proxy
/// configurations: `get` of [`SIGNING_SECRET`] only, and `create` (which RBAC cannot limit to
/// a name) for the first start.
pub const SIGNING_ROLE: &str = "balancer-config-signing";
/// What [`SIGNING_ROLE`] grants.
pub const SIGNING_PERMISSIONS: &[Permission] = &[("", "secrets", &["get", "create"])];

/// The Secret, in the operator's namespace, holding the key that signs proxy configurations
/// (made by the operator when missing; see `manager::signing`).
pub const SIGNING_SECRET: &str = "balancer-config-signing";
/// The Secret's key: an Ed25519 private key in PKCS#8 (DER).
pub const SIGNING_KEY_FILE: &str = "ed25519.pk8";
