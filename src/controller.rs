//! The reconcile loop: every Balancer becomes its children (see [`crate::children`]) and a status.
//!
//! Level-based and cheap on the API server: desired objects are compared with
//! the watch caches of the children, and only what differs is written (with
//! server-side apply, one field manager, forced). A converged Balancer costs no
//! writes, status included.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::admission::denial_message;
use crate::admit::admit;
use crate::api::BalancerStatus;
use crate::children::{self, BALANCER_NAME_LABEL, COMPONENT_BACKEND, COMPONENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL};
use crate::children::{BackendHosts, Owner, OwnerError, ProxySettings};
use crate::contact::Contact;
use crate::disruption::{PodDisruptionBudgetV1beta1, PolicyVersion};
use crate::echo::cut;
use crate::events::{EventType, Events, Note, Published};
use crate::retry::{RetryDelay, relist_at_once};
use crate::stored::StoredBalancer;
use crate::telemetry::{Metrics, ReconcileResult};
use crate::validation::{FieldError, ObjectName};
use exposure::Exposure;

pub mod cache;
pub mod exposure;
pub mod migration;
pub use cache::Cached;

/// The field manager of every write, and the events' reporting controller.
pub const FIELD_MANAGER: &str = "balancer";
/// How often a converged Balancer is checked again for drift the watches could have missed.
pub const RESYNC: Duration = Duration::from_secs(300);
/// The `Ready` condition type.
pub const READY: &str = "Ready";

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
    // delete: the Go operator's proxy Deployment, once this operator's serves (see `migration`).
    ("apps", "deployments", &["get", "list", "watch", "create", "patch", "delete"]),
    ("policy", "poddisruptionbudgets", &["get", "list", "watch", "create", "patch", "delete"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    // The protected /metrics endpoint reviews scrapers' tokens.
    ("authentication.k8s.io", "tokenreviews", &["create"]),
    ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
];

/// Leader election's permissions, in the operator's own namespace.
pub const LEADER_ELECTION_PERMISSIONS: &[Permission] =
    &[("coordination.k8s.io", "leases", &["get", "create", "update"])];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {verb} {kind} {name}: {source}")]
    Api { verb: &'static str, kind: String, name: String, source: kube::Error },
    #[error(transparent)]
    Owner(#[from] OwnerError),
    #[error("{kind} {name} already exists and is not controlled by this Balancer; rename or remove it")]
    Conflict { kind: String, name: String },
    #[error("backend Service {name} has no cluster IP (was its clusterIP set to None by hand?)")]
    NoClusterIp { name: String },
    #[error("cannot read the cached {kind} {name}: {source}")]
    Unreadable { kind: String, name: String, source: serde_json::Error },
}

/// What kind of failure an [`Error`] is: the one list, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    ApiError,
    InvalidObject,
    Conflict,
    NoClusterIp,
}

impl ErrorKind {
    /// Every kind, so the metrics can start each series at zero.
    pub const ALL: [ErrorKind; 4] =
        [ErrorKind::ApiError, ErrorKind::InvalidObject, ErrorKind::Conflict, ErrorKind::NoClusterIp];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ApiError => "ApiError",
            ErrorKind::InvalidObject => "InvalidObject",
            ErrorKind::Conflict => "Conflict",
            ErrorKind::NoClusterIp => "NoClusterIP",
        }
    }
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Api { .. } => ErrorKind::ApiError,
            Error::Owner(_) | Error::Unreadable { .. } => ErrorKind::InvalidObject,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::NoClusterIp { .. } => ErrorKind::NoClusterIp,
        }
    }
}

