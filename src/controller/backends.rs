//! Each backend as the traffic sees it, as pure functions: its ready endpoints, the share of new
//! connections the proxy aims to give it, and the `BackendsAvailable` condition.
//!
//! The proxy connects to each backend's Service; a Service without a ready endpoint refuses
//! the connection, and nginx moves on to the next backend and leaves the refusing one out for
//! a while. So the weights that count are those of the backends with a ready endpoint: the
//! primaries', or the backups' when no primary has one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::conditions::{ConditionType, Finding};
use super::reasons::Reason;
use super::stored::StoredBalancer;
use crate::api::{BackendStatus, BalancerSpec, ConditionStatus};

/// The backends' part of a status.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Backends {
    pub statuses: Vec<BackendStatus>,
    /// `ready/all`, for `kubectl get`.
    pub summary: String,
    pub condition: Condition,
}

/// One backend of the spec, its weight on the wire, and how many ready endpoints it has.
struct SeenBackend<'a> {
    name: &'a str,
    /// The spec's.
    weight: i32,
    /// A running canary's split, else the spec's.
    live: u64,
    ready: u32,
    backup: bool,
}

/// The backends of `spec`, in spec order, with the weight `on_the_wire` gives each by index (a
/// running canary's split, or the spec's) and the ready endpoints `ready` finds for each backend
/// name (none when it finds nothing), as of `now`.
pub(super) fn backends(
    balancer: &StoredBalancer,
    spec: &BalancerSpec,
    on_the_wire: impl Fn(usize) -> u32,
    ready: impl Fn(&str) -> u32,
    now: Timestamp,
) -> Backends {
    let seen: Vec<SeenBackend> = spec
        .backends
        .iter()
        .enumerate()
        .map(|(index, b)| SeenBackend {
            name: &b.name,
            weight: b.effective_weight(),
            live: u64::from(on_the_wire(index)),
            ready: ready(&b.name),
            backup: b.is_backup(),
        })
        .collect();
    let serving = |backups: bool| -> Vec<u64> {
        let weight = |b: &SeenBackend| if b.ready > 0 && b.backup == backups { b.live } else { 0 };
        seen.iter().map(weight).collect()
    };
    let primaries = serving(false);
    let weights = if primaries.iter().any(|&w| w > 0) { primaries } else { serving(true) };
    let statuses = seen
        .iter()
        .zip(shares(&weights))
        .map(|(b, share)| BackendStatus {
            name: b.name.to_string(),
            weight: b.weight,
            ready_endpoints: i32::try_from(b.ready).unwrap_or(i32::MAX),
            share: i32::from(share),
        })
        .collect::<Vec<_>>();
    let with_endpoints = statuses.iter().filter(|s| s.ready_endpoints > 0).count();
    let summary = format!("{with_endpoints}/{}", statuses.len());
    let weighted = seen.iter().filter(|b| b.live > 0).count();
    let missing: Vec<&str> = seen.iter().filter(|b| b.live > 0 && b.ready == 0).map(|b| b.name).collect();
    let only_backups_missing = seen.iter().all(|b| b.backup || b.live == 0 || b.ready > 0);
    let (status, reason, message) = match missing.as_slice() {
        [] => (
            ConditionStatus::True,
            Reason::EndpointsReady,
            format!("every backend with a weight has a ready endpoint ({summary} backends ready)"),
        ),
        names if names.len() == weighted => (
            ConditionStatus::False,
            Reason::NoReadyEndpoints,
            format!("no backend has a ready endpoint: {}; new connections fail", names.join(", ")),
        ),
        names if only_backups_missing => (
            ConditionStatus::False,
            Reason::NoReadyEndpoints,
            format!("no ready endpoint behind backup {}: it cannot take over", names.join(", ")),
        ),
        names => (
            ConditionStatus::False,
            Reason::NoReadyEndpoints,
            format!("no ready endpoint behind {}; their share goes to the other backends", names.join(", ")),
        ),
    };
    let type_ = ConditionType::BackendsAvailable;
    let condition = Finding { type_, status, reason, message: &message }.replacing(balancer, now);
    Backends { statuses, summary, condition }
}

