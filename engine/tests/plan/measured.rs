//! The capacity planner against what was measured: the bundled device table's predictions for
//! the H200 rows of BENCHMARKS.md (Llama-3-8B F16 and Q4_K, concurrency 1 to 256) and this
//! CPU's rows stay within the error the planner states; the roofline's parts behave as a
//! roofline; a mixture of experts holds all its experts in memory but reads only those its
//! step's tokens chose; a hostile table or workload is an error, never a panic, a hang or a huge
//! number.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use tpslab_engine::plan::{DeviceTable, ModelShape, PlanError, Workload, check, predict};
use tpslab_kernels::WType;

/// Each row's prediction beside the measurement (shown with `--nocapture`).
fn print(e: &tpslab_engine::plan::ErrorSummary) {
    eprintln!("{}: {}", e.device, e.text());
    for r in &e.rows {
        let p = &r.predicted;
        eprintln!(
            "| {} | {} | {:.0} / {:.0} ({:+.0}%) | {:.0} / {:.1} ({:+.0}%) | {:.0} / {:.0} ({:+.0}%) |",
            r.row.precision,
            r.row.concurrency,
            p.aggregate_tps.unwrap_or(f64::NAN),
            r.row.aggregate_tps,
            r.aggregate_err * 100.0,
            p.per_request_tps.unwrap_or(f64::NAN),
            r.row.per_request_tps,
            r.per_request_err * 100.0,
            p.ttft_ms.unwrap_or(f64::NAN),
            r.row.ttft_ms,
            r.ttft_err * 100.0
        );
    }
}

fn table() -> DeviceTable {
    DeviceTable::bundled().expect("the bundled table parses")
}

fn work(concurrency: usize) -> Workload {
    Workload {
        concurrency,
        prompt_len: 128,
        output_len: 128,
        token_budget: 8192,
    }
}

#[test]
fn h200_predictions_are_within_the_stated_error_of_benchmarks_md() {
    let t = table();
    let h200 = t.device("h200").unwrap();
    let e = check(&t, h200)
        .unwrap()
        .expect("the H200 has measured rows");
    print(&e);
    // Every Llama-3-8B row of BENCHMARKS.md's H200 table: F16 and Q4_K at 1, 16, 64, 256.
    assert_eq!(e.rows.len(), 8);
    for r in &e.rows {
        for (what, err) in [
            ("aggregate", r.aggregate_err),
            ("per-request", r.per_request_err),
            ("ttft", r.ttft_err),
        ] {
            assert!(
                err.abs() <= 0.20,
                "{} c={} {what}: {:+.1}% (predicted {:?})",
                r.row.precision,
                r.row.concurrency,
                err * 100.0,
                r.predicted
            );
        }
    }
    assert!(e.mean_abs_pct <= 10.0, "mean {:.1}%", e.mean_abs_pct);
    // The rows the calibration was not fitted on (16 and 64) are as close.
    assert!(e.held_out_max_abs_pct.unwrap() <= 15.0, "{e:?}");
}

#[test]
fn this_cpu_predictions_are_within_the_stated_error_of_its_measured_rows() {
    let t = table();
    let cpu = t.device("this-cpu").unwrap();
    let e = check(&t, cpu).unwrap().expect("the CPU has measured rows");
    print(&e);
    assert!(e.rows.len() >= 4);
    assert!(e.max_abs_pct <= 25.0, "{e:?}");
    assert!(e.mean_abs_pct <= 12.0, "{e:?}");
}

