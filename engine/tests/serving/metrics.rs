//! Metrics: vLLM-compatible benchmark figures checked against numpy, edge cases, the ring buffer,
//! the live sliding-window figures, cost and process memory.

use proptest::prelude::*;
use tpslab_engine::serving::metrics::{
    BenchSummary, FinishKind, LiveConfig, LiveMetrics, MetricsError, RequestTiming, Ring, Slo,
    StepStats, cost_per_million_output_tokens, parse_proc_status, percentile, process_rss_bytes,
};

/// A metric's name, its mean / median / std / P99 (ms) and its percentile list.
type Row<'a> = (&'a str, [f64; 4], &'a [(f64, f64)]);

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[track_caller]
fn assert_close(actual: f64, expected: f64) {
    assert!(close(actual, expected), "{actual} != {expected}");
}

fn req(sent: f64, token_times: &[f64], prompt: usize, finished: bool) -> RequestTiming {
    RequestTiming {
        sent,
        token_times: token_times.to_vec(),
        prompt_tokens: prompt,
        output_tokens: token_times.len(),
        finished,
        spec: Default::default(),
    }
}

/// Three completed requests (4, 3 and 1 output tokens) and one failed one, over 2 s.
fn example() -> Vec<RequestTiming> {
    vec![
        req(0.0, &[0.10, 0.15, 0.22, 0.30], 10, true),
        req(0.5, &[0.9, 1.0, 1.3], 20, true),
        req(1.0, &[1.25], 5, true),
        req(0.2, &[0.4], 7, false),
    ]
}

#[test]
fn per_request_definitions() {
    let r = &example()[0];
    assert_close(r.ttft().unwrap_or(f64::NAN), 0.10);
    assert_close(r.e2el().unwrap_or(f64::NAN), 0.30);
    let itls: Vec<f64> = r.itls().collect();
    assert_eq!(itls.len(), 3);
    for (got, want) in itls.iter().zip([0.05, 0.07, 0.08]) {
        assert_close(*got, want);
    }
    // (0.30 - 0.10) / (4 - 1)
    assert_close(r.tpot().unwrap_or(f64::NAN), 0.2 / 3.0);
    assert_close(r.tps().unwrap_or(f64::NAN), 15.0);
    let single = &example()[2];
    assert_eq!(single.tpot(), None);
    assert_eq!(single.tps(), None);
    let empty = req(1.0, &[], 3, false);
    assert_eq!(
        (empty.ttft(), empty.e2el(), empty.tpot()),
        (None, None, None)
    );
}

