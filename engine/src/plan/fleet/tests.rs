//! The fleet simulator's behaviour in both directions: autoscaling lags a burst by the scale-up
//! delay plus the cold start, with a higher P99 and shedding during the lag; a larger minimum
//! fleet meets the SLO at a higher cost. Also determinism, preemption, and hostile input.

#![allow(clippy::unwrap_used)]

use tpslab_kernels::WType;

use super::*;
use crate::plan::{DeviceTable, ModelShape};
use crate::serving::loadgen::LenDist;
use crate::tune::workload::TraceEntry;

const BURST_AT: f64 = 120.0;
const BURST_FOR: f64 = 180.0;
const DELAY: f64 = 20.0;
const DISK_GB_S: f64 = 2.0;
const INTERVAL: f64 = 5.0;

fn table() -> DeviceTable {
    DeviceTable::bundled().unwrap()
}

fn shape() -> ModelShape {
    ModelShape::synthetic("llama-3-8b").unwrap()
}

/// 8 req/s of prompt 256 -> output 64 for 480 s, 5x from 120 s for 180 s.
fn bursty() -> Vec<Arrival> {
    generate(&Generated {
        prompt_len: LenDist::Fixed(256),
        output_len: LenDist::Fixed(64),
        rate: 8.0,
        duration_s: 480.0,
        shape: RateShape::Burst {
            at_s: BURST_AT,
            for_s: BURST_FOR,
            factor: 5.0,
        },
        seed: 7,
    })
    .unwrap()
}

fn config(name: &str, min: usize, max: usize) -> FleetConfig {
    FleetConfig {
        name: name.into(),
        replica: ReplicaSpec {
            device: "h100".into(),
            precision: WType::F16,
            max_seqs: 16,
            token_budget: 2048,
            usd_per_hour: None,
        },
        autoscale: Autoscale {
            min,
            max,
            metric: ScaleMetric::QueueDepth(2.0),
            interval_s: INTERVAL,
            scale_up_delay_s: DELAY,
            scale_down_after_s: 30.0,
        },
        queue_limit: 32,
        cold_start: ColdStart::Load {
            disk_gb_s: DISK_GB_S,
        },
    }
}

fn limits() -> Limits {
    Limits {
        window_s: 10.0,
        ..Limits::default()
    }
}

fn window_at(r: &FleetReport, t: f64) -> &WindowStats {
    r.windows
        .iter()
        .find(|w| w.start_s <= t && t < w.end_s)
        .unwrap()
}

/// The largest window P99 TTFT over windows starting in `[from, to)`.
fn worst_ttft(r: &FleetReport, from: f64, to: f64) -> f64 {
    (r.windows.iter())
        .filter(|w| w.start_s >= from && w.start_s < to)
        .filter_map(|w| w.latency.ttft_p99_ms)
        .fold(0.0, f64::max)
}

