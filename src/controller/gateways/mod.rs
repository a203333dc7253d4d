//! The Gateway controller: Gateways of a GatewayClass whose `controllerName` is balancer's
//! ([`CONTROLLER_NAME`](crate::gateway::status::CONTROLLER_NAME)), with their TCPRoutes,
//! UDPRoutes and TLSRoutes, become proxies built and delivered as a Balancer's are: the same
//! child caches, `ensure`, prober and live configuration channel. The rules are pure and live
//! in [`crate::gateway`]; this module is their I/O.
//!
//! - `watches`: the Gateway API caches, and which Gateways each change wakes;
//! - `reconcile`: one Gateway, from its routes to its proxy and status;
//! - `report`: the Gateway's, the routes' and the GatewayClass's status writes.

mod reconcile;
mod report;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use futures::stream::BoxStream;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

pub(crate) use reconcile::GatewayContext;
pub(crate) use watches::GatewayCaches;

use super::context::{Context, Scope, backoff};
use crate::gateway::api::gateways::Gateway;
use crate::runtime::contact::Contact;

/// The Gateway controller, ready to run.
pub(crate) struct GatewayController {
    /// Its caches (the census keeps the Gateways' records).
    pub caches: GatewayCaches,
    run: BoxStream<'static, ()>,
    classes: BoxStream<'static, crate::gateway::api::gatewayclasses::GatewayClass>,
    tidy: UnboundedReceiver<()>,
    ctx: Arc<Context>,
}

impl GatewayController {
    /// Watches what Gateways need; `woken` carries the Gateways the prober and the child caches
    /// wake.
    pub(crate) fn new(
        client: &Client,
        scope: &Scope,
        contact: &Contact,
        ctx: Arc<Context>,
        woken: UnboundedReceiver<ObjectRef<Gateway>>,
        concurrency: u16,
        stop: &CancellationToken,
    ) -> Self {
        let watched = watches::watched(client, scope, contact);
        let caches = watched.caches.clone();
        let (tidy, tidy_asked) = watched.tidy;
        let gctx = Arc::new(GatewayContext { ctx: ctx.clone(), caches: caches.clone(), tidy });
        let config = controller::Config::default().debounce(Duration::from_millis(200)).concurrency(concurrency);
        let wakes = futures::stream::select_all(watched.wakes.into_iter().chain([woken.boxed()]));
        let run = Controller::for_stream(watched.gateways, caches.gateways.clone())
            .reconcile_on(wakes)
            .with_config(config)
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(reconcile::reconcile, reconcile::error_policy, gctx)
            .map(|result| {
                if let Err(e) = result {
                    match e {
                        controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_) => {}
                        other => tracing::warn!(error = %other, "Gateway controller error"),
                    }
                }
            })
            .boxed();
        GatewayController { caches, run, classes: watched.classes, tidy: tidy_asked, ctx }
    }

    /// Runs until stopped: the Gateways' reconciles, the GatewayClasses' acceptance, and the
    /// withdrawal of routes' entries for Gateways balancer no longer serves.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let GatewayController { run, mut classes, ctx, caches, tidy } = self;
        let tidy = tidy_routes(ctx.clone(), caches, tidy, stop.clone());
        let accept = async move {
            loop {
                let class = tokio::select! {
                    _ = stop.cancelled() => return,
                    class = classes.next() => match class { Some(class) => class, None => return },
                };
                if let Err(e) = report::accept_class(&ctx, &class, Timestamp::now()).await {
                    tracing::warn!(error = %e, "could not accept a GatewayClass");
                }
            }
        };
        tokio::join!(run.for_each(|()| std::future::ready(())), accept, tidy);
    }
}

/// Withdraws routes' entries for Gateways balancer no longer serves: once the caches have
/// listed (for Gateways deleted while the operator was away), then at each signal, several at
/// once taken as one; a failure (a conflicting route write) is tried again with the reconciles'
/// backoff.
async fn tidy_routes(
    ctx: Arc<Context>,
    caches: GatewayCaches,
    mut asked: UnboundedReceiver<()>,
    stop: CancellationToken,
) {
    let synced = tokio::select! {
        _ = stop.cancelled() => return,
        synced = caches.synced() => synced,
    };
    if !synced {
        return;
    }
    let mut failures = 0;
    loop {
        let tidied = tokio::select! {
            _ = stop.cancelled() => return,
            tidied = report::withdraw_stale_entries(&ctx, &caches) => tidied,
        };
        let wait = match tidied {
            Ok(()) => {
                failures = 0;
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not withdraw a route's entries for a Gateway no longer served");
                failures += 1;
                Some(backoff(failures))
            }
        };
        let woken = async {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => {
                    if asked.next().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            () = woken => {}
        }
        while asked.try_recv().is_ok() {}
    }
}

/// The Gateway a child of balancer's (or its front Service's EndpointSlice) belongs to: by the
/// proxy name its labels give, as the Gateways' reconciles recorded it.
pub(crate) fn gateway_of(
    caches: &GatewayCaches,
    namespace: Option<&str>,
    proxy: Option<&str>,
) -> Option<ObjectRef<Gateway>> {
    caches.index.proxy(namespace?, proxy?)
}