/// Expected figures produced by running vLLM's `calculate_metrics` formulas with numpy 2.4.6 on
/// the same data: the completed requests' ttfts = [0.1, 0.4, 0.25], tpots = [0.2/3, 0.2],
/// itls = all consecutive gaps, e2els = [0.3, 0.8, 0.25]; `np.mean / np.median / np.std /
/// np.percentile(xs, p) * 1000`.
#[test]
fn summary_matches_numpy_on_hand_example() {
    let s = BenchSummary::from_requests(&example(), 2.0, None);
    assert_eq!((s.completed, s.failed), (3, 1));
    assert_eq!((s.total_input_tokens, s.total_output_tokens), (35, 8));
    assert_close(s.duration, 2.0);
    assert_close(s.request_throughput, 1.5);
    assert_close(s.output_throughput, 4.0);
    assert_close(s.total_token_throughput, 21.5);
    assert_eq!(s.request_goodput, None);
    // One-second buckets from t = 0: [0, 1) holds 5 tokens, [1, 2) holds 3.
    assert_close(s.max_output_tokens_per_s, 5.0);
    // [0.5, 1.3) and [1.0, 1.25) overlap; [0, 0.3) overlaps neither.
    assert_eq!(s.max_concurrent_requests, 2);

    let rows: [Row; 4] = [
        (
            "ttft",
            [
                s.mean_ttft_ms,
                s.median_ttft_ms,
                s.std_ttft_ms,
                s.p99_ttft_ms,
            ],
            &s.percentiles_ttft_ms,
        ),
        (
            "tpot",
            [
                s.mean_tpot_ms,
                s.median_tpot_ms,
                s.std_tpot_ms,
                s.p99_tpot_ms,
            ],
            &s.percentiles_tpot_ms,
        ),
        (
            "itl",
            [s.mean_itl_ms, s.median_itl_ms, s.std_itl_ms, s.p99_itl_ms],
            &s.percentiles_itl_ms,
        ),
        (
            "e2el",
            [
                s.mean_e2el_ms,
                s.median_e2el_ms,
                s.std_e2el_ms,
                s.p99_e2el_ms,
            ],
            &s.percentiles_e2el_ms,
        ),
    ];
    // numpy output, per metric: mean, median, std, then P50, P90, P95, P99 (ms).
    let numpy: [[f64; 7]; 4] = [
        [250.0, 250.0, 122.47448713915891, 250.0, 370.0, 385.0, 397.0],
        [
            133.33333333333334,
            133.33333333333334,
            66.66666666666669,
            133.33333333333334,
            186.66666666666669,
            193.33333333333334,
            198.66666666666669,
        ],
        [
            120.0,
            79.99999999999999,
            91.4330356052997,
            79.99999999999999,
            220.00000000000003,
            260.0,
            292.00000000000006,
        ],
        [
            450.0,
            300.0,
            248.32774042918902,
            300.0,
            700.0000000000001,
            750.0,
            790.0,
        ],
    ];
    for ((name, stats, list), want) in rows.iter().zip(numpy) {
        // numpy's mean, median, std and P99 against our mean, median, std and flat p99.
        for (got, want) in stats.iter().zip([want[0], want[1], want[2], want[6]]) {
            assert!(close(*got, want), "{name}: {got} != {want}");
        }
        let ps: Vec<f64> = list.iter().map(|&(p, _)| p).collect();
        assert_eq!(ps, [50.0, 90.0, 95.0, 99.0], "{name}");
        for (&(p, got), want) in list.iter().zip(&want[3..]) {
            assert!(close(got, *want), "{name} P{p}: {got} != {want}");
        }
    }
    // Per-request TPS = 1 / TPOT = [15, 5]: numpy mean 10, median 10, P10 6.
    assert_close(s.mean_per_request_tps.unwrap_or(f64::NAN), 10.0);
    assert_close(s.median_per_request_tps.unwrap_or(f64::NAN), 10.0);
    assert_close(s.p10_per_request_tps.unwrap_or(f64::NAN), 6.0);
}

#[test]
fn goodput_counts_requests_meeting_every_slo() {
    let reqs = example();
    let goodput = |slo: Slo| BenchSummary::from_requests(&reqs, 2.0, Some(slo)).request_goodput;
    // TTFTs 100 / 400 / 250 ms, TPOTs 66.7 / 200 / (one token: 0) ms, E2ELs 300 / 800 / 250 ms.
    let ttft_300 = Slo {
        ttft_ms: Some(300.0),
        ..Slo::default()
    };
    assert_eq!(goodput(ttft_300), Some(1.0));
    let tpot_50 = Slo {
        tpot_ms: Some(50.0),
        ..Slo::default()
    };
    assert_eq!(
        goodput(tpot_50),
        Some(0.5),
        "only the single-token request (TPOT 0)"
    );
    let all_loose = Slo {
        ttft_ms: Some(400.0),
        tpot_ms: Some(200.0),
        e2el_ms: Some(800.0),
    };
    assert_eq!(goodput(all_loose), Some(1.5), "limits are inclusive");
    let e2el_tight = Slo {
        e2el_ms: Some(100.0),
        ..Slo::default()
    };
    assert_eq!(goodput(e2el_tight), Some(0.0));
    assert_eq!(goodput(Slo::default()), None, "an empty SLO is no SLO");
}

