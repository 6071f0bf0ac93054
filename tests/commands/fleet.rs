//! `tpslab fleet` through the real binary: a bursty workload replayed against an autoscaled
//! fleet and a larger minimum fleet (the table, the JSON and the CSV agree; the autoscaled
//! fleet lags the burst by the scale-up delay plus the cold start, sheds and misses the SLO;
//! the larger one meets it at a higher cost), a recorded trace replayed, and hostile input
//! refused with one line naming the field.

#![allow(clippy::unwrap_used)]

use serde_json::Value;

use crate::cli_bin;
use crate::temp_dir;
use cli_bin::tpslab;
use temp_dir::TempDir;

/// The bursty example: 5 req/s of the chat preset for 8 minutes, 8x from 120 s for 180 s,
/// against fleets of at least 1, 5 and 6 replicas.
const BURSTY: &[&str] = &[
    "fleet",
    "--synthetic",
    "llama-3-8b",
    "--device",
    "h100",
    "--min-replicas",
    "1,5,6",
    "--max-replicas",
    "8",
    "--max-seqs",
    "16",
    "--token-budget",
    "2048",
    "--workload",
    "chat",
    "--rate",
    "5",
    "--duration-s",
    "480",
    "--burst",
    "120:180:8",
    "--scale-on",
    "queue",
    "--target",
    "2",
    "--interval-s",
    "5",
    "--scale-up-delay-s",
    "20",
    "--scale-down-after-s",
    "30",
    "--disk-gb-s",
    "2",
    "--queue-limit",
    "32",
    "--window-s",
    "10",
    "--slo",
    "ttft_p99_ms=2000,max_shed=0",
    "--seed",
    "1",
];

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} in {v}"))
}

