//! The writes of a reconcile: children created or applied when they differ, and deleted only
//! while still this Balancer's.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::cache::{self, Cached};
use super::context::Context;
use super::plan::{controlled_by, obsolete_backends};
use super::reasons::Reason;
use super::report::{Verb, Written, publish};
use super::ssa::{fold_created_into_applied, is_subset};
use super::stored::StoredBalancer;
use super::{Error, migration};
use crate::deploy::FIELD_MANAGER;
use crate::proxy::{self, Owner};
use crate::runtime::events::{EventType, Note};

/// Writes `desired` unless the child already holds every field it sets; returns the child as
/// the API server has it (cached, created or applied).
///
/// Only objects this Balancer controls are ever written, and its own children that lost their
/// controller reference ([`Owner::adopts`]): a name held by any other object is a
/// [`Error::Conflict`], never adopted. A child the cache does not know is created with a POST,
/// which the API server refuses when the name is taken, even by an object created a moment ago
/// that no cache has seen yet (a user's Service applied with the Balancer, say); a forced apply
/// would take such an object over. Only that refusal costs a read, to tell a namesake from this
/// Balancer's own child that the cache has not caught up with (or whose label was removed by
/// hand). Later writes are forced server-side applies.
pub(super) async fn ensure<K>(
    ctx: &Context,
    owner: &Owner,
    cache: &Store<Cached<K>>,
    desired: &K,
    written: &mut Written,
) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = desired.name_any();
    let namespace = desired.namespace().unwrap_or_default();
    let kind = || K::kind(&()).into_owned();
    let api_error = |verb, source| Error::api(verb, kind(), &name, source);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let desired =
        &proxy::stamped(desired).map_err(|source| Error::Unreadable { kind: kind(), name: name.clone(), source })?;
    let (current, created_by_post) = match cache.get(&ObjectRef::new(&name).within(&namespace)) {
        Some(cached) => {
            let object =
                cached.object().map_err(|source| Error::Unreadable { kind: kind(), name: name.clone(), source })?;
            (object, cached.created_by_post())
        }
        None => match create(&api, desired).await.map_err(|e| api_error("create", e))? {
            Some(created) => return Ok(written.add(ctx, Verb::Created, created)),
            // The name is taken: read the object to learn whether it is this Balancer's child.
            None => {
                let found = api.get(&name).await.map_err(|e| api_error("get", e))?;
                let entries = found.meta().managed_fields.as_deref().unwrap_or_default();
                let created_by_post = entries.iter().any(cache::is_created);
                (found, created_by_post)
            }
        },
    };
    if !controlled_by(&current, owner) && !owner.adopts(&current) {
        return Err(Error::Conflict { kind: kind(), name });
    }
    if is_subset(desired, &current) {
        return Ok(current);
    }
    if created_by_post {
        own_created_fields(&api, &name).await.map_err(|e| api_error("take over the fields of", e))?;
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api.patch(&name, &params, &Patch::Apply(desired)).await.map_err(|e| api_error("apply", e))?;
    Ok(written.add(ctx, Verb::Updated, applied))
}