#[test]
fn single_token_outputs_have_no_tpot() {
    let reqs = vec![req(0.0, &[0.2], 4, true), req(0.1, &[0.5], 4, true)];
    let s = BenchSummary::from_requests(&reqs, 1.0, None);
    assert_eq!(
        (s.mean_tpot_ms, s.median_tpot_ms, s.p99_tpot_ms),
        (0.0, 0.0, 0.0)
    );
    assert!(s.percentiles_tpot_ms.iter().all(|&(_, v)| v == 0.0));
    assert_eq!((s.mean_itl_ms, s.p99_itl_ms), (0.0, 0.0));
    assert_eq!(s.mean_per_request_tps, None);
    assert_eq!(s.p10_per_request_tps, None);
    assert_close(s.mean_ttft_ms, 300.0);
}

fn no_nan_or_infinity(s: &BenchSummary) {
    let json = serde_json::to_value(s).unwrap_or_default();
    let map = json.as_object().cloned().unwrap_or_default();
    assert!(!map.is_empty());
    for (key, value) in map {
        let numbers: Vec<serde_json::Value> = match value {
            serde_json::Value::Array(pairs) => pairs
                .into_iter()
                .flat_map(|p| p.as_array().cloned().unwrap_or_default())
                .collect(),
            other => vec![other],
        };
        for v in numbers {
            // serde_json writes NaN and infinities as null, so null is only allowed where the
            // field is an Option.
            let nullable = key == "request_goodput" || key.ends_with("per_request_tps");
            assert!(v.is_number() || (nullable && v.is_null()), "{key}: {v}");
        }
    }
}

#[test]
fn zero_requests_give_zeros_not_nan() {
    let s = BenchSummary::from_requests(
        &[],
        10.0,
        Some(Slo {
            ttft_ms: Some(100.0),
            ..Slo::default()
        }),
    );
    assert_eq!((s.completed, s.failed, s.total_output_tokens), (0, 0, 0));
    assert_eq!(s.request_goodput, Some(0.0));
    assert_eq!(
        (s.mean_ttft_ms, s.std_e2el_ms, s.p99_itl_ms),
        (0.0, 0.0, 0.0)
    );
    assert_eq!(
        (s.max_output_tokens_per_s, s.max_concurrent_requests),
        (0.0, 0)
    );
    no_nan_or_infinity(&s);
    // Only failed requests: the same, with the failures counted.
    let failed = BenchSummary::from_requests(&[req(0.0, &[], 3, false)], 1.0, None);
    assert_eq!((failed.completed, failed.failed), (0, 1));
    no_nan_or_infinity(&failed);
}

#[test]
fn zero_or_bad_duration_gives_zero_rates() {
    for duration in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let s = BenchSummary::from_requests(
            &example(),
            duration,
            Some(Slo {
                ttft_ms: Some(300.0),
                ..Slo::default()
            }),
        );
        assert_eq!(s.request_throughput, 0.0);
        assert_eq!(s.output_throughput, 0.0);
        assert_eq!(s.total_token_throughput, 0.0);
        assert_eq!(s.request_goodput, Some(0.0));
        // Latencies do not depend on the duration.
        assert_close(s.mean_ttft_ms, 250.0);
        if duration.is_finite() {
            no_nan_or_infinity(&s);
        }
    }
}

#[test]
fn summary_json_uses_vllm_key_names() {
    let json = serde_json::to_value(BenchSummary::from_requests(&example(), 2.0, None))
        .unwrap_or_default();
    let keys = json.as_object().cloned().unwrap_or_default();
    // Keys vLLM's `vllm bench serve --save-result` writes (default `--metric-percentiles 99`).
    let mut expected = vec![
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        for stat in ["mean", "median", "std", "p99"] {
            expected.push(format!("{stat}_{metric}_ms"));
        }
        // vLLM's BenchmarkMetrics field for the same percentiles.
        expected.push(format!("percentiles_{metric}_ms"));
    }
    for key in &expected {
        assert!(keys.contains_key(key), "missing {key}");
    }
    assert_eq!(json["request_goodput"], serde_json::Value::Null);
    assert_eq!(json["percentiles_ttft_ms"][3][0], 99.0);
    // Ours, beyond vLLM's: the per-request decode speed.
    for key in [
        "mean_per_request_tps",
        "median_per_request_tps",
        "p10_per_request_tps",
    ] {
        assert!(keys.contains_key(key), "missing {key}");
    }
}