#[test]
fn autoscaling_lags_a_burst_by_the_delay_and_the_cold_start() {
    let (t, s) = (table(), shape());
    let r = simulate(&t, &s, &config("autoscaled", 1, 6), &bursty(), &limits()).unwrap();
    // The cold start is the weights over the disk (slower than the H100's PCIe link).
    let weights = crate::plan::StepModel::new(&t, t.device("h100").unwrap(), &s, WType::F16)
        .unwrap()
        .weight_bytes();
    let cold = weights / (DISK_GB_S * 1e9);
    assert!((r.cold_start_s - cold).abs() < 1e-9, "{}", r.cold_start_s);
    assert!(r.cold_start_s > 7.0, "{}", r.cold_start_s);
    // One replica until the burst; the second is ready no sooner than delay + cold start after
    // it, and within a few autoscaler looks of that.
    let second = r.timeline.iter().find(|p| p.ready >= 2).unwrap().t;
    let lag = second - BURST_AT;
    assert!(lag >= DELAY + cold, "ready {lag:.1} s after the burst");
    assert!(
        lag <= DELAY + cold + 3.0 * INTERVAL,
        "ready {lag:.1} s after the burst"
    );
    assert!(
        r.timeline
            .iter()
            .filter(|p| p.t < BURST_AT)
            .all(|p| p.ready == 1)
    );
    // During the lag the queue builds: P99 TTFT far above before the burst and after the
    // fleet caught up (with the burst still on).
    let before = worst_ttft(&r, 0.0, BURST_AT);
    let during = worst_ttft(&r, BURST_AT, second);
    let caught_up = worst_ttft(&r, second + 60.0, BURST_AT + BURST_FOR);
    assert!(
        during > 10.0 * before,
        "P99 TTFT {during:.0} ms in the lag, {before:.0} before"
    );
    assert!(
        during > 5.0 * caught_up,
        "P99 TTFT {during:.0} ms in the lag, {caught_up:.0} after"
    );
    assert!(r.summary.max_replicas >= 3, "{:?}", r.timeline);
    // Requests are shed at the queue limit, in the lag only.
    assert!(r.summary.shed > 0);
    let shed_in = |from: f64, to: f64| -> u64 {
        (r.windows.iter())
            .filter(|w| w.start_s >= from && w.start_s < to)
            .map(|w| w.shed)
            .sum()
    };
    assert_eq!(shed_in(0.0, BURST_AT), 0);
    assert_eq!(shed_in(BURST_AT, second + INTERVAL), r.summary.shed);
    assert_eq!(window_at(&r, 0.0).replicas_max, 1);
    // Every request that was taken finished, and the replay accounts for every arrival.
    let s = &r.summary;
    assert_eq!(s.unfinished, 0);
    assert_eq!(s.finished + s.shed + s.too_long, s.requests);
    assert_eq!(s.output_tokens, 64 * s.finished);
}

#[test]
fn a_larger_minimum_fleet_meets_the_slo_at_a_higher_cost() {
    let (t, s) = (table(), shape());
    let slo = Slo {
        ttft_p99_ms: Some(2000.0),
        itl_p99_ms: None,
        e2e_p99_ms: None,
        max_shed_share: 0.0,
    };
    let configs = [config("autoscaled", 1, 6), config("min-4", 4, 6)];
    let c = compare(&t, &s, &configs, &bursty(), &limits(), slo).unwrap();
    let (small, big) = (&c.reports[0], &c.reports[1]);
    assert!(!small.slo_misses.as_ref().unwrap().is_empty());
    assert_eq!(big.slo_misses.as_ref().unwrap(), &Vec::<String>::new());
    assert_eq!(big.summary.shed, 0);
    assert!(big.summary.latency.ttft_p99_ms.unwrap() < small.summary.latency.ttft_p99_ms.unwrap());
    assert!(big.summary.gpu_hours > small.summary.gpu_hours);
    assert!(big.summary.usd > small.summary.usd);
    let per_m = |r: &FleetReport| r.summary.usd_per_million_output_tokens.unwrap();
    assert!(
        per_m(big) > per_m(small),
        "{:?}\n{:?}",
        small.summary,
        big.summary
    );
    assert_eq!(c.cheapest_meeting_slo.as_deref(), Some("min-4"));
    // $ = GPU-hours x the table's price of the device.
    let price = t.device("h100").unwrap().usd_per_hour.value;
    assert!((big.summary.usd - big.summary.gpu_hours * price).abs() < 1e-9);
    assert_eq!(
        big.usd_per_hour.source,
        t.device("h100").unwrap().usd_per_hour.source
    );
    // With no SLO to meet, the cheaper fleet wins.
    let loose = Slo {
        max_shed_share: 1.0,
        ..Slo::default()
    };
    let c = compare(&t, &s, &configs, &bursty(), &limits(), loose).unwrap();
    assert_eq!(c.cheapest_meeting_slo.as_deref(), Some("autoscaled"));
}

