//! The weights a canary puts on the wire. While it runs, the controller owns the split between
//! the stable and the canary backend: the pair keeps the share the spec gives the two together,
//! and the canary gets its percentage of it; every other backend keeps its share. Once it has
//! completed, the spec's own weights serve.

use crate::api::canary::{CanaryPhase, CanaryStatus};
use crate::spec::canary::CanaryPlan;

/// Each backend's weight, for `backends` given as `(name, spec weight)`: the spec's when no
/// canary runs (`status` is `None`, or it has completed), else the pair split by the status's
/// weight, every weight scaled by 100 so that the split is exact.
pub fn weights(backends: &[(&str, u32)], plan: &CanaryPlan, status: Option<&CanaryStatus>) -> Vec<u32> {
    let spec = || backends.iter().map(|(_, weight)| *weight).collect();
    let Some(status) = status.filter(|s| s.phase != CanaryPhase::Completed && s.revision == plan.revision) else {
        return spec();
    };
    let canary_percent = u32::try_from(status.weight.clamp(0, 100)).unwrap_or(0);
    let pair: u32 = backends
        .iter()
        .filter(|(name, _)| *name == plan.stable || *name == plan.canary)
        .map(|(_, weight)| *weight)
        .sum();
    backends
        .iter()
        .map(|(name, weight)| {
            if *name == plan.canary {
                pair * canary_percent
            } else if *name == plan.stable {
                pair * (100 - canary_percent)
            } else {
                weight * 100
            }
        })
        .collect()
}

/// The canary's percentage of the pair in the spec's own weights: where a completed canary
/// ends. Rounded to the nearest; 0 when the pair has no weight.
pub fn goal(backends: &[(&str, u32)], plan: &CanaryPlan) -> u8 {
    let weight = |name: &str| backends.iter().find(|(n, _)| *n == name).map_or(0, |(_, w)| *w);
    let (stable, canary) = (weight(&plan.stable), weight(&plan.canary));
    let pair = stable + canary;
    if pair == 0 {
        return 0;
    }
    u8::try_from((canary * 200 + pair) / (pair * 2)).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::spec::canary::{Rollback, Step};

    fn plan() -> CanaryPlan {
        CanaryPlan {
            stable: "v1".into(),
            canary: "v2".into(),
            steps: vec![Step::SetWeight(5)],
            analysis: None,
            rollback: Rollback { mode: Default::default(), step_duration: Duration::from_secs(10) },
            revision: "r".into(),
        }
    }

    fn status(phase: CanaryPhase, weight: i32) -> CanaryStatus {
        CanaryStatus { revision: "r".into(), phase, weight, ..CanaryStatus::default() }
    }

    #[test]
    fn the_pair_keeps_its_share_and_the_canary_gets_its_percentage_of_it() {
        let backends = [("v1", 0), ("v2", 100), ("other", 50)];
        let running = status(CanaryPhase::Progressing, 5);
        assert_eq!(weights(&backends, &plan(), Some(&running)), [9500, 500, 5000]);
        assert_eq!(weights(&backends, &plan(), Some(&status(CanaryPhase::Aborted, 0))), [10000, 0, 5000]);
        assert_eq!(weights(&backends, &plan(), Some(&status(CanaryPhase::Completed, 100))), [0, 100, 50]);
        assert_eq!(weights(&backends, &plan(), None), [0, 100, 50], "no canary: the spec's weights");
        let other = CanaryStatus { revision: "another".into(), ..running };
        assert_eq!(weights(&backends, &plan(), Some(&other)), [0, 100, 50], "a status of another canary");
    }

    #[test]
    fn the_goal_is_the_canarys_share_of_the_pair_in_the_spec() {
        assert_eq!(goal(&[("v1", 0), ("v2", 100)], &plan()), 100);
        assert_eq!(goal(&[("v1", 2), ("v2", 1)], &plan()), 33);
        assert_eq!(goal(&[("v1", 1), ("v2", 2)], &plan()), 67);
        assert_eq!(goal(&[("v1", 0), ("v2", 0)], &plan()), 0);
    }
}