/// Values produced by `float(np.percentile([3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 0.7], p))` with
/// numpy 2.4.6; our interpolation follows numpy's `_lerp`, so they match bit for bit.
#[test]
fn percentile_equals_numpy_exactly() {
    let xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 0.7];
    let numpy = [
        (0.0, 0.7),
        (10.0, 0.88),
        (33.3, 1.4989999999999999),
        (50.0, 2.6),
        (75.0, 3.5),
        (99.0, 8.699999999999998),
        (99.9, 8.970000000000002),
        (100.0, 9.0),
    ];
    for (p, want) in numpy {
        assert_eq!(percentile(&xs, p), Some(want), "P{p}");
    }
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[4.0], 99.0), Some(4.0));
}

#[test]
fn ring_basics_and_zero_capacity() {
    assert_eq!(Ring::<u8>::new(0).err(), Some(MetricsError::ZeroCapacity));
    let mut ring = Ring::new(3).unwrap_or_else(|e| panic!("{e}"));
    assert!(ring.is_empty() && ring.latest().is_none());
    assert_eq!(ring.push(1), None);
    assert_eq!(ring.push(2), None);
    assert_eq!(ring.push(3), None);
    assert_eq!(ring.push(4), Some(1));
    assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [2, 3, 4]);
    assert_eq!(ring.iter().rev().copied().collect::<Vec<_>>(), [4, 3, 2]);
    assert_eq!(ring.latest(), Some(&4));
    assert_eq!(ring.as_slices(), (&[2, 3][..], &[4][..]));
    ring.clear();
    assert_eq!((ring.len(), ring.capacity()), (0, 3));
}

