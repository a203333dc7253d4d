//! Protected metrics: only a token allowed to get them reads them.

use serde_json::json;

use crate::toolkit::cluster::{NOBODY, SCRAPER};
use crate::{World, apply};

pub(crate) async fn metrics_need_a_token_allowed_to_get_them(world: &mut World) {
    let operator = &world.operators[0];
    assert_eq!(operator.scrape(&world.plane, None).await.0, 401, "no token");
    assert_eq!(operator.scrape(&world.plane, Some("not-a-token")).await.0, 401, "an invalid token");
    assert_eq!(operator.scrape(&world.plane, Some(NOBODY.token)).await.0, 403, "a token without the RBAC");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-metrics-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "balancer-metrics-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCRAPER.name}]});
    let (ok, out) = apply(world, "admin", &binding.to_string());
    assert!(ok, "{out}");
    let (status, body) = operator.scrape(&world.plane, Some(SCRAPER.token)).await;
    assert_eq!(status, 200, "a token bound to balancer-metrics-reader: {body}");
    assert!(body.contains("balancer_admission_requests_total"), "{body}");
}