#[test]
fn a_burst_is_lagged_by_delay_plus_cold_start_and_a_larger_fleet_meets_the_slo_for_more() {
    let dir = TempDir::new("fleet-bursty");
    let (json, csv) = (dir.join("bursty.json"), dir.join("bursty.csv"));
    let mut args = BURSTY.to_vec();
    args.extend([
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let out = tpslab(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("cheapest configuration that meets the SLO: h100 F16 min 5"),
        "{stdout}"
    );
    assert!(stdout.contains("h100 F16 min 1"), "{stdout}");
    let c: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let (small, big, bigger) = (&c["reports"][0], &c["reports"][1], &c["reports"][2]);
    // The cold start: the weights over the 2 GB/s disk (slower than the H100's PCIe link).
    let cold = f(small, "/cold_start_s");
    let weights = f(small, "/weights_gib") * (1u64 << 30) as f64;
    assert!((cold - weights / 2e9).abs() < 1e-6, "{cold}");
    // The autoscaled fleet's second replica is ready no sooner than delay + cold start after
    // the burst, and within a few autoscaler looks of that.
    let timeline = small["timeline"].as_array().unwrap();
    let t = |p: &Value| p["t"].as_f64().unwrap();
    assert!(
        timeline
            .iter()
            .filter(|p| t(p) < 120.0)
            .all(|p| p["ready"] == 1)
    );
    let second = timeline
        .iter()
        .find(|p| p["ready"].as_u64() >= Some(2))
        .unwrap();
    let lag = second["t"].as_f64().unwrap() - 120.0;
    assert!(lag >= 20.0 + cold && lag <= 20.0 + cold + 15.0, "lag {lag}");
    // During the lag P99 TTFT is far above what it is before the burst; requests are shed.
    let windows = small["windows"].as_array().unwrap();
    let worst = |from: f64, to: f64| {
        (windows.iter())
            .filter(|w| (from..to).contains(&w["start_s"].as_f64().unwrap()))
            .filter_map(|w| w["ttft_p99_ms"].as_f64())
            .fold(0.0, f64::max)
    };
    let (before, during) = (worst(0.0, 120.0), worst(120.0, 120.0 + lag));
    assert!(during > 10.0 * before, "{during} vs {before}");
    assert!(f(small, "/summary/shed") > 0.0);
    assert!(!small["slo_misses"].as_array().unwrap().is_empty());
    // The larger fleet: no shedding, the SLO met, more GPU-hours and $ per token.
    assert_eq!(f(big, "/summary/shed"), 0.0);
    assert!(
        big["slo_misses"].as_array().unwrap().is_empty(),
        "{}",
        big["slo_misses"]
    );
    assert!(f(big, "/summary/ttft_p99_ms") <= 2000.0);
    assert!(f(big, "/summary/gpu_hours") > f(small, "/summary/gpu_hours"));
    let cost = "/summary/usd_per_million_output_tokens";
    assert!(f(big, cost) > f(small, cost));
    // The cheapest that meets the SLO is the smallest minimum that does.
    assert!(bigger["slo_misses"].as_array().unwrap().is_empty());
    assert!(f(bigger, "/summary/usd") > f(big, "/summary/usd"));
    assert_eq!(c["cheapest_meeting_slo"], "h100 F16 min 5");
    // The price says where it comes from (the device table's row).
    assert!(
        small["usd_per_hour"]["source"]
            .as_str()
            .unwrap()
            .contains("H100")
    );
    // The CSV: a header and one row per configuration and window.
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    assert!(rows[0].starts_with("config,start_s,end_s,arrivals,shed"));
    let n: usize = (c["reports"].as_array().unwrap().iter())
        .map(|r| r["windows"].as_array().unwrap().len())
        .sum();
    assert_eq!(rows.len(), 1 + n);
}

#[test]
fn a_written_trace_replays_and_hostile_input_is_one_line() {
    let dir = TempDir::new("fleet-trace");
    let trace = dir.join("trace.jsonl");
    let args = [
        "fleet",
        "--synthetic",
        "llama-3-8b",
        "--rate",
        "2",
        "--duration-s",
        "60",
        "--cold-start-s",
        "30",
        "--write-trace",
        trace.to_str().unwrap(),
    ];
    let out = tpslab(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = String::from_utf8_lossy(&out.stdout).into_owned();
    // The trace replays to the same figures (its own times, from its first request).
    let out = tpslab(&[
        "fleet",
        "--synthetic",
        "llama-3-8b",
        "--trace",
        trace.to_str().unwrap(),
        "--cold-start-s",
        "30",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The latency columns of the configuration's row (the span, and so the cost, starts at
    // the first request in a replayed trace).
    let latencies = |s: &str| -> Vec<String> {
        let row = s
            .lines()
            .find(|l| l.starts_with("h100 F16 min 1"))
            .unwrap_or_default();
        row.split_whitespace().take(10).map(String::from).collect()
    };
    let again = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(latencies(&first).len(), 10, "{first}");
    assert_eq!(latencies(&first), latencies(&again), "{first}\n{again}");
    let fails = |args: &[&str], needle: &str| {
        let out = tpslab(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    };
    let base = ["fleet", "--synthetic", "llama-3-8b", "--cold-start-s", "30"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    // 10^9 requests are refused before any is drawn.
    fails(
        &with(&["--rate", "1000000", "--duration-s", "1000"]),
        "bound on requests",
    );
    fails(&with(&["--rate", "NaN"]), "rate: must be a number");
    fails(&with(&["--rate", "1", "--burst=-5:10:2"]), "burst start");
    fails(
        &with(&["--rate", "1", "--interval-s", "0"]),
        "autoscale interval",
    );
    fails(
        &[
            "fleet",
            "--synthetic",
            "llama-3-8b",
            "--rate",
            "1",
            "--disk-gb-s",
            "0",
        ],
        "disk bandwidth",
    );
    std::fs::write(
        &trace,
        "{\"t\": 5, \"prompt_tokens\": 10, \"completion_tokens\": 5}\n{\"t\": -1, \"prompt_tokens\": 10, \"completion_tokens\": 5}\n",
    )
    .unwrap();
    let mut args = base.to_vec();
    args.extend(["--trace", trace.to_str().unwrap()]);
    fails(&args, "line 2: t must be");
}