fn live(window_s: f64, sample_capacity: usize) -> LiveMetrics {
    LiveMetrics::new(LiveConfig {
        window_s,
        step_capacity: 16,
        sample_capacity,
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

fn step(t: f64, preemptions_total: u64, queries: u64, hits: u64) -> StepStats {
    StepStats {
        t,
        batch_size: 2,
        kv_used_blocks: 3,
        kv_total_blocks: 10,
        preemptions_total,
        prefix_cache_queries: queries,
        prefix_cache_hits: hits,
        step_ms: 12.5,
        ..StepStats::default()
    }
}

#[test]
fn live_metrics_track_a_small_run() {
    let mut m = live(5.0, 64);
    m.on_arrival(1, 0.0, 100);
    m.on_arrival(2, 0.5, 50);
    m.on_refused(0.6);
    // Request 1: first token at 0.2 (TTFT 200 ms), then one every 0.1 s: 10 tokens/s decode.
    for i in 0..5 {
        m.on_token(1, 0.2 + 0.1 * f64::from(i));
    }
    // Request 2: TTFT 500 ms, three tokens at once then one more a second later.
    m.on_tokens(2, 1.0, 3);
    m.on_token(2, 2.0);
    m.on_step(step(1.0, 1, 10, 4));
    m.on_step(step(2.0, 3, 10, 1));
    m.on_finish(1, 0.6, FinishKind::Finished);

    let s = m.snapshot(3.0);
    assert_eq!(s.counters.generation_tokens_total, 9);
    assert_eq!(s.counters.prompt_tokens_total, 150);
    assert_eq!(
        (
            s.counters.requests_finished,
            s.counters.requests_aborted,
            s.counters.requests_refused
        ),
        (1, 0, 1)
    );
    assert_eq!(s.requests_in_flight, 1);
    assert_close(s.output_tps, 9.0 / 5.0);
    assert_close(s.output_tps_window_s, 5.0);
    assert_close(s.output_tps_run, 9.0 / 3.0);
    // Finished request 1: 4 gaps over 0.4 s = 10 tok/s; streaming request 2: 3 tokens after
    // its first in 1 s = 3 tok/s.
    assert_eq!(s.per_request_tps_samples, 2);
    assert_close(s.per_request_tps_mean.unwrap_or(f64::NAN), 6.5);
    assert_close(s.per_request_tps_p10.unwrap_or(f64::NAN), 3.7);
    assert_close(s.ttft_p50_ms.unwrap_or(f64::NAN), 350.0);
    assert_close(s.ttft_p99_ms.unwrap_or(f64::NAN), 497.0);
    // Gaps between deliveries: request 1's four of 0.1 s, request 2's one of 1 s (its burst of
    // three waited once).
    assert_close(s.itl_p50_ms.unwrap_or(f64::NAN), 100.0);
    assert_close(s.itl_p99_ms.unwrap_or(f64::NAN), 964.0);
    assert_close(s.prefix_cache_hit_rate.unwrap_or(f64::NAN), 0.25);
    assert_eq!(s.counters.preemptions, 3);
    assert_eq!(s.latest_step.as_ref().map(|st| st.t), Some(2.0));
    assert_eq!(m.steps().len(), 2);

    // Later, the window has moved past everything: rates drop, totals stay.
    let later = m.snapshot(10.0);
    assert_eq!(later.output_tps, 0.0);
    assert_eq!(later.per_request_tps_mean, None);
    assert_eq!(later.ttft_p50_ms, None);
    assert_eq!(later.itl_p99_ms, None);
    assert_eq!(later.prefix_cache_hit_rate, None);
    assert_eq!(later.counters.generation_tokens_total, 9);

    // Abort the streaming request; its state goes and the counters say why.
    m.on_finish(2, 10.0, FinishKind::Aborted);
    let after = m.snapshot(10.0);
    assert_eq!(
        (after.requests_in_flight, after.counters.requests_aborted),
        (0, 1)
    );

    // Reset: a new run starts from zero; preemptions count from the scheduler's current total.
    m.reset();
    assert_eq!(
        m.snapshot(11.0),
        tpslab_engine::serving::metrics::LiveSnapshot {
            t: 11.0,
            window_s: 5.0,
            output_tps_window_s: 5.0,
            ..Default::default()
        }
    );
    m.on_step(step(12.0, 5, 0, 0));
    let s = m.snapshot(12.0);
    assert_eq!(s.counters.preemptions, 2);
    // The UI's JSON stays flat: counters sit beside the rates.
    let json = serde_json::to_value(&s).unwrap_or_default();
    for key in [
        "output_tps",
        "ttft_p99_ms",
        "itl_p99_ms",
        "requests_refused",
        "preemptions",
        "latest_step",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(s.prefix_cache_hit_rate, None);
}

#[test]
fn live_window_shrinks_honestly_when_samples_overflow() {
    let mut m = live(5.0, 4);
    // Ten bursts of 2 tokens, 0.1 s apart: only the last 4 survive, the 6th (t = 0.5) was the
    // newest evicted, so the rate covers (0.5, 1.0].
    for i in 0..10 {
        m.on_tokens(7, 0.1 * f64::from(i), 2);
    }
    let (tps, span) = m.output_tps_window(1.0);
    assert_close(span, 0.5);
    assert_close(tps, 8.0 / 0.5);
}

#[test]
fn live_config_is_validated() {
    for window_s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bad = LiveMetrics::new(LiveConfig {
            window_s,
            ..LiveConfig::default()
        });
        assert!(matches!(bad, Err(MetricsError::BadWindow(_))));
    }
    let zero = LiveMetrics::new(LiveConfig {
        sample_capacity: 0,
        ..LiveConfig::default()
    });
    assert_eq!(zero.err(), Some(MetricsError::ZeroCapacity));
}

#[test]
fn cost_per_million_tokens() {
    // $3.60 per hour at 100 tok/s = 360k tokens per hour = $10 per million.
    assert_close(
        cost_per_million_output_tokens(3.6, 100.0).unwrap_or(f64::NAN),
        10.0,
    );
    assert_eq!(cost_per_million_output_tokens(3.6, 0.0), None);
    assert_eq!(cost_per_million_output_tokens(3.6, -5.0), None);
    assert_eq!(cost_per_million_output_tokens(3.6, f64::NAN), None);
}

#[test]
fn proc_status_parsing_and_own_rss() {
    let status = "Name:\ttpslab\nVmPeak:\t  900 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n";
    assert_eq!(parse_proc_status(status), Some((1024 * 1024, 2048 * 1024)));
    assert_eq!(parse_proc_status("Name:\tx\n"), None);
    assert_eq!(parse_proc_status("VmRSS:\tlots kB\nVmHWM:\t1 kB\n"), None);
    if cfg!(target_os = "linux") {
        let (rss, peak) = process_rss_bytes().unwrap_or_default();
        assert!(rss > 0 && rss <= peak, "rss {rss}, peak {peak}");
    } else {
        assert_eq!(process_rss_bytes(), None);
    }
}

proptest! {
    #[test]
    fn percentiles_are_monotone_and_bounded(
        xs in prop::collection::vec(-1e6f64..1e6, 1..60),
        mut ps in prop::collection::vec(0.0f64..=100.0, 1..12),
    ) {
        ps.sort_by(f64::total_cmp);
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let values: Vec<f64> = ps.iter().map(|&p| percentile(&xs, p).unwrap_or(f64::NAN)).collect();
        for v in &values {
            prop_assert!(*v >= lo && *v <= hi, "{v} outside [{lo}, {hi}]");
        }
        for pair in values.windows(2) {
            prop_assert!(pair[0] <= pair[1], "{values:?}");
        }
        prop_assert_eq!(percentile(&xs, 0.0), Some(lo));
        prop_assert_eq!(percentile(&xs, 100.0), Some(hi));
    }

    #[test]
    fn ring_keeps_the_newest_in_order(
        capacity in 1usize..20,
        items in prop::collection::vec(any::<u32>(), 0..80),
    ) {
        let mut ring = Ring::new(capacity).unwrap_or_else(|e| panic!("{e}"));
        let mut evicted = Vec::new();
        for &x in &items {
            evicted.extend(ring.push(x));
            prop_assert!(ring.len() <= capacity);
            prop_assert_eq!(ring.capacity(), capacity);
            prop_assert_eq!(ring.latest(), Some(&x));
        }
        let keep = items.len().min(capacity);
        let kept: Vec<u32> = ring.iter().copied().collect();
        prop_assert_eq!(&kept[..], &items[items.len() - keep..]);
        prop_assert_eq!(&evicted[..], &items[..items.len() - keep]);
    }

    #[test]
    fn window_tps_equals_brute_force_recount(
        events in prop::collection::vec((0usize..4, 0u8..4, 1u64..4), 1..200),
        window_s in prop::sample::select(vec![0.5, 1.0, 2.5, 5.0]),
        probe in 0.0f64..40.0,
    ) {
        // Steps of 0, 0.1, 0.25 or 1 s between events; a step of 0 makes tokens share a
        // timestamp, as the tokens of one engine step do.
        let steps = [0.0, 0.1, 0.25, 1.0];
        let mut m = live(window_s, 1024);
        let mut t = 0.0;
        let mut log = Vec::new();
        for &(req, dt, n) in &events {
            t += steps[usize::from(dt)];
            m.on_tokens(req as u64, t, n);
            log.push((t, n));
        }
        for now in [t, probe] {
            let from = now - window_s;
            let want: u64 = log.iter().filter(|(ts, _)| *ts > from && *ts <= now).map(|e| e.1).sum();
            let (tps, span) = m.output_tps_window(now);
            prop_assert!(close(span, window_s));
            prop_assert!(close(tps, want as f64 / window_s), "{tps} vs {want} tokens");
            prop_assert_eq!(m.snapshot(now).counters.generation_tokens_total, log.iter().map(|e| e.1).sum::<u64>());
        }
    }
}