#[test]
fn batching_trades_per_request_for_aggregate_and_memory_caps_concurrency() {
    let t = table();
    let shape = ModelShape::synthetic("llama-3-8b").unwrap();
    let h200 = t.device("h200").unwrap();
    let at = |c| predict(&t, h200, &shape, WType::F16, &work(c)).unwrap();
    let (one, many) = (at(1), at(256));
    assert!(many.aggregate_tps.unwrap() > 20.0 * one.aggregate_tps.unwrap());
    assert!(many.per_request_tps.unwrap() < one.per_request_tps.unwrap());
    assert!(many.ttft_ms.unwrap() > one.ttft_ms.unwrap());
    // 16 GB of F16 weights; 256 tokens of 128 KiB of KV each per sequence.
    assert!(
        (one.weights_gib - 14.96).abs() < 0.05,
        "{}",
        one.weights_gib
    );
    let per_seq_gib = 256.0 * 131072.0 / (1u64 << 30) as f64;
    let expect = ((131.3 - 4.0 - one.weights_gib) / per_seq_gib).floor() as usize;
    assert_eq!(one.max_concurrency, expect);
    // Cost: the H200's $/hour over the aggregate rate.
    let usd = 3.5 / (many.aggregate_tps.unwrap() * 3600.0) * 1e6;
    assert!((many.usd_per_million_tokens.unwrap() - usd).abs() < 1e-9);
    // Q4_K reads fewer bytes: faster alone on any device where bytes are the roof.
    let q = predict(&t, h200, &shape, WType::Q4K, &work(1)).unwrap();
    assert!(q.weights_gib < one.weights_gib / 3.0);
    // A slower, cheaper GPU streams each request slower.
    let l40s = t.device("l40s").unwrap();
    let slow = predict(&t, l40s, &shape, WType::F16, &work(1)).unwrap();
    assert!(slow.per_request_tps.unwrap() < one.per_request_tps.unwrap());
    // Past the KV memory the rest wait: concurrency over the cap is flagged.
    let rtx = t.device("rtx4090").unwrap();
    let full = predict(&t, rtx, &shape, WType::F16, &work(4096)).unwrap();
    assert!(full.kv_limited && full.max_concurrency < 4096);
    assert!(full.aggregate_tps.unwrap().is_finite());
}

/// Qwen3-30B-A3B holds its 30.5B parameters (Qwen's figure) but a one-token step reads about
/// its 3.3B active ones less the embedding (gathered, not read); a step of many tokens reads
/// nearly every expert, so decode slows with batch size faster than for a dense model, and
/// gpt-oss keeps its experts in MXFP4 whatever the precision asked.
#[test]
fn a_mixture_of_experts_holds_every_expert_and_reads_those_chosen() {
    let q = ModelShape::synthetic("qwen3-30b-a3b").unwrap();
    let e = q.experts.expect("experts");
    assert_eq!((e.n_expert, e.n_used, e.ffn), (128, 8, 768));
    let params = q.weight_bytes_total(WType::F32) / 4.0;
    assert!((30.0e9..31.0e9).contains(&params), "{params}");
    let one = q.weight_bytes_read(WType::F32, 1) / 4.0;
    assert!((2.9e9..3.2e9).contains(&one), "{one}");
    assert!((e.read_per_layer(1) - 8.0).abs() < 1e-9);
    let many = q.weight_bytes_read(WType::F32, 4096) / 4.0;
    let embedding = (q.hidden * q.vocab) as f64;
    assert!(
        (many / (params - embedding) - 1.0).abs() < 1e-3,
        "{many} of {params}"
    );
    // Reads grow with the batch, then saturate.
    let reads: Vec<f64> = [1, 4, 16, 64, 256]
        .iter()
        .map(|&t| q.weight_bytes_read(WType::Q4K, t))
        .collect();
    assert!(reads.windows(2).all(|w| w[1] > w[0]), "{reads:?}");
    assert!(q.weight_bytes_total(WType::Q4K) / (1u64 << 30) as f64 > 15.0);

    let g = ModelShape::synthetic("gpt-oss-20b").unwrap();
    assert_eq!(g.experts.unwrap().fixed_type, Some(WType::MXFP4));
    // F16 asked: the attention doubles from Q8_0, the MXFP4 experts do not move.
    let (f16, q8) = (
        g.weight_bytes_total(WType::F16),
        g.weight_bytes_total(WType::Q8_0),
    );
    assert!(f16 / q8 < 1.3, "{f16} vs {q8}");
    let params = g.weight_bytes_total(WType::F32);
    assert!(params > 1.0e10, "{params}");
}