#[test]
fn replays_are_deterministic_by_seed() {
    let (t, s) = (table(), shape());
    let c = config("a", 1, 3);
    let a = simulate(&t, &s, &c, &bursty(), &limits()).unwrap();
    let b = simulate(&t, &s, &c, &bursty(), &limits()).unwrap();
    assert_eq!(a, b);
    let g = |seed| Generated {
        prompt_len: LenDist::Uniform { min: 64, max: 512 },
        output_len: LenDist::Uniform { min: 32, max: 256 },
        rate: 3.0,
        duration_s: 60.0,
        shape: RateShape::Steady,
        seed,
    };
    assert_eq!(generate(&g(1)).unwrap(), generate(&g(1)).unwrap());
    assert_ne!(generate(&g(1)).unwrap(), generate(&g(2)).unwrap());
}

#[test]
fn a_burst_and_a_daily_curve_shape_the_rate() {
    let a = bursty();
    let count = |from: f64, to: f64| a.iter().filter(|x| x.t >= from && x.t < to).count() as f64;
    let (base, burst) = (
        count(0.0, BURST_AT) / BURST_AT,
        count(BURST_AT, 300.0) / BURST_FOR,
    );
    assert!((base - 8.0).abs() < 1.5, "{base}");
    assert!((burst / base - 5.0).abs() < 1.0, "{burst} vs {base}");
    let daily = generate(&Generated {
        prompt_len: LenDist::Fixed(10),
        output_len: LenDist::Fixed(10),
        rate: 2.0,
        duration_s: 1000.0,
        shape: RateShape::Daily {
            period_s: 1000.0,
            swing: 0.9,
        },
        seed: 3,
    })
    .unwrap();
    let n = |from: f64, to: f64| daily.iter().filter(|x| x.t >= from && x.t < to).count();
    // Trough at the start, peak half a period later, mean the base rate.
    assert!(n(400.0, 600.0) > 5 * n(0.0, 100.0).max(n(900.0, 1000.0)));
    assert!(
        (daily.len() as f64 - 2000.0).abs() < 200.0,
        "{}",
        daily.len()
    );
}

#[test]
fn a_small_kv_preempts_and_still_finishes_everything() {
    let mut t = table();
    let mut d = t.device("h100").unwrap().clone();
    // Room for about 1000 tokens of KV after the weights and the reserve.
    let s = shape();
    let weights = s.weight_bytes_total(WType::F16) / (1u64 << 30) as f64;
    d.memory_gib.value = weights + 4.0 + 1000.0 * s.kv_bytes_per_token() / (1u64 << 30) as f64;
    t.replace_device(d).unwrap();
    let arrivals: Vec<Arrival> = (0..40)
        .map(|_| Arrival {
            t: 0.0,
            prompt: 100,
            output: 200,
        })
        .chain([Arrival {
            t: 1.0,
            prompt: 900,
            output: 200,
        }])
        .collect();
    let r = simulate(&t, &s, &config("tight", 1, 1), &arrivals, &limits()).unwrap();
    assert!(r.kv_capacity_tokens < 1010, "{}", r.kv_capacity_tokens);
    assert!(r.summary.preemptions > 0);
    assert_eq!(r.summary.too_long, 1);
    // One request runs, 32 wait, 7 find the queue full.
    assert_eq!(r.summary.shed, 7);
    assert_eq!(r.summary.finished, 33);
    assert_eq!(r.summary.output_tokens, 33 * 200);
}

#[test]
fn a_trace_replays_at_its_own_times_or_scaled_to_a_rate() {
    let e = |t, p, c| TraceEntry {
        t,
        prompt_tokens: p,
        completion_tokens: c,
    };
    let trace = [e(1000.0, 10, 5), e(1004.0, 20, 6), e(1002.0, 30, 7)];
    let own = from_trace(&trace, None).unwrap();
    assert_eq!(own.iter().map(|a| a.t).collect::<Vec<_>>(), [0.0, 2.0, 4.0]);
    assert_eq!(own[1].prompt, 30);
    let fast = from_trace(&trace, Some(2.0)).unwrap();
    assert_eq!(
        fast.iter().map(|a| a.t).collect::<Vec<_>>(),
        [0.0, 0.5, 1.0]
    );
    // What `serve --record-trace` writes reads back to the same arrivals.
    let lines = to_trace_lines(&own);
    let back = crate::tune::workload::Trace::parse_entries(lines.as_bytes(), 100).unwrap();
    assert_eq!(from_trace(&back, None).unwrap(), own);
}