/// Applies the proxy's ConfigMap, signed against the one cached and the newest sequence this
/// operator signed for the owner, which its record keeps ([`ConfigSigner::seal`]: an unchanged
/// configuration keeps its sequence, a new one gets a later one). One the cache shows
/// holding a configuration balancer did not sign for this owner is told on `reported` (a
/// `ForeignConfiguration` event) before balancer's is written back.
///
/// [`ConfigSigner::seal`]: crate::proxy::signature::ConfigSigner::seal
pub(super) async fn ensure_proxy_config<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &Owner,
    reported: &K,
    desired: &ConfigMap,
    now: Timestamp,
    written: &mut Written,
) -> Result<ConfigMap, Error> {
    let name = desired.name_any();
    let cached = ctx.children.config_maps.get(&ObjectRef::new(&name).within(&owner.namespace));
    let current = cached
        .and_then(|cached| cached.object().ok())
        .filter(|current| controlled_by(current, owner) || owner.adopts(current));
    let Some(signer) = &ctx.settings.signer else {
        return ensure(ctx, owner, &ctx.children.config_maps, desired, written).await;
    };
    let key = signer.public_key();
    if current.as_ref().is_some_and(|current| proxy::written_by_another(current, desired, owner, &key)) {
        tell_foreign_configuration(ctx, reported, &name).await;
    }
    let uid = &owner.reference.uid;
    let signed = ctx.records.with(uid, |record| record.signed_sequence);
    let now_ms = u64::try_from(now.as_millisecond()).unwrap_or_default();
    let mut desired = desired.clone();
    let data = desired.data.get_or_insert_default();
    let sequence = signer.seal(data, &owner.subject(), current.as_ref().and_then(|c| c.data.as_ref()), signed, now_ms);
    let applied = ensure(ctx, owner, &ctx.children.config_maps, &desired, written).await?;
    ctx.records.with(uid, |record| record.signed_sequence = record.signed_sequence.max(sequence));
    Ok(applied)
}

/// Tells on `reported` that its proxy's ConfigMap `name` held a configuration balancer did not
/// sign for it.
async fn tell_foreign_configuration<K: Resource<DynamicType = ()>>(ctx: &Context, reported: &K, name: &str) {
    tracing::warn!(config_map = %name, "the proxy's ConfigMap held a configuration balancer did not sign; writing balancer's back");
    let note = format!(
        "ConfigMap {name} held a configuration balancer did not sign for this {kind}: the proxies refuse it and serve the last one balancer made, which is written back",
        kind = K::kind(&()),
    );
    publish(reported, ctx, Note::new(EventType::Warning, Reason::ForeignConfiguration, &note)).await;
}

/// Creates `desired` (as balancer's field manager); `None` when its name is taken.
async fn create<K>(api: &Api<K>, desired: &K) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), dry_run: false };
    match api.create(&params, desired).await {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(status)) if status.code == 409 && status.reason == "AlreadyExists" => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes the fields a POST gave balancer (an `Update` entry of its field manager) part of its
/// `Apply` entry, before a child created that way is applied to for the first time.
///
/// Server-side apply removes a field only when the applier owned it at its previous apply and
/// no longer sets it: without this, a port or an annotation dropped from the desired object
/// would stay, owned by the POST's entry. The entry is folded with a merge patch of
/// `managedFields` alone, conditional on the resource version read (a concurrent write fails
/// it, and the reconcile is retried). This costs two requests, once per child, and only when a
/// child created by a POST must change; a child that never changes never pays it.
async fn own_created_fields<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let current = api.get_metadata(name).await?;
    let entries = current.metadata.managed_fields.unwrap_or_default();
    let Some(entries) = fold_created_into_applied(entries) else { return Ok(()) };
    let patch = json!({"metadata": {"resourceVersion": current.metadata.resource_version, "managedFields": entries}});
    api.patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Deletes the proxy's PodDisruptionBudget `name` if the cache has this Balancer's: a proxy of
/// one pod needs none, and one would block every drain of its node.
pub(super) async fn delete_budget(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    name: &str,
) -> Result<(), Error> {
    let Some(cached) = ctx.children.budgets.get(&ObjectRef::new(name).within(&owner.namespace)) else { return Ok(()) };
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    if !delete_if_ours(&api, cached.as_ref(), owner, DeleteParams::default()).await? {
        return Ok(());
    }
    let note = format!("deleted PodDisruptionBudget {name}: the proxy has one pod at most");
    publish(balancer, ctx, Note::new(EventType::Normal, Reason::Deleted, &note)).await;
    Ok(())
}

