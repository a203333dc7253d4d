//! What nginx's smooth weighted round-robin promises: the model the split assertions hold nginx to.

use std::collections::BTreeMap;

/// nginx's smooth weighted round-robin (`ngx_stream_upstream_get_peer`), for `picks` picks:
/// each live peer's current weight grows by its weight, the largest (first on ties)
/// is picked and loses the total. `down` (weight 0) peers are skipped.
fn smooth_wrr(weights: &[i32], picks: usize) -> Vec<usize> {
    let mut current = vec![0i64; weights.len()];
    let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
    let mut order = Vec::with_capacity(picks);
    for _ in 0..picks {
        let mut best: Option<usize> = None;
        for (i, &w) in weights.iter().enumerate() {
            if w == 0 {
                continue;
            }
            current[i] += i64::from(w);
            if best.is_none_or(|b| current[i] > current[b]) {
                best = Some(i);
            }
        }
        let best = best.expect("a live peer");
        current[best] -= total;
        order.push(best);
    }
    order
}

/// The largest amount by which any prefix of one worker's pick sequence is off the
/// exact weighted share, for any peer. The sequence repeats every `sum(weights)` picks.
fn swrr_max_prefix_deviation(weights: &[i32]) -> f64 {
    let total: i32 = weights.iter().sum();
    let mut counts = vec![0usize; weights.len()];
    let mut worst = 0f64;
    for (n, pick) in smooth_wrr(weights, total as usize).into_iter().enumerate() {
        counts[pick] += 1;
        for (i, &w) in weights.iter().enumerate() {
            let exact = (n + 1) as f64 * f64::from(w) / f64::from(total);
            worst = worst.max((counts[i] as f64 - exact).abs());
        }
    }
    worst
}

/// Checks the observed split against `expected` (the exact weighted share of the requests).
///
/// Smooth weighted round-robin is deterministic, not random, so no statistical tolerance
/// is needed: any run of requests is off its exact share by at most
/// `d = swrr_max_prefix_deviation(weights)` per backend (0.6 for 40/20/40). nginx runs
/// several `workers`, and each upstream's `zone` gives them one shared round-robin state, so
/// the total is off by at most `d` too: ±0 requests for 500 over 40/20/40. Without the zone,
/// each worker would keep its own state, and the total could be off by `workers * d`.
pub(crate) fn assert_split(
    observed: &BTreeMap<String, usize>,
    expected: &[(&str, usize)],
    weights: &[i32],
    workers: usize,
) {
    let tolerance = swrr_max_prefix_deviation(weights);
    let total: usize = expected.iter().map(|(_, n)| n).sum();
    assert_eq!(observed.values().sum::<usize>(), total, "every request answered once: {observed:?}");
    for (name, want) in expected {
        let got = observed.get(*name).copied().unwrap_or(0);
        assert!(
            (got as f64 - *want as f64).abs() <= tolerance,
            "backend {name}: {got} of {total} requests, expected {want} ± {tolerance:.1} \
             ({workers} workers sharing the upstream's state, weights {weights:?}); observed split {observed:?}"
        );
    }
    assert!(
        observed.keys().all(|name| expected.iter().any(|(e, _)| e == name)),
        "answers from unexpected backends: {observed:?}"
    );
}

#[test]
fn the_swrr_model_matches_nginx_documented_sequence() {
    // nginx's documented example: weights 5, 1, 1 give a a b a c a a (ngx_http_upstream_round_robin.c).
    assert_eq!(smooth_wrr(&[5, 1, 1], 7), vec![0, 0, 1, 0, 2, 0, 0]);
    // The sample: 40/20/40 repeats v1 v3 v2 v1 v3.
    assert_eq!(smooth_wrr(&[40, 20, 40], 10), vec![0, 2, 1, 0, 2, 0, 2, 1, 0, 2]);
    assert!((swrr_max_prefix_deviation(&[40, 20, 40]) - 0.6).abs() < 1e-9);
    assert_eq!(smooth_wrr(&[40, 0, 10], 5), vec![0, 0, 2, 0, 0]);
}
