//! The controller's watches: what each caches, what triggers a reconcile, and how they come
//! back after the API server does.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::{self, ObjectRef, Store};
use std::hash::{Hash, Hasher};

use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::cache::Cached;
use super::context::Scope;
use super::endpoint_slices::{ReadyEndpointSlices, ReadySlice};
use super::ssa::slim;
use super::stored::StoredBalancer;
use crate::proxy::{
    BALANCER_NAME_LABEL, COMPONENT_BACKEND, COMPONENT_FRONTEND, COMPONENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL,
};
use crate::runtime::contact::Contact;
use crate::runtime::retry::{RetryDelay, relist_at_once};

/// Watches `api`, retrying every few seconds at most and re-listing at once when the watch
/// expired (see [`retry`](crate::runtime::retry)). Its errors are logged here and go no further: the
/// controller would otherwise back off *all* its watches after any one's error, with
/// kube-runtime's default backoff (up to a minute), and leave their requests unpolled meanwhile.
pub(super) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    contact: &Contact,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + use<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let contact = contact.clone();
    relist_at_once(watcher(api, config)).backoff(RetryDelay::default()).filter(move |event| {
        if let Err(e) = event {
            // While the API server is lost, every retry fails. `Contact` logs the loss once, so
            // each failed retry is logged at debug level only.
            if contact.is_lost() {
                tracing::debug!(kind = %K::kind(&()), error = %e, "watch error");
            } else {
                tracing::warn!(kind = %K::kind(&()), error = %e, "watch error; retrying");
            }
        }
        std::future::ready(event.is_ok())
    })
}

/// Lists are served from the API server's watch cache (`resourceVersion=0`, in one page: kube
/// drops `resourceVersion=0` from a paged list), as client-go's informers list: the watch that
/// follows starts from the same cache at the same version, and a list does not wait for etcd
/// while the API server catches up after etcd came back.
pub(super) fn watch_config() -> watcher::Config {
    watcher::Config { page_size: None, ..watcher::Config::default().any_semantic() }
}

/// One watched kind: the cache the reconciles read, and the changes that trigger them.
pub(super) struct Reflected<K: Resource<DynamicType = ()> + 'static> {
    pub store: Store<K>,
    pub changes: BoxStream<'static, Result<K, watcher::Error>>,
}

impl<K> Reflected<Cached<K>>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// balancer's own children of one kind (selected by label), cached compactly (see [`Cached`]).
    pub(super) fn children(client: &Client, scope: &Scope, contact: &Contact) -> Self {
        let config = watch_config().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let (store, writer) = reflector::store();
        let changes = watch(api(client, scope), config, contact).reflect(writer).touched_objects().boxed();
        Reflected { store, changes }
    }
}

/// The Balancer whose reconcile a change to `child` triggers: its owner, as kube-runtime's
/// `owns` maps it; or, once someone removed its ownerReference, the Balancer its labels name
/// (children are watched by balancer's label), whose reconcile then reports the conflict at once
/// rather than at its next resync.
pub(super) fn balancer_of<C: Resource>(child: &C) -> Option<ObjectRef<StoredBalancer>> {
    let meta = child.meta();
    let namespace = meta.namespace.as_deref()?;
    // A Gateway's proxy is no Balancer's (the Gateway controller is woken for it).
    let gateways = crate::gateway::attachment::GROUP;
    if meta.owner_references.iter().flatten().any(|o| o.api_version.starts_with(&format!("{gateways}/"))) {
        return None;
    }
    let owner = meta.owner_references.iter().flatten().find(|owner| {
        owner.kind == StoredBalancer::kind(&())
            && owner.api_version.split_once('/').is_some_and(|(group, _)| group == StoredBalancer::group(&()))
    });
    let name = match owner {
        Some(owner) => owner.name.as_str(),
        None => meta.labels.as_ref()?.get(BALANCER_NAME_LABEL)?.as_str(),
    };
    Some(ObjectRef::new(name).within(namespace))
}

/// The EndpointSlices of balancer's backend and front Services (they carry the Services'
/// labels), read into `slices`; every change triggers its Balancer's reconcile, which writes only what
/// changed (the EndpointSlice controller rewrites a slice only when its endpoints change).
pub(super) fn service_endpoint_slices(
    client: &Client,
    scope: &Scope,
    contact: &Contact,
    slices: ReadyEndpointSlices,
) -> BoxStream<'static, Result<ReadySlice, watcher::Error>> {
    let selector =
        format!("{MANAGED_BY_LABEL}={MANAGED_BY},{COMPONENT_LABEL} in ({COMPONENT_BACKEND},{COMPONENT_FRONTEND})");
    watch(api(client, scope), watch_config().labels(&selector), contact)
        .inspect_ok(move |event| slices.apply(event))
        .touched_objects()
        .boxed()
}

impl Reflected<StoredBalancer> {
    /// Every Balancer in scope, slimmed as cached. Only generation changes trigger, and a
    /// person's new request on a canary (written through the status, which changes no
    /// generation): the controller's own status writes never come back to it.
    pub(super) fn balancers(client: &Client, scope: &Scope, contact: &Contact) -> Self {
        let (store, writer) = reflector::store();
        let changes = watch(api(client, scope), watch_config(), contact)
            .modify(slim)
            .reflect(writer)
            .applied_objects()
            .predicate_filter(generation_or_canary_request, Default::default())
            .boxed();
        Reflected { store, changes }
    }
}

/// What makes a Balancer worth a reconcile: its generation, and the id of the last request a
/// person wrote on its canary (the controller never writes one).
fn generation_or_canary_request(balancer: &StoredBalancer) -> Option<u64> {
    let request = balancer.status.as_ref().and_then(|s| s.canary.as_ref()).and_then(|c| c.request.as_ref());
    let mut hasher = std::hash::DefaultHasher::new();
    (balancer.metadata.generation, request.map(|r| &r.id)).hash(&mut hasher);
    Some(hasher.finish())
}

/// The API of `K` in `scope`: every namespace, or one.
pub(super) fn api<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Scope::All => Api::all(client.clone()),
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn config_map(owner: Option<(&str, &str, &str)>, label: Option<&str>) -> ConfigMap {
        let owner_references = owner.map(|(api_version, kind, name)| {
            vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
                ..OwnerReference::default()
            }]
        });
        let labels = label.map(|name| [(BALANCER_NAME_LABEL.to_string(), name.to_string())].into());
        ConfigMap {
            metadata: ObjectMeta { namespace: Some("ns".into()), owner_references, labels, ..ObjectMeta::default() },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_child_triggers_its_owner_or_once_disowned_the_balancer_its_labels_name() {
        let balancer = |name: &str| Some(ObjectRef::new(name).within("ns"));
        let owned = config_map(Some(("exposer.hliangzhao.io/v1beta1", "Balancer", "owner")), Some("label"));
        assert_eq!(balancer_of(&owned), balancer("owner"));
        let older = config_map(Some(("exposer.hliangzhao.io/v1alpha1", "Balancer", "owner")), None);
        assert_eq!(balancer_of(&older), balancer("owner"), "either version's ownerReference");
        let disowned = config_map(None, Some("label"));
        assert_eq!(balancer_of(&disowned), balancer("label"));
        let other_owner = config_map(Some(("apps/v1", "Deployment", "owner")), Some("label"));
        assert_eq!(balancer_of(&other_owner), balancer("label"));
        assert_eq!(balancer_of(&config_map(None, None)), None);
    }
}