/// Deletes what serves `owner`'s proxy (its front Service and Deployment), as cached: a
/// Gateway's when none of its listeners is served, so that no pod goes on serving what its
/// status no longer claims, or when the Gateway's proxy is another now. Its ConfigMap and the
/// pods' identity stay, inert without pods, until the Gateway goes: the operator may not delete
/// ConfigMaps, ServiceAccounts or Roles, and needs not. Returns whether anything was deleted.
pub(in crate::controller) async fn delete_proxy(ctx: &Context, owner: &Owner) -> Result<bool, Error> {
    let caches = &ctx.children;
    let deployment = crate::api::proxy_deployment_name(&owner.name);
    let deleted = [
        delete_cached(ctx, &caches.services, owner, &owner.name, DeleteParams::default()).await?,
        delete_cached(ctx, &caches.deployments, owner, &deployment, DeleteParams::background()).await?,
    ];
    Ok(deleted.contains(&true))
}

/// Deletes child `name` of `owner`'s namespace, when `store` has it and `owner` controls it.
async fn delete_cached<K>(
    ctx: &Context,
    store: &Store<Cached<K>>,
    owner: &Owner,
    name: &str,
    params: DeleteParams,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
{
    let Some(cached) = store.get(&ObjectRef::new(name).within(&owner.namespace)) else { return Ok(false) };
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    delete_if_ours(&api, cached.as_ref(), owner, params).await
}

/// Deletes `object` (as a cache or a read has it) while `owner` controls it: exactly that object,
/// by uid, never a namesake created since. `false` when it is not `owner`'s or already gone.
async fn delete_if_ours<K>(
    api: &Api<K>,
    object: &impl Resource,
    owner: &Owner,
    params: DeleteParams,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    if !controlled_by(object, owner) {
        return Ok(false);
    }
    let name = object.meta().name.as_deref().unwrap_or_default();
    let uid = object.meta().uid.clone();
    let params = DeleteParams { preconditions: Some(Preconditions { uid, resource_version: None }), ..params };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(Error::api("delete", K::kind(&()), name, source)),
    }
}

/// Looks for the Go operator's proxy Deployment of a Balancer (see [`migration`]).
pub(super) async fn find_go_proxy(ctx: &Context, owner: &Owner) -> Result<migration::Found, Error> {
    let name = migration::deployment_name(&owner.name);
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let found = api.get_metadata_opt(&name).await.map_err(|e| Error::api("get", "Deployment", &name, e))?;
    Ok(match found {
        None => migration::Found::Absent,
        Some(object) if controlled_by(&object, owner) => migration::Found::Controlled,
        Some(_) => migration::Found::NotControlled,
    })
}

/// Deletes the Go operator's proxy Deployment, only if it is still this Balancer's (by UID).
pub(super) async fn delete_go_proxy(balancer: &StoredBalancer, ctx: &Context, owner: &Owner) -> Result<(), Error> {
    let name = migration::deployment_name(&owner.name);
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let found = api.get_metadata_opt(&name).await.map_err(|e| Error::api("get", "Deployment", &name, e))?;
    let Some(found) = found else { return Ok(()) };
    if !delete_if_ours(&api, &found, owner, DeleteParams::background()).await? {
        return Ok(());
    }
    let note = format!(
        "deleted the Go operator's proxy Deployment {name}: {} serves",
        crate::api::proxy_deployment_name(&owner.name)
    );
    publish(balancer, ctx, Note::new(EventType::Normal, Reason::Migrated, &note)).await;
    Ok(())
}

/// Deletes the obsolete backend Services (a failure fails the reconcile).
pub(super) async fn delete_obsolete_backends(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    wanted: &[Service],
) -> Result<(), Error> {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    for service in obsolete_backends(&ctx.children.services, owner, wanted) {
        let name = service.name_any();
        // Counted and reported even when someone else deleted it first: the Service is gone
        // either way, which is what the spec asks for.
        delete_if_ours(&api, service.as_ref(), owner, DeleteParams::default()).await?;
        ctx.metrics.child_deleted("Service");
        let note = format!("deleted obsolete backend Service {name}");
        let related = Some(service.object_ref(&()));
        publish(balancer, ctx, Note::new(EventType::Normal, Reason::Deleted, &note).related(related)).await;
    }
    Ok(())
}