#[test]
fn weights_that_do_not_fit_give_no_speed() {
    let t = table();
    let shape = ModelShape::synthetic("llama-3-8b").unwrap();
    let cpu = t.device("rtx4090").unwrap();
    // 30 GB of F32 weights on a 24 GB card.
    let p = predict(&t, cpu, &shape, WType::F32, &work(1)).unwrap();
    assert_eq!(p.max_concurrency, 0);
    assert_eq!(p.per_request_tps, None);
    assert_eq!(p.usd_per_million_tokens, None);
}

#[test]
fn extreme_workloads_are_bounded_or_refused() {
    let t = table();
    let shape = ModelShape::synthetic("smollm2-135m").unwrap();
    let d = t.device("this-cpu").unwrap();
    let start = Instant::now();
    let huge = Workload {
        concurrency: 1 << 24,
        prompt_len: 1 << 24,
        output_len: 1 << 24,
        token_budget: 1,
    };
    // Closed form: no loop over 2^48 prefill steps.
    let p = predict(&t, d, &shape, WType::Q4_1, &huge).unwrap();
    assert!(start.elapsed().as_secs() < 10, "it did not hang");
    assert_eq!(
        p.max_concurrency, 0,
        "2^25 tokens of KV per sequence fit nowhere here"
    );
    for bad in [
        Workload {
            concurrency: 0,
            ..work(1)
        },
        Workload {
            prompt_len: 0,
            ..work(1)
        },
        Workload {
            token_budget: 0,
            ..work(1)
        },
        Workload {
            output_len: (1 << 24) + 1,
            ..work(1)
        },
    ] {
        assert!(matches!(
            predict(&t, d, &shape, WType::Q4_1, &bad),
            Err(PlanError::Workload(_))
        ));
    }
}

#[test]
fn hostile_tables_are_refused_by_name() {
    let good = tpslab_engine::plan::devices::BUNDLED;
    let cases = [
        ("\"value\": 4800,", "\"value\": -4800,", "bandwidth_gb_s"),
        ("\"value\": 4800,", "\"value\": 0,", "bandwidth_gb_s"),
        (
            "\"kv_bandwidth_efficiency\": 0.15",
            "\"kv_bandwidth_efficiency\": 1.5",
            "kv_bandwidth_efficiency",
        ),
        (
            "\"decode_compute_efficiency\": 0.35",
            "\"decode_compute_efficiency\": 0",
            "decode_compute_efficiency",
        ),
        (
            "\"batched_compute_efficiency\": 0.26",
            "\"batched_compute_efficiency\": 1.5",
            "batched_compute_efficiency",
        ),
        (
            "\"batched_compute_efficiency\": 0.26,",
            "",
            "batched_above_tokens and batched_compute_efficiency go together",
        ),
        ("\"id\": \"a100\"", "\"id\": \"h200\"", "listed twice"),
        ("\"backend\": \"cpu\"", "\"backend\": \"metal\"", "metal"),
        (
            "\"ttft_overhead_ms\": 15.0",
            "\"ttft_overhead_ms\": -1",
            "ttft_overhead_ms",
        ),
    ];
    for (from, to, named) in cases {
        assert!(good.contains(from), "{from}");
        let bad = good.replacen(from, to, 1);
        let err = DeviceTable::parse(&bad).expect_err(to).to_string();
        assert!(err.contains(named), "{to}: {err}");
    }
    // JSON has no NaN; a number too large for f64 is refused by the parser.
    let inf = good.replacen("\"value\": 4800,", "\"value\": 1e999,", 1);
    assert!(DeviceTable::parse(&inf).is_err());
    assert!(DeviceTable::parse("{").is_err());
    assert!(DeviceTable::parse("[]").is_err());
    let t = table();
    let err = t.device("tpu-v9").unwrap_err().to_string();
    assert!(err.contains("tpu-v9") && err.contains("h200"), "{err}");
}

/// The CPU calibration's batched switch is the kernels' own: a change of one without the other
/// would leave the roofline modelling a kernel choice the engine no longer makes.
#[test]
fn the_cpu_calibration_switches_where_the_kernels_do() {
    let t = table();
    let cpu = &t.calibrations["cpu"];
    assert_eq!(
        cpu.batched_above_tokens,
        Some(tpslab_kernels::IN_PLACE_MAX_ROWS)
    );
}