/// Whole percentages of `weights`' total: each rounded down, and the points left over given
/// one each to the largest remainders (the earlier backend first on a tie), so that they add up
/// to 100 whenever any weight is positive (Hamilton's method). All zero when none is.
pub(super) fn shares(weights: &[u64]) -> Vec<u8> {
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if total == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<(u128, u128)> =
        weights.iter().map(|&w| (u128::from(w) * 100 / total, u128::from(w) * 100 % total)).collect();
    let mut shares: Vec<u8> = exact.iter().map(|&(floor, _)| u8::try_from(floor).unwrap_or(100)).collect();
    let given: u32 = shares.iter().map(|&s| u32::from(s)).sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    // A stable sort keeps spec order among equal remainders.
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1));
    for &index in order.iter().take(100usize.saturating_sub(given as usize)) {
        shares[index] += 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::api::BackendSpec;

    #[test]
    fn shares_are_whole_percentages_that_add_up_to_100() {
        let cases: [(&[u64], &[u8]); 8] = [
            (&[40, 20, 40], &[40, 20, 40]),
            (&[40, 0, 40], &[50, 0, 50]),
            (&[1, 1, 1], &[34, 33, 33]),
            (&[1, 2], &[33, 67]),
            (&[2, 1, 1], &[50, 25, 25]),
            (&[0, 0], &[0, 0]),
            (&[], &[]),
            (&[1, 1, 1, 1, 1, 1], &[17, 17, 17, 17, 16, 16]),
        ];
        for (weights, want) in cases {
            assert_eq!(shares(weights), want, "{weights:?}");
        }
        assert_eq!(shares(&[u64::MAX, u64::MAX]), [50, 50], "no overflow");
    }

    fn balancer() -> StoredBalancer {
        StoredBalancer {
            metadata: ObjectMeta { name: Some("lb".into()), generation: Some(4), ..ObjectMeta::default() },
            spec: Err(crate::spec::FieldError::new("spec", "not read here")),
            status: None,
        }
    }

    fn spec(weights: &[(&str, i32)]) -> BalancerSpec {
        let mut spec: BalancerSpec = serde_json::from_value(serde_json::json!({"ports": [], "backends": []})).unwrap();
        spec.backends = weights
            .iter()
            .map(|(name, weight)| {
                serde_json::from_value::<BackendSpec>(serde_json::json!({"name": name, "weight": weight})).unwrap()
            })
            .collect();
        spec
    }

    const NOW: &str = "2026-11-24T08:00:00Z";

    /// The spec's own weights, as on the wire without a canary.
    fn as_written(spec: &BalancerSpec) -> impl Fn(usize) -> u32 + '_ {
        |index| spec.backends.get(index).map_or(0, |b| u32::try_from(b.effective_weight()).unwrap_or(0))
    }

    #[test]
    fn a_running_canarys_split_gives_the_shares_and_says_which_backends_need_endpoints() {
        // The spec's goal is all on v2; the canary has v2 at 5 %, then at 0 % with no pod ready.
        let spec = spec(&[("v1", 0), ("v2", 100)]);
        let split = |weights: [u32; 2]| move |index: usize| weights.get(index).copied().unwrap_or(0);
        let seen = backends(&balancer(), &spec, split([95, 5]), |_| 1, NOW.parse().unwrap());
        let rows: Vec<(i32, i32)> = seen.statuses.iter().map(|s| (s.weight, s.share)).collect();
        assert_eq!(rows, [(0, 95), (100, 5)], "the spec's weights beside the split's shares");
        let back = backends(&balancer(), &spec, split([100, 0]), |name| u32::from(name == "v1"), NOW.parse().unwrap());
        assert_eq!(back.condition.status, "True", "a canary at 0 % needs no endpoint: {}", back.condition.message);
        let starved =
            backends(&balancer(), &spec, split([95, 5]), |name| u32::from(name == "v1"), NOW.parse().unwrap());
        assert!(starved.condition.message.contains("behind v2;"), "{}", starved.condition.message);
    }

    #[test]
    fn a_backend_without_ready_endpoints_gets_no_share_and_is_named() {
        let spec = spec(&[("v1", 40), ("v2", 20), ("v3", 40)]);
        let seen = backends(
            &balancer(),
            &spec,
            as_written(&spec),
            |name| if name == "v2" { 0 } else { 1 },
            NOW.parse().unwrap(),
        );
        let rows: Vec<(&str, i32, i32)> =
            seen.statuses.iter().map(|s| (s.name.as_str(), s.ready_endpoints, s.share)).collect();
        assert_eq!(rows, [("v1", 1, 50), ("v2", 0, 0), ("v3", 1, 50)]);
        assert_eq!(seen.summary, "2/3");
        let condition = &seen.condition;
        assert_eq!((condition.type_.as_str(), condition.status.as_str()), ("BackendsAvailable", "False"));
        assert_eq!(condition.reason, Reason::NoReadyEndpoints.as_str());
        assert!(condition.message.contains("v2") && !condition.message.contains("v1"), "{}", condition.message);
        assert_eq!(condition.observed_generation, Some(4));
    }

    #[test]
    fn a_backend_weighted_zero_needs_no_endpoint() {
        let spec = spec(&[("v1", 1), ("spare", 0)]);
        let seen =
            backends(&balancer(), &spec, as_written(&spec), |name| u32::from(name == "v1") * 3, NOW.parse().unwrap());
        assert_eq!((seen.condition.status.as_str(), seen.summary.as_str()), ("True", "1/2"));
        assert_eq!(seen.statuses.iter().map(|s| s.share).collect::<Vec<_>>(), [100, 0]);
        assert_eq!(seen.statuses[0].ready_endpoints, 3);
    }

    #[test]
    fn with_no_ready_backend_every_share_is_zero_and_the_condition_says_connections_fail() {
        let spec = spec(&[("v1", 1), ("v2", 1)]);
        let seen = backends(&balancer(), &spec, as_written(&spec), |_| 0, NOW.parse().unwrap());
        assert_eq!(seen.statuses.iter().map(|s| s.share).collect::<Vec<_>>(), [0, 0]);
        assert_eq!(seen.summary, "0/2");
        assert!(seen.condition.message.contains("new connections fail"), "{}", seen.condition.message);
    }

    #[test]
    fn a_backup_shares_only_while_no_primary_has_a_ready_endpoint() {
        let mut spec = spec(&[("v1", 40), ("v2", 20), ("spare", 10)]);
        spec.backends[2].backup = Some(true);
        let shares = |ready: &dyn Fn(&str) -> u32| {
            let seen = backends(&balancer(), &spec, as_written(&spec), ready, NOW.parse().unwrap());
            seen.statuses.iter().map(|s| s.share).collect::<Vec<_>>()
        };
        assert_eq!(shares(&|_| 1), [67, 33, 0]);
        assert_eq!(shares(&|name| u32::from(name != "v1")), [0, 100, 0]);
        assert_eq!(shares(&|name| u32::from(name == "spare")), [0, 0, 100]);
        let cold =
            backends(&balancer(), &spec, as_written(&spec), |name| u32::from(name != "spare"), NOW.parse().unwrap());
        assert_eq!(cold.condition.status, "False", "a backup without endpoints is reported");
        assert!(cold.condition.message.contains("backup spare: it cannot take over"), "{}", cold.condition.message);
    }
}