/// What reconciles share: the client, the children's caches and the settings.
pub struct Context {
    pub client: Client,
    pub events: Events,
    pub children: ChildCaches,
    pub settings: ProxySettings,
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per Balancer uid (a recreated namesake starts afresh), for backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub fn new(client: Client, children: ChildCaches, settings: ProxySettings, metrics: Arc<Metrics>) -> Self {
        let events = Events::new(client.clone(), FIELD_MANAGER);
        let failures = Mutex::new(HashMap::new());
        Context { client, events, children, settings, metrics, failures }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Reconciles one Balancer, recording metrics and, on failure, the error in its status.
pub async fn reconcile(balancer: Arc<StoredBalancer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _in_flight = ctx.metrics.controller.reconcile_started();
    let started = Instant::now();
    let mut written = Written::default();
    let result = converge(&balancer, &ctx, &mut written).await;
    let outcome = match &result {
        Ok(_) => {
            ctx.failures().remove(&balancer.uid().unwrap_or_default());
            ReconcileResult::Success
        }
        Err(e) => {
            tracing::warn!(balancer = %ObjectRef::from_obj(balancer.as_ref()), error = %e, "reconcile failed");
            // What was written before the failure is still news.
            announce(&balancer, &ctx, &mut written).await;
            report_failure(&balancer, &ctx, e).await;
            ReconcileResult::Error
        }
    };
    ctx.metrics.controller.reconciled(outcome, result.as_ref().err().map(Error::kind), started.elapsed());
    result
}

/// Requeues a failed Balancer with exponential backoff: 1 s, 2 s, 4 s … up to 5 minutes.
pub fn error_policy(balancer: Arc<StoredBalancer>, _error: &Error, ctx: Arc<Context>) -> Action {
    let mut failures = ctx.failures();
    let count = failures.entry(balancer.uid().unwrap_or_default()).or_insert(0);
    *count = count.saturating_add(1);
    Action::requeue(backoff(*count))
}

/// `2^(failures-1)` seconds, capped at [`RESYNC`].
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64.checked_shl(failures.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_secs(secs).min(RESYNC)
}

async fn converge(balancer: &StoredBalancer, ctx: &Context, written: &mut Written) -> Result<Action, Error> {
    // Nothing is written before every child cache has listed (false only when stopping).
    ctx.children.synced().await;
    if balancer.meta().deletion_timestamp.is_some() {
        // Garbage collection removes the children through their ownerReferences.
        ctx.failures().remove(&balancer.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    let owner = Owner::of(balancer)?;
    // The webhooks normally stop both; without them (or under an older schema), the
    // Balancer is refused children and told why, and every other Balancer carries on.
    let spec = match &balancer.spec {
        Ok(spec) => spec.clone(),
        Err(unreadable) => return refuse(balancer, ctx, &owner, std::slice::from_ref(unreadable)).await,
    };
    let spec = match admit(ObjectName::Name(&owner.name), spec, &ctx.settings.policy) {
        Ok(admitted) => admitted,
        Err(report) => return refuse(balancer, ctx, &owner, &report.errors).await,
    };

    // A Balancer the Go operator ran: is its proxy Deployment still there?
    let stage = migration::stage(balancer);
    let found = match stage {
        migration::Stage::Unchecked => Some(find_go_proxy(ctx, &owner).await?),
        _ => None,
    };

    let backend_services = children::backend_services(&owner, &spec);
    let mut cluster_ips = Vec::with_capacity(backend_services.len());
    let caches = &ctx.children;
    for service in &backend_services {
        let applied = ensure(ctx, &owner, &caches.services, service, written).await?;
        cluster_ips.push(cluster_ip(&applied).ok_or_else(|| Error::NoClusterIp { name: applied.name_any() })?);
    }
    let mut proxy = children::proxy(&owner, &spec, &ctx.settings, BackendHosts::ClusterIps(&cluster_ips));
    ensure(ctx, &owner, &caches.config_maps, &proxy.config_map, written).await?;
    let deployment = ensure(ctx, &owner, &caches.deployments, &proxy.deployment, written).await?;
    let budget = children::proxy_disruption_budget(&owner);
    let wanted = spec.replicas() > 1;
    let budgeted = match &caches.budgets {
        BudgetCache::V1(store) => ensure_budget(balancer, ctx, &owner, store, budget, wanted, written).await,
        BudgetCache::V1beta1(store) => {
            let budget = PodDisruptionBudgetV1beta1::from(budget);
            ensure_budget(balancer, ctx, &owner, store, budget, wanted, written).await
        }
    };
    // A budget protects against drains; without one the proxy still serves, so a refusal (a
    // namesake, a quota) is told, and the rest of the reconcile goes on.
    if let Err(e) = budgeted {
        tracing::warn!(balancer = %owner.name, error = %e, "no PodDisruptionBudget for the proxy");
        publish(balancer, ctx, EventType::Warning, "DisruptionBudget", e.to_string(), None).await;
    }
    let ready = proxy_condition(balancer, &deployment, backend_services.len());
    let takeover = migration::step(&owner.name, &stage, found, ready.status == "True", Timestamp::now());
    if let Some(front) = proxy.front_service.spec.as_mut().filter(|_| takeover.shared_front) {
        front.selector = Some(migration::shared_selector(&owner.name));
    }
    let front = ensure(ctx, &owner, &caches.services, &proxy.front_service, written).await?;
    announce(balancer, ctx, written).await;
    if takeover.delete {
        delete_go_proxy(balancer, ctx, &owner).await?;
    }

    // Obsolete backends keep serving the running proxy pods until the new ones have rolled out.
    let obsolete = if ready.status == "True" {
        delete_obsolete_backends(balancer, ctx, &owner, &backend_services).await?;
        0
    } else {
        obsolete_backends(ctx, &owner, &backend_services).len()
    };
    let counts = Counts {
        active: backend_services.len(),
        obsolete,
        proxy: ProxyCounts::of(&deployment),
        exposure: Exposure::of(&front),
    };
    write_status(balancer, ctx, counts, ready, takeover.condition).await?;
    Ok(Action::requeue(takeover.requeue.unwrap_or(RESYNC)))
}

/// The proxy's PodDisruptionBudget exists while it has more than one pod: created or kept as
/// `desired`, else deleted when the cache has this Balancer's.
async fn ensure_budget<K>(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    cache: &Store<Cached<K>>,
    desired: K,
    wanted: bool,
    written: &mut Written,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug + Serialize + DeserializeOwned,
{
    if wanted {
        return ensure(ctx, owner, cache, &desired, written).await.map(drop);
    }
    let name = desired.name_any();
    let Some(cached) = cache.get(&ObjectRef::new(&name).within(&owner.namespace)) else { return Ok(()) };
    if !controlled_by(cached.as_ref(), owner) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    if !delete_exact(&api, &name, cached.uid(), DeleteParams::default()).await? {
        return Ok(());
    }
    let note = format!("deleted PodDisruptionBudget {name}: the proxy has one pod at most");
    publish(balancer, ctx, EventType::Normal, "Deleted", note, None).await;
    Ok(())
}

/// Deletes exactly the object with `uid`, never a namesake created since; `false` when it was
/// already gone.
async fn delete_exact<K>(api: &Api<K>, name: &str, uid: Option<String>, params: DeleteParams) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let params = DeleteParams { preconditions: Some(Preconditions { uid, resource_version: None }), ..params };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(Error::Api { verb: "delete", kind: K::kind(&()).into(), name: name.to_string(), source }),
    }
}

/// Looks for the Go operator's proxy Deployment of a Balancer (see [`migration`]).
async fn find_go_proxy(ctx: &Context, owner: &Owner) -> Result<migration::Found, Error> {
    let name = migration::deployment_name(&owner.name);
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let found = api.get_metadata_opt(&name).await.map_err(|source| Error::Api {
        verb: "get",
        kind: "Deployment".into(),
        name: name.clone(),
        source,
    })?;
    Ok(match found {
        None => migration::Found::Absent,
        Some(object) if controlled_by(&object, owner) => migration::Found::Controlled,
        Some(_) => migration::Found::NotControlled,
    })
}

/// Deletes the Go operator's proxy Deployment, only if it is still this Balancer's (by UID).
async fn delete_go_proxy(balancer: &StoredBalancer, ctx: &Context, owner: &Owner) -> Result<(), Error> {
    let name = migration::deployment_name(&owner.name);
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let api_error = |verb, source| Error::Api { verb, kind: "Deployment".into(), name: name.clone(), source };
    let Some(found) = api.get_metadata_opt(&name).await.map_err(|e| api_error("get", e))? else { return Ok(()) };
    if !controlled_by(&found, owner) {
        return Ok(());
    }
    if !delete_exact(&api, &name, found.metadata.uid.clone(), DeleteParams::background()).await? {
        return Ok(());
    }
    let note = format!(
        "deleted the Go operator's proxy Deployment {name}: {} serves",
        crate::api::proxy_deployment_name(&owner.name)
    );
    publish(balancer, ctx, EventType::Normal, "Migrated", note, None).await;
    Ok(())
}

/// Records an invalid or unreadable spec as `Ready=False/InvalidSpec`; waits for the next change.
async fn refuse(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    errors: &[FieldError],
) -> Result<Action, Error> {
    let message = denial_message(&owner.name, errors);
    let counts = counts_from_cache(balancer, ctx);
    let ready = condition(balancer, false, "InvalidSpec", &message);
    match write_status(balancer, ctx, counts, ready, None).await {
        Ok(()) => {}
        // The API server validates the whole object on a status write: one stored under a looser
        // schema cannot get a status until its spec is fixed, so it is told through an event.
        Err(Error::Api { source: kube::Error::Api(status), .. }) if status.code == 422 && names_spec(&status) => {
            publish(balancer, ctx, EventType::Warning, "InvalidSpec", message, None).await;
        }
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

/// Whether a refusal is about the stored spec (its causes, or its message, name a `spec` field).
fn names_spec(status: &kube::core::Status) -> bool {
    let causes = status.details.as_ref().map(|d| d.causes.as_slice()).unwrap_or_default();
    causes.iter().any(|c| c.field.starts_with("spec")) || status.message.contains(": spec.")
}

/// Writes `desired` unless the child already holds every field it sets; returns the child as
/// the API server has it (cached, created or applied).
///
/// Only objects this Balancer controls are ever written: a name held by any other object is a
/// [`Error::Conflict`], never adopted. A child the cache does not know is created with a POST,
/// which the API server refuses when the name is taken, even by an object created a moment ago
/// that no cache has seen yet (a user's Service applied with the Balancer, say); a forced apply
/// would take such an object over. Only that refusal costs a read, to tell a namesake from this
/// Balancer's own child that the cache has not caught up with (or whose label was removed by
/// hand). Later writes are forced server-side applies.
async fn ensure<K>(
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
    let api_error = |verb, source| Error::Api { verb, kind: kind(), name: name.clone(), source };
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let desired =
        &children::stamped(desired).map_err(|source| Error::Unreadable { kind: kind(), name: name.clone(), source })?;
    let (current, created_by_post) = match cache.get(&ObjectRef::new(&name).within(&namespace)) {
        Some(cached) => {
            let object =
                cached.object().map_err(|source| Error::Unreadable { kind: kind(), name: name.clone(), source })?;
            (object, cached.created_by_post())
        }
        None => match create(&api, desired).await.map_err(|e| api_error("create", e))? {
            Some(created) => return Ok(written.add(ctx, Verb::Created, created)),
            // The name is taken: by what?
            None => {
                let found = api.get(&name).await.map_err(|e| api_error("get", e))?;
                let entries = found.meta().managed_fields.as_deref().unwrap_or_default();
                let created_by_post = entries.iter().any(cache::is_created);
                (found, created_by_post)
            }
        },
    };
    if !controlled_by(&current, owner) {
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

/// The managedFields with balancer's `Update` entries folded into its `Apply` entry (which the
/// first of them becomes when there is none); `None` when there is no `Update` entry. Entries
/// of another API version are left alone: their field sets do not compare.
pub fn fold_created_into_applied(entries: Vec<ManagedFieldsEntry>) -> Option<Vec<ManagedFieldsEntry>> {
    if !entries.iter().any(cache::is_created) {
        return None;
    }
    let is_applied =
        |e: &ManagedFieldsEntry| e.manager.as_deref() == Some(FIELD_MANAGER) && e.operation.as_deref() == Some("Apply");
    let mut applied: Option<ManagedFieldsEntry> = entries.iter().find(|e| is_applied(e)).cloned();
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries {
        if is_applied(&entry) {
            continue;
        }
        if !cache::is_created(&entry) {
            kept.push(entry);
            continue;
        }
        match applied.as_mut() {
            None => applied = Some(ManagedFieldsEntry { operation: Some("Apply".into()), ..entry }),
            Some(into) if into.api_version == entry.api_version => {
                let fields = entry.fields_v1.map(|f| f.0).unwrap_or(Value::Null);
                let target = &mut into.fields_v1.get_or_insert_with(|| FieldsV1(json!({}))).0;
                union_fields(target, &fields);
            }
            Some(_) => kept.push(entry),
        }
    }
    kept.extend(applied);
    Some(kept)
}

/// Adds to a `FieldsV1` set (a tree of JSON objects) every path of another.
fn union_fields(into: &mut Value, from: &Value) {
    let (Value::Object(into), Value::Object(from)) = (into, from) else { return };
    for (key, value) in from {
        match into.get_mut(key) {
            Some(existing) => union_fields(existing, value),
            None => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// How a child was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Created,
    Updated,
}

/// The children one reconcile wrote, told in one event: a new Balancer gets one `Created`
/// event for its children, not one per child.
#[derive(Default)]
struct Written {
    children: Vec<(Verb, ObjectReference)>,
}

impl Written {
    /// Records a child just written (and counts it); returns it for the caller to use.
    fn add<K: Resource<DynamicType = ()>>(&mut self, ctx: &Context, verb: Verb, child: K) -> K {
        ctx.metrics.controller.child_applied(&K::kind(&()));
        self.children.push((verb, child.object_ref(&())));
        child
    }
}

/// Publishes one event for the children written so far, and forgets them:
/// `created Service a, ConfigMap b; updated Deployment c`.
async fn announce(balancer: &StoredBalancer, ctx: &Context, written: &mut Written) {
    let children = std::mem::take(&mut written.children);
    let Some((_, first)) = children.first() else { return };
    let list = |verb: Verb| {
        let names: Vec<String> = children
            .iter()
            .filter(|(v, _)| *v == verb)
            .map(|(_, r)| {
                format!("{} {}", r.kind.as_deref().unwrap_or_default(), r.name.as_deref().unwrap_or_default())
            })
            .collect();
        (!names.is_empty()).then(|| names.join(", "))
    };
    let (created, updated) = (list(Verb::Created), list(Verb::Updated));
    let reason = if created.is_some() { "Created" } else { "Updated" };
    let parts: Vec<String> = [("created", created), ("updated", updated)]
        .into_iter()
        .filter_map(|(verb, names)| names.map(|n| format!("{verb} {n}")))
        .collect();
    // The first child keeps the recorder from folding different news into one series.
    publish(balancer, ctx, EventType::Normal, reason, parts.join("; "), Some(first.clone())).await;
}

/// Whether `object`'s controller ownerReference is `owner`.
fn controlled_by(object: &impl Resource, owner: &Owner) -> bool {
    object.owner_references().iter().any(|r| r.controller == Some(true) && r.uid == owner.reference.uid)
}

/// Whether every field set in `desired` has the same value in `actual`: the
/// server-side-apply view of "nothing to change". Lists must match in length
/// and element by element, so a removed port or backend is noticed.
pub fn is_subset(desired: &impl Serialize, actual: &impl Serialize) -> bool {
    match (serde_json::to_value(desired), serde_json::to_value(actual)) {
        (Ok(d), Ok(a)) => value_subset(&d, &a),
        _ => false,
    }
}

fn value_subset(desired: &Value, actual: &Value) -> bool {
    match (desired, actual) {
        (Value::Object(d), Value::Object(a)) => {
            d.iter().all(|(k, dv)| dv.is_null() || a.get(k).is_some_and(|av| value_subset(dv, av)))
        }
        (Value::Array(d), Value::Array(a)) => d.len() == a.len() && d.iter().zip(a).all(|(x, y)| value_subset(x, y)),
        _ => desired == actual,
    }
}

/// The cluster IP the API server gave a backend Service: where nginx sends its traffic.
fn cluster_ip(service: &Service) -> Option<String> {
    let ip = service.spec.as_ref()?.cluster_ip.as_deref()?;
    (!ip.is_empty() && ip != "None").then(|| ip.to_string())
}

/// Backend Services this Balancer controls but no longer names.
fn obsolete_backends(ctx: &Context, owner: &Owner, wanted: &[Service]) -> Vec<Arc<Cached<Service>>> {
    let wanted: Vec<String> = wanted.iter().map(ResourceExt::name_any).collect();
    owned_backend_services(&ctx.children.services, owner)
        .into_iter()
        .filter(|s| !wanted.contains(&s.name_any()))
        .collect()
}

/// Deletes the obsolete backend Services (a failure fails the reconcile).
async fn delete_obsolete_backends(
    balancer: &StoredBalancer,
    ctx: &Context,
    owner: &Owner,
    wanted: &[Service],
) -> Result<(), Error> {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    for service in obsolete_backends(ctx, owner, wanted) {
        let name = service.name_any();
        delete_exact(&api, &name, service.uid(), DeleteParams::default()).await?;
        ctx.metrics.controller.child_deleted("Service");
        let note = format!("deleted obsolete backend Service {name}");
        publish(balancer, ctx, EventType::Normal, "Deleted", note, Some(service.object_ref(&()))).await;
    }
    Ok(())
}

/// Backend Services in the cache that `owner` controls.
fn owned_backend_services(cache: &Store<Cached<Service>>, owner: &Owner) -> Vec<Arc<Cached<Service>>> {
    cache
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(owner.namespace.as_str()))
        .filter(|s| {
            let labels = s.labels();
            labels.get(COMPONENT_LABEL).map(String::as_str) == Some(COMPONENT_BACKEND)
                && labels.get(BALANCER_NAME_LABEL) == Some(&owner.name)
                && labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
        })
        .filter(|s| controlled_by(s.as_ref(), owner))
        .collect()
}

/// The numbers and addresses in the status.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counts {
    active: usize,
    obsolete: usize,
    proxy: ProxyCounts,
    exposure: Exposure,
}

/// The proxy pods, for the scale subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct ProxyCounts {
    replicas: i32,
    ready: i32,
}

impl ProxyCounts {
    fn of(deployment: &Deployment) -> Self {
        let status = deployment.status.as_ref();
        ProxyCounts {
            replicas: status.and_then(|s| s.replicas).unwrap_or(0),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        }
    }

    /// What the status said last (a reconcile that stops early does not look at the Deployment).
    fn previous(balancer: &StoredBalancer) -> Self {
        let status = balancer.status.as_ref();
        ProxyCounts { replicas: status.map_or(0, |s| s.replicas), ready: status.map_or(0, |s| s.ready_replicas) }
    }
}

/// Counts from the cache alone (when a reconcile could not finish): owned backend
/// Services the spec names, and those it no longer names.
fn counts_from_cache(balancer: &StoredBalancer, ctx: &Context) -> Counts {
    let proxy = ProxyCounts::previous(balancer);
    let exposure = Exposure::previous(balancer.status.as_ref());
    let Ok(owner) = Owner::of(balancer) else { return Counts { active: 0, obsolete: 0, proxy, exposure } };
    // An unreadable spec names no backend: every owned one counts as obsolete.
    let backends = balancer.spec.as_ref().map(|s| s.backends.as_slice()).unwrap_or_default();
    let named: Vec<String> = backends.iter().map(|b| crate::api::backend_service_name(&owner.name, &b.name)).collect();
    let (active, obsolete): (Vec<_>, Vec<_>) =
        owned_backend_services(&ctx.children.services, &owner).into_iter().partition(|s| named.contains(&s.name_any()));
    Counts { active: active.len(), obsolete: obsolete.len(), proxy, exposure }
}

/// `Ready` from the proxy Deployment: rolled out (no pod of an older template left, as
/// `kubectl rollout status` has it) and available. Until then the old pods may still send
/// traffic to backends the spec no longer names.
fn proxy_condition(balancer: &StoredBalancer, deployment: &Deployment, active: usize) -> Condition {
    let name = deployment.name_any();
    let want = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0) >= deployment.metadata.generation.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let old = status.replicas.unwrap_or(0) - updated;
    let available = status.available_replicas.unwrap_or(0);
    if want == 0 {
        let message = format!("proxy Deployment {name} is scaled to zero: no traffic is served");
        return condition(balancer, false, SCALED_TO_ZERO, &message);
    }
    if observed && updated >= want && old <= 0 && available >= want {
        let message = format!("proxy Deployment {name} is available ({available}/{want}); {active} backends active");
        condition(balancer, true, PROXY_AVAILABLE, &message)
    } else {
        // Only the available count: the updated count moves as the Deployment controller starts a
        // rollout, and every change of the message is a status write.
        let message = format!("waiting for proxy Deployment {name} to roll out ({available}/{want} available)");
        condition(balancer, false, PROXY_NOT_AVAILABLE, &message)
    }
}

/// The `Ready` reasons of a reconcile that got as far as the proxy: available, rolling out,
/// scaled to zero.
const PROXY_AVAILABLE: &str = "ProxyAvailable";
const PROXY_NOT_AVAILABLE: &str = "ProxyNotAvailable";
const SCALED_TO_ZERO: &str = "ScaledToZero";
pub const PROXY_REASONS: [&str; 3] = [PROXY_AVAILABLE, PROXY_NOT_AVAILABLE, SCALED_TO_ZERO];

/// A `Ready` condition, keeping the previous transition time when the status has not flipped.
fn condition(balancer: &StoredBalancer, ready: bool, reason: &str, message: &str) -> Condition {
    let status = if ready { "True" } else { "False" };
    let previous = balancer
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY))
        .filter(|c| c.status == status);
    Condition {
        type_: READY.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: balancer.metadata.generation,
        last_transition_time: previous.map(|c| c.last_transition_time.clone()).unwrap_or(Time(Timestamp::now())),
    }
}

/// The status a reconcile arrives at; `takeover`, when given, replaces the Go-operator
/// takeover's condition (see [`migration`]).
fn next_status(
    balancer: &StoredBalancer,
    counts: Counts,
    ready: Condition,
    takeover: Option<Condition>,
) -> BalancerStatus {
    let replaced = |c: &Condition| c.type_ == READY || (takeover.is_some() && c.type_ == migration::CONDITION);
    let mut conditions: Vec<Condition> = balancer
        .status
        .as_ref()
        .map(|s| s.conditions.iter().filter(|c| !replaced(c)).cloned().collect())
        .unwrap_or_default();
    conditions.push(ready);
    conditions.extend(takeover);
    BalancerStatus {
        replicas: counts.proxy.replicas,
        ready_replicas: counts.proxy.ready,
        addresses: counts.exposure.addresses,
        node_ports: counts.exposure.node_ports,
        selector: balancer.metadata.name.as_deref().map(children::proxy_selector_string),
        active_backends: i32::try_from(counts.active).unwrap_or(i32::MAX),
        obsolete_backends: i32::try_from(counts.obsolete).unwrap_or(i32::MAX),
        observed_generation: balancer.metadata.generation,
        conditions,
    }
}

/// Patches the status subresource only when it changes; announces Ready flips as events.
async fn write_status(
    balancer: &StoredBalancer,
    ctx: &Context,
    counts: Counts,
    ready: Condition,
    takeover: Option<Condition>,
) -> Result<(), Error> {
    let status = next_status(balancer, counts, ready.clone(), takeover);
    if balancer.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = balancer.name_any();
    let api: Api<StoredBalancer> = Api::namespaced(ctx.client.clone(), &balancer.namespace().unwrap_or_default());
    let patch = Patch::Merge(json!({ "status": status }));
    api.patch_status(&name, &PatchParams::default(), &patch).await.map_err(|source| Error::Api {
        verb: "update status of",
        kind: "Balancer".into(),
        name: name.clone(),
        source,
    })?;
    let was = balancer.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    // A new Balancer waiting for its first proxy pods is progress, not a warning: no event.
    let first_rollout = was.is_none() && ready.reason == PROXY_NOT_AVAILABLE;
    if !first_rollout && was.is_none_or(|c| c.status != ready.status || c.reason != ready.reason) {
        let type_ = if ready.status == "True" { EventType::Normal } else { EventType::Warning };
        publish(balancer, ctx, type_, &ready.reason, ready.message.clone(), None).await;
    }
    Ok(())
}

/// After a failed reconcile: best effort to show the error in the status and as an event.
async fn report_failure(balancer: &StoredBalancer, ctx: &Context, error: &Error) {
    let counts = counts_from_cache(balancer, ctx);
    let reason = match error {
        Error::Conflict { .. } => "Conflict",
        _ => "ReconcileError",
    };
    let ready = condition(balancer, false, reason, &error.to_string());
    if let Err(e) = write_status(balancer, ctx, counts, ready, None).await {
        tracing::debug!(error = %e, "could not record the failure in the status");
    }
}

/// Events are for people; failing to record one must not fail the reconcile.
/// `related` names the child concerned, which also keeps the recorder from
/// folding events about different children into one series.
async fn publish(
    balancer: &StoredBalancer,
    ctx: &Context,
    type_: EventType,
    reason: &str,
    note: String,
    related: Option<ObjectReference>,
) {
    // The events API refuses notes over 1 KiB.
    let note = cut(&note, 1024);
    match ctx.events.publish(&balancer.object_ref(&()), Note { type_, reason, note: &note, related }).await {
        Ok(Published::Sent) => {}
        Ok(Published::Dropped) => {
            ctx.metrics.controller.event_dropped();
            tracing::debug!(reason, %note, "event budget spent: not published");
        }
        Err(e) => tracing::debug!(error = %e, reason, "could not record an event"),
    }
}

/// The controller's clients, both reporting to one [`Contact`].
#[derive(Clone)]
pub struct Clients {
    /// Watches and lists (and the leader Lease): a few long-lived requests, retried on the
    /// controller's own terms (see [`retry`](crate::retry)), never held by the throttle.
    pub direct: Client,
    /// Every reconcile's request, through the throttle (see [`crate::throttle`]).
    pub throttled: Client,
    /// Whether the API server answers them.
    pub contact: Contact,
}

/// Which namespaces the controller watches.
#[derive(Debug, Clone)]
pub enum Scope {
    All,
    Namespace(String),
}

fn api<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Scope::All => Api::all(client.clone()),
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
    }
}

/// How the controller runs and what it builds.
#[derive(Debug, Clone)]
pub struct Options {
    pub scope: Scope,
    pub proxy: ProxySettings,
    /// Balancers reconciled at the same time. kube-runtime's default is no bound at all, and
    /// 1,000 new Balancers then send thousands of requests at once.
    pub concurrency: u16,
}

/// kubectl's copy of the whole object it applied, kept in an annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reconcile reads before an object is cached: `managedFields` (often larger than
/// the rest of the object) and kubectl's last-applied annotation (a copy of it). The subset
/// comparison reads only the fields balancer sets, and it sets neither.
pub fn slim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Watches `api`, retrying every few seconds at most and re-listing at once when the watch
/// expired (see [`retry`](crate::retry)). Its errors are logged here and go no further: the
/// controller would otherwise back off *all* its watches after any one's error, with
/// kube-runtime's default backoff (up to a minute), and leave their requests unpolled meanwhile.
fn watch<K>(
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
            // While the API server is lost, every retry fails: the loss is logged once.
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
fn watch_config() -> watcher::Config {
    watcher::Config { page_size: None, ..watcher::Config::default().any_semantic() }
}

/// One watched kind: the cache the reconciles read, and the changes that trigger them.
struct Reflected<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    changes: BoxStream<'static, Result<K, watcher::Error>>,
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
    fn children(client: &Client, scope: &Scope, contact: &Contact) -> Self {
        let config = watch_config().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let (store, writer) = reflector::store();
        let changes = watch(api(client, scope), config, contact).reflect(writer).touched_objects().boxed();
        Reflected { store, changes }
    }
}

/// The PodDisruptionBudgets watched, in the version the cluster serves.
enum BudgetsReflected {
    V1(Reflected<Cached<PodDisruptionBudget>>),
    V1beta1(Reflected<Cached<PodDisruptionBudgetV1beta1>>),
}

impl BudgetsReflected {
    fn cache(&self) -> BudgetCache {
        match self {
            BudgetsReflected::V1(r) => BudgetCache::V1(r.store.clone()),
            BudgetsReflected::V1beta1(r) => BudgetCache::V1beta1(r.store.clone()),
        }
    }
}

/// Asks the API server which `policy` version it serves, until it answers or `stop`.
async fn policy_version(client: &Client, stop: &CancellationToken) -> Option<PolicyVersion> {
    loop {
        match PolicyVersion::served(client).await {
            Ok(version) => {
                tracing::info!(?version, "PodDisruptionBudgets in this policy version");
                return Some(version);
            }
            Err(e) => tracing::warn!(error = %e, "cannot tell the policy version the API server serves; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

impl Reflected<StoredBalancer> {
    /// Every Balancer in scope, slimmed as cached. Only generation changes trigger: status
    /// updates do not change it, so the controller's own status writes never come back to it.
    fn balancers(client: &Client, scope: &Scope, contact: &Contact) -> Self {
        let (store, writer) = reflector::store();
        let changes = watch(api(client, scope), watch_config(), contact)
            .modify(slim)
            .reflect(writer)
            .applied_objects()
            .predicate_filter(predicates::generation, Default::default())
            .boxed();
        Reflected { store, changes }
    }
}

/// Runs the controller until `stop` is cancelled; sets `synced` once every cache has listed.
pub async fn run(
    clients: Clients,
    options: Options,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let scope = &options.scope;
    let Clients { direct: client, throttled, contact } = clients;
    let Some(policy) = policy_version(&client, &stop).await else { return };
    let services = Reflected::<Cached<Service>>::children(&client, scope, &contact);
    let config_maps = Reflected::<Cached<ConfigMap>>::children(&client, scope, &contact);
    let deployments = Reflected::<Cached<Deployment>>::children(&client, scope, &contact);
    let balancers = Reflected::balancers(&client, scope, &contact);
    let budgets = match policy {
        PolicyVersion::V1 => BudgetsReflected::V1(Reflected::children(&client, scope, &contact)),
        PolicyVersion::V1beta1 => BudgetsReflected::V1beta1(Reflected::children(&client, scope, &contact)),
    };

    let children = ChildCaches {
        services: services.store.clone(),
        config_maps: config_maps.store.clone(),
        deployments: deployments.store.clone(),
        budgets: budgets.cache(),
    };
    let caches = Caches { balancers: balancers.store.clone(), children: children.clone() };
    let ctx = Arc::new(Context::new(throttled, children, options.proxy, metrics.clone()));
    let census = count_balancers(balancers.store.clone(), ctx.clone(), stop.clone());
    let readiness = {
        let caches = caches.clone();
        async move {
            if caches.synced().await {
                synced.store(true, Ordering::Release);
                tracing::info!("controller caches synced");
            }
        }
    };
    // Graceful shutdown drains in-flight reconciles, but kube-runtime's runner waits for the
    // Balancer cache to sync before it can end, and that cache's writer lives in the stream the
    // runner owns. Every reconcile waits for every cache before it writes, and a cache once
    // synced stays so: with any of them unsynced at the stop (RBAC, a missing CRD), nothing is in
    // flight and the controller is dropped instead.
    let stopped_unsynced = {
        let stop = stop.clone();
        async move {
            stop.cancelled().await;
            if caches.synced_now() {
                std::future::pending::<()>().await;
            }
        }
    };
    let config = controller::Config::default().debounce(Duration::from_millis(200)).concurrency(options.concurrency);
    let controller = Controller::for_stream(balancers.changes, balancers.store)
        .owns_stream(services.changes)
        .owns_stream(config_maps.changes)
        .owns_stream(deployments.changes);
    let controller = match budgets {
        BudgetsReflected::V1(budgets) => controller.owns_stream(budgets.changes),
        BudgetsReflected::V1beta1(budgets) => controller.owns_stream(budgets.changes),
    };
    let controller = controller
        .with_config(config)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                log_controller_error(&e);
            }
            std::future::ready(())
        });
    let controller = async {
        tokio::select! {
            _ = controller => {}
            _ = stopped_unsynced => tracing::info!("stopped before the Balancer cache synced: nothing to drain"),
        }
    };
    tokio::join!(controller, readiness, census);
    metrics.controller.set_balancers(0, 0, 0);
}

/// The caches of the children balancer writes: only its own, selected by label. Objects it does
/// not manage are not watched: creating a child is a POST, which a taken name refuses.
#[derive(Clone)]
pub struct ChildCaches {
    pub services: Store<Cached<Service>>,
    pub config_maps: Store<Cached<ConfigMap>>,
    pub deployments: Store<Cached<Deployment>>,
    pub budgets: BudgetCache,
}

impl ChildCaches {
    /// Waits until every child cache has listed; false when the controller stopped first.
    ///
    /// It looks every [`LISTED_POLL`] rather than awaiting kube's `wait_until_ready`, which
    /// wakes only the last task to wait (one waker per store). Of several reconciles and the
    /// readiness check waiting for a slow list, all but one then slept on after it arrived.
    /// This was seen after an etcd restart: a new leader's reconcile never woke, and the change
    /// it was for waited for the 5-minute resync.
    pub async fn synced(&self) -> bool {
        loop {
            match self.listed() {
                Some(listed) => return listed,
                None => tokio::time::sleep(LISTED_POLL).await,
            }
        }
    }

    /// `Some(true)` once every child cache has listed, `Some(false)` when one never will (the
    /// controller stopped), `None` meanwhile.
    fn listed(&self) -> Option<bool> {
        let budgets = match &self.budgets {
            BudgetCache::V1(store) => listed_now(store),
            BudgetCache::V1beta1(store) => listed_now(store),
        };
        let all = [listed_now(&self.services), listed_now(&self.config_maps), listed_now(&self.deployments), budgets];
        if all.contains(&Some(false)) {
            return Some(false);
        }
        all.iter().all(Option::is_some).then_some(true)
    }
}

/// How often a reconcile waiting for the child caches looks again (only until they have listed).
const LISTED_POLL: Duration = Duration::from_millis(50);

/// Whether `store` has listed, without waiting: `None` not yet, `Some(false)` never (its writer
/// is gone).
fn listed_now<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Option<bool> {
    store.wait_until_ready().now_or_never().map(|ready| ready.is_ok())
}

/// The proxies' PodDisruptionBudgets, in the `policy` version the cluster serves.
#[derive(Clone)]
pub enum BudgetCache {
    V1(Store<Cached<PodDisruptionBudget>>),
    V1beta1(Store<Cached<PodDisruptionBudgetV1beta1>>),
}

/// Every cache of the controller, for telling whether they have all listed.
#[derive(Clone)]
struct Caches {
    balancers: Store<StoredBalancer>,
    children: ChildCaches,
}

impl Caches {
    /// Waits until every cache has listed; false when the controller stopped first.
    async fn synced(&self) -> bool {
        self.balancers.wait_until_ready().await.is_ok() && self.children.synced().await
    }

    /// Whether every cache has listed, without waiting.
    fn synced_now(&self) -> bool {
        self.synced().now_or_never() == Some(true)
    }
}

/// Every 10 s: the Balancers by readiness, for the metrics, and the failure counts of
/// Balancers deleted while failing forgotten (deleted objects are never reconciled again).
async fn count_balancers(balancers: Store<StoredBalancer>, ctx: Arc<Context>, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let (mut ready, mut not_ready, mut unknown) = (0, 0, 0);
        let mut uids = std::collections::HashSet::new();
        for balancer in balancers.state() {
            uids.extend(balancer.uid());
            let condition = balancer.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
            match condition.map(|c| c.status.as_str()) {
                Some("True") => ready += 1,
                Some("False") => not_ready += 1,
                _ => unknown += 1,
            }
        }
        ctx.metrics.controller.set_balancers(ready, not_ready, unknown);
        ctx.failures().retain(|uid, _| uids.contains(uid));
    }
}

fn log_controller_error(error: &controller::Error<Error, watcher::Error>) {
    match error {
        // Reconcile errors are logged where they happen, watch errors in `watch`; a vanished
        // object is routine.
        controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_) => {}
        other => tracing::warn!(error = %other, "controller error"),
    }
}
