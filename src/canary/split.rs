//! The weights a canary puts on the wire. While it runs, the controller owns the split between
//! the stable and the canary backend: the pair keeps the share the spec gives the two together,
//! and the canary gets its percentage of it; every other backend keeps its share. Once it has
//! completed, the spec's own weights serve.

use crate::api::canary::{CanaryPhase, CanaryStatus};
use crate::spec::canary::CanaryPlan;
use crate::util::arith::gcd;

/// Each backend's weight, for `backends` given as `(name, spec weight)`: the spec's when no
/// canary runs (`status` is `None`, or it has completed), else the pair split by the status's
/// weight, every weight scaled by 100 so that the split is exact, then reduced (see [`reduced`]).
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
    let scaled: Vec<u32> = backends
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
        .collect();
    reduced(scaled)
}

/// The most the weights of a canary's split add up to: nginx's consistent hash (a Service's
/// weight with `sessionAffinity: ClientIP`) spends memory by the unit of weight, and a share
/// within 0.1 point is as exact as a canary needs.
const MAX_TOTAL: u64 = 1000;

/// `weights` divided by their greatest common divisor, then scaled to add up to at most
/// [`MAX_TOTAL`] (rounded, a weight above 0 staying at least 1).
fn reduced(weights: Vec<u32>) -> Vec<u32> {
    let divisor = weights.iter().map(|&w| u64::from(w)).filter(|&w| w > 0).fold(0, gcd).max(1);
    let weights: Vec<u64> = weights.into_iter().map(|w| u64::from(w) / divisor).collect();
    let total: u64 = weights.iter().sum();
    let scale = |w: u64| if total <= MAX_TOTAL || w == 0 { w } else { ((w * MAX_TOTAL + total / 2) / total).max(1) };
    weights.into_iter().map(|w| u32::try_from(scale(w)).unwrap_or(u32::MAX)).collect()
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
        assert_eq!(weights(&backends, &plan(), Some(&running)), [19, 1, 10], "9500, 500 and 5000, reduced");
        assert_eq!(weights(&backends, &plan(), Some(&status(CanaryPhase::Aborted, 0))), [2, 0, 1]);
        let odd = [("v1", 1), ("v2", 0), ("other", 1)];
        let seven = weights(&odd, &plan(), Some(&status(CanaryPhase::Progressing, 7)));
        assert_eq!(seven, [93, 7, 100], "exact when it fits");
        let many = [("v1", 99), ("v2", 2), ("other", 97)];
        let split = weights(&many, &plan(), Some(&status(CanaryPhase::Progressing, 3)));
        assert!(split.iter().map(|&w| u64::from(w)).sum::<u64>() <= MAX_TOTAL + 2, "{split:?}");
        let share = f64::from(split[1]) / f64::from(split[0] + split[1]);
        assert!((share - 0.03).abs() < 0.002, "the canary's share within 0.2 point: {split:?}");
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