#[test]
fn hostile_input_is_refused_naming_the_field() {
    let err = |r: Result<Vec<Arrival>, FleetError>| r.unwrap_err().to_string();
    let e = |t, p| TraceEntry {
        t,
        prompt_tokens: p,
        completion_tokens: 1,
    };
    assert!(err(from_trace(&[e(1.0, 1), e(-1.0, 1)], None)).starts_with("trace entry 2: t"));
    assert!(err(from_trace(&[e(f64::NAN, 1)], None)).contains("not NaN"));
    assert!(err(from_trace(&[e(1.0, 0)], None)).contains("prompt_tokens"));
    assert!(err(from_trace(&[e(1.0, 1), e(1.0, 1)], Some(1.0))).contains("spans some time"));
    // 10^9 requests: refused before drawing any.
    let g = Generated {
        prompt_len: LenDist::Fixed(10),
        output_len: LenDist::Fixed(10),
        rate: 1e6,
        duration_s: 1000.0,
        shape: RateShape::Steady,
        seed: 0,
    };
    assert!(err(generate(&g)).contains("bound on requests"));
    let nan = Generated {
        rate: f64::NAN,
        ..g.clone()
    };
    assert!(err(generate(&nan)).starts_with("rate: must be a number"));
    let neg = Generated {
        shape: RateShape::Burst {
            at_s: -5.0,
            for_s: 1.0,
            factor: 2.0,
        },
        rate: 1.0,
        ..g
    };
    assert!(err(generate(&neg)).starts_with("burst start"));
    // A device row with no bandwidth or no host link is refused by the table.
    let json = crate::plan::devices::BUNDLED.replacen("\"value\": 63.0", "\"value\": 0", 1);
    let e = DeviceTable::parse(&json).unwrap_err().to_string();
    assert!(
        e.contains("device h100: host_to_device_gb_s must be a positive"),
        "{e}"
    );
    // Configurations and limits.
    let (t, s) = (table(), shape());
    let a = bursty();
    let sim = |c: &FleetConfig, l: &Limits| simulate(&t, &s, c, &a, l).unwrap_err().to_string();
    let mut c = config("bad", 1, 2);
    c.autoscale.interval_s = f64::NAN;
    assert!(sim(&c, &limits()).starts_with("bad: autoscale interval"));
    let mut c = config("bad", 3, 2);
    assert!(sim(&c, &limits()).starts_with("bad: max replicas"));
    c.autoscale.max = 3;
    c.cold_start = ColdStart::Load { disk_gb_s: 0.0 };
    assert!(sim(&c, &limits()).starts_with("bad: disk bandwidth"));
    let few = Limits {
        max_events: 1000,
        ..limits()
    };
    assert!(sim(&config("ok", 1, 2), &few).contains("bound on events"));
    let tiny = Limits {
        window_s: 0.01,
        ..limits()
    };
    assert!(sim(&config("ok", 1, 2), &tiny).contains("bound on time windows"));
    let mut backwards = a.clone();
    backwards.swap(0, 1);
    let e = simulate(&t, &s, &config("ok", 1, 2), &backwards, &limits()).unwrap_err();
    assert!(e.to_string().contains("sorted"), "{e}");
    // A model the device cannot hold.
    let big = ModelShape::synthetic("llama-3-8b").unwrap();
    let mut c = config("small", 1, 1);
    c.replica.device = "rtx4090".into();
    c.replica.precision = WType::F32;
    let e = simulate(&t, &big, &c, &a, &limits())
        .unwrap_err()
        .to_string();
    assert!(e.contains("leave no memory"), "{e}");
}
