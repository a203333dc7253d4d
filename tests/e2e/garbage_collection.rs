//! Garbage collection: a deleted Balancer's children go with it.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use crate::toolkit::runner::eventually;
use crate::{NS, SAMPLE, World, balancers};

pub(crate) async fn deleting_a_balancer_collects_its_children(world: &mut World) {
    if !world.plane.has_controller_manager() {
        println!("e2e: no kube-controller-manager: garbage collection not checked");
        return;
    }
    balancers(world).delete(SAMPLE, &DeleteParams::default()).await.unwrap();
    let services: Api<Service> = Api::namespaced(world.admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(world.admin.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(world.admin.clone(), NS);
    let selector = format!("balancer.exposer.hliangzhao.io/balancer-name={SAMPLE}");
    eventually("every child garbage-collected", Duration::from_secs(60), || async {
        let lp = ListParams::default().labels(&selector);
        let left = services.list(&lp).await.ok()?.items.len()
            + config_maps.list(&lp).await.ok()?.items.len()
            + deployments.list(&lp).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
}
