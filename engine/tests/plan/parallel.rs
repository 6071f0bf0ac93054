//! Multi-GPU plans (issue 47): tensor parallelism splits the weights and the KV heads per GPU
//! and raises the concurrency that fits, its all-reduces cost little on NVLink and grow with TP
//! on PCIe, a 70B in BF16 needs TP4 on H100s, pipeline stages leave a bubble at small batches,
//! splits the shape forbids and hostile links are refused by name, and the published multi-GPU
//! runs of vLLM and SGLang are predicted within the stated error (printed with `--nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tpslab_engine::plan::parallel::all_reduce_s;
use tpslab_engine::plan::{
    DeviceTable, ModelShape, Parallel, PlanError, Workload, check_published, pipeline_bubble,
    predict_parallel,
};
use tpslab_kernels::WType;

fn table() -> DeviceTable {
    DeviceTable::bundled().expect("the bundled table parses")
}

fn work(concurrency: usize) -> Workload {
    Workload {
        concurrency,
        prompt_len: 1024,
        output_len: 256,
        token_budget: 8192,
    }
}

fn tp(n: usize) -> Parallel {
    Parallel {
        tp: n,
        pp: 1,
        ep: 1,
    }
}

fn shape(name: &str) -> ModelShape {
    ModelShape::synthetic(name).unwrap()
}

/// The shapes are the models' (config.json): their BF16 bytes / 2 are the published parameter
/// counts (norms aside), and a Qwen3-235B-A22B token reads about 22B of them.
#[test]
fn the_large_shapes_have_their_published_parameter_counts() {
    for (name, params) in [
        ("llama-3.1-70b", 70.55e9),
        ("qwen2.5-72b", 72.71e9),
        ("qwen3-235b-a22b", 235.09e9),
    ] {
        let got = shape(name).weight_bytes_total(WType::BF16) / 2.0;
        assert!((got / params - 1.0).abs() < 0.002, "{name}: {got:.4e}");
    }
    let moe = shape("qwen3-235b-a22b");
    let e = moe.experts.unwrap();
    assert_eq!(
        (e.n_expert, e.n_used, e.ffn, moe.n_layers),
        (128, 8, 1536, 94)
    );
    // One token: the dense matrices and output head, and 8 experts a layer (the embedding's
    // row is gathered, not read).
    let active = moe.weight_bytes_read(WType::BF16, 1) / 2.0;
    assert!((21.0e9..22.5e9).contains(&active), "{active:.3e}");
}

#[test]
fn tensor_parallelism_halves_the_weights_per_gpu_and_raises_the_concurrency_that_fits() {
    let t = table();
    let h100 = t.device("h100").unwrap();
    let s = shape("llama-3.1-70b");
    let p = |n| predict_parallel(&t, h100, &s, WType::BF16, &work(64), tp(n), None).unwrap();
    let (two, four, eight) = (p(2), p(4), p(8));
    for (a, b) in [(&two, &four), (&four, &eight)] {
        let ratio = a.weights_gib / b.weights_gib;
        assert!((ratio - 2.0).abs() < 0.02, "weights per GPU {ratio:.3}x");
        // The memory a GPU frees goes to KV, and the KV per GPU shrinks too (8 K/V heads over
        // up to 8 GPUs): more than twice the sequences fit.
        assert!(
            b.max_concurrency > 2 * a.max_concurrency,
            "{} -> {}",
            a.max_concurrency,
            b.max_concurrency
        );
    }
    // About 70.6B parameters in BF16: 131 GiB, a quarter per GPU at TP4.
    assert!((32.0..34.0).contains(&four.weights_gib), "{four:?}");
    assert_eq!((four.gpus, four.parallel), (4, tp(4)));
    // Four GPUs cost four times one.
    let one_gpu_hour = h100.usd_per_hour.value;
    let usd = four.usd_per_million_tokens.unwrap();
    let tokens_per_hour = four.aggregate_tps.unwrap() * 3600.0;
    assert!((usd - 4.0 * one_gpu_hour / tokens_per_hour * 1e6).abs() < 1e-6 * usd);
}

#[test]
fn a_70b_in_bf16_does_not_fit_one_h100_but_fits_tp4() {
    let t = table();
    let h100 = t.device("h100").unwrap();
    let s = shape("llama-3.1-70b");
    let one = predict_parallel(&t, h100, &s, WType::BF16, &work(1), tp(1), None).unwrap();
    assert_eq!(one.max_concurrency, 0);
    assert!(one.per_request_tps.is_none() && one.aggregate_tps.is_none());
    let four = predict_parallel(&t, h100, &s, WType::BF16, &work(1), tp(4), None).unwrap();
    assert!(four.max_concurrency >= 64, "{four:?}");
    assert!(four.per_request_tps.unwrap() > 0.0);
}

#[test]
fn kv_heads_fewer_than_the_gpus_are_replicated() {
    let s = shape("qwen3-235b-a22b");
    assert_eq!(s.n_kv_heads, 4);
    let kv = |n: usize| tp(n).shard(&s).unwrap().kv_bytes_per_token();
    assert!((kv(2) / kv(4) - 2.0).abs() < 1e-9);
    // Past 4 GPUs each holds one head: the KV per token stops shrinking.
    assert_eq!(kv(4), kv(8));
    assert_eq!(tp(8).kv_heads_per_gpu(&s), 1);
}

#[test]
fn all_reduces_grow_with_tp_on_pcie_and_are_small_on_nvlink() {
    let t = table();
    let pcie = t.device("l40s").unwrap().link.as_ref().unwrap();
    let nvlink = t.device("h100").unwrap().link.as_ref().unwrap();
    // A decode step of 64 sequences of a 8192-wide model: 1 MiB of BF16 activations.
    let bytes = (64 * 8192 * 2) as f64;
    let on = |l, n| all_reduce_s(l, n, bytes);
    assert!(on(pcie, 2) < on(pcie, 4) && on(pcie, 4) < on(pcie, 8));
    // At 1 MiB the links' fixed costs weigh; a prefill chunk's 128 MiB is bandwidth-bound,
    // where NVLink3/4's 600-900 GB/s are 9-14x PCIe Gen4's 64.
    assert!(on(nvlink, 8) * 4.0 < on(pcie, 8));
    let chunk = (8192 * 8192 * 2) as f64;
    assert!(all_reduce_s(nvlink, 8, chunk) * 10.0 < all_reduce_s(pcie, 8, chunk));
    assert_eq!(on(nvlink, 1), 0.0);
    // On NVLink a TP4 70B's 160 all-reduces per token are a small share of its decode step.
    let h100 = t.device("h100").unwrap();
    let s = shape("llama-3.1-70b");
    let p = predict_parallel(&t, h100, &s, WType::BF16, &work(1), tp(4), None).unwrap();
    let step = 1.0 / p.per_request_tps.unwrap();
    let comm = 2.0 * 80.0 * all_reduce_s(nvlink, 4, 8192.0 * 2.0);
    assert!(comm < 0.15 * step, "{comm} of {step}");
    // On PCIe, a TP8 split's all-reduces are a sizable share of its decode step.
    let l40s = t.device("l40s").unwrap();
    let q = predict_parallel(&t, l40s, &s, WType::BF16, &work(64), tp(8), None).unwrap();
    let q_comm = 2.0 * 80.0 * all_reduce_s(pcie, 8, 64.0 * 8192.0 * 2.0);
    assert!(q_comm > 0.10 / q.per_request_tps.unwrap(), "{q_comm}");
}

#[test]
fn pipeline_stages_leave_a_bubble_at_small_batches() {
    assert_eq!(pipeline_bubble(4, 1), 0.75);
    assert_eq!(pipeline_bubble(4, 2), 0.5);
    assert_eq!(pipeline_bubble(4, 4), 0.0);
    assert_eq!(pipeline_bubble(1, 1), 0.0);
    let t = table();
    let h100 = t.device("h100").unwrap();
    let s = shape("llama-3.1-70b");
    let run = |par: Parallel, c: usize| {
        predict_parallel(&t, h100, &s, WType::BF16, &work(c), par, None).unwrap()
    };
    let tp2 = tp(2);
    let tp2pp2 = Parallel { pp: 2, ..tp2 };
    // One request: the second stage's GPUs wait for the first's; twice the GPUs, no faster
    // (each token crosses both stages and one more send).
    let (a, b) = (run(tp2, 1), run(tp2pp2, 1));
    assert!(b.per_request_tps.unwrap() <= a.per_request_tps.unwrap());
    assert!(b.per_request_tps.unwrap() > 0.9 * a.per_request_tps.unwrap());
    // TP4 on the same four GPUs is faster for one request: its all-reduces cost less than
    // the idle stage.
    assert!(run(tp(4), 1).per_request_tps.unwrap() > 1.5 * b.per_request_tps.unwrap());
    // Many requests fill the stages: the pipeline's aggregate beats the two GPUs' by far.
    let (a, b) = (run(tp2, 64), run(tp2pp2, 64));
    assert!(
        b.aggregate_tps.unwrap() > 1.5 * a.aggregate_tps.unwrap(),
        "{a:?} {b:?}"
    );
    assert_eq!(b.gpus, 4);
    // The stages' time to fill delays the first token.
    assert!(run(tp2pp2, 1).ttft_ms.unwrap() > run(tp2, 1).ttft_ms.unwrap());
}

#[test]
fn expert_parallelism_spreads_whole_experts_and_prices_all_to_alls() {
    let t = table();
    let h200 = t.device("h200").unwrap();
    let s = shape("qwen3-235b-a22b");
    let ep = Parallel {
        tp: 8,
        pp: 1,
        ep: 8,
    };
    let shard = ep.shard(&s).unwrap();
    assert_eq!(shard.experts.unwrap().n_expert, 16);
    let a = predict_parallel(&t, h200, &s, WType::BF16, &work(64), tp(8), None).unwrap();
    let b = predict_parallel(&t, h200, &s, WType::BF16, &work(64), ep, None).unwrap();
    // The same bytes per GPU either way (all experts over 8 GPUs), about 235B in BF16 / 8.
    assert!((a.weights_gib / b.weights_gib - 1.0).abs() < 0.01);
    assert!((50.0..58.0).contains(&a.weights_gib), "{a:?}");
    assert!(b.per_request_tps.unwrap() > 0.0 && b.parallel.ep == 8);
}

#[test]
fn splits_the_shape_forbids_are_refused_by_name() {
    let t = table();
    let refused = |model: &str, par: Parallel, device: &str| -> String {
        let d = t.device(device).unwrap();
        let e = predict_parallel(&t, d, &shape(model), WType::BF16, &work(1), par, None)
            .expect_err("refused");
        assert!(matches!(e, PlanError::Parallel(_)), "{e}");
        e.to_string()
    };
    let e = refused("llama-3.1-70b", tp(3), "h100");
    assert!(e.contains("TP 3 does not divide its 64 query heads"), "{e}");
    // 14 heads over 2 K/V heads: TP 7 divides the heads, but 2 K/V heads cannot be copied
    // evenly to 7 GPUs.
    let e = refused("qwen2.5-0.5b", tp(7), "h100");
    assert!(e.contains("K/V heads"), "{e}");
    let pp17 = Parallel {
        tp: 1,
        pp: 17,
        ep: 1,
    };
    let e = refused("llama-3.2-1b", pp17, "h100");
    assert!(e.contains("more stages than its 16 layers"), "{e}");
    let dense_ep = Parallel {
        tp: 2,
        pp: 1,
        ep: 2,
    };
    assert!(refused("llama-3.1-70b", dense_ep, "h100").contains("no experts"));
    let odd_ep = Parallel {
        tp: 8,
        pp: 1,
        ep: 4,
    };
    assert!(refused("qwen3-235b-a22b", odd_ep, "h100").contains("must equal TP"));
    assert!(refused("llama-3-8b", tp(2), "this-cpu").contains("no link"));
    let huge = Parallel {
        tp: 64,
        pp: 2,
        ep: 1,
    };
    assert!(refused("llama-3.1-70b", huge, "h100").contains("more than 64 GPUs"));
}

/// A change to the bundled table's JSON.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

/// The bundled table with `edit` applied to its JSON, parsed.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Result<DeviceTable, PlanError> {
    let mut v: serde_json::Value =
        serde_json::from_str(tpslab_engine::plan::devices::BUNDLED).unwrap();
    edit(&mut v);
    DeviceTable::parse(&v.to_string())
}

#[test]
fn hostile_links_and_published_rows_are_refused_by_name() {
    let cases: [(&str, Edit); 6] = [
        (
            "device h100: link.bandwidth_gb_s must be a positive number",
            Box::new(|v| v["devices"][0]["link"]["bandwidth_gb_s"]["value"] = 0.0.into()),
        ),
        (
            "device h100: link.latency_us must be a positive number",
            Box::new(|v| v["devices"][0]["link"]["latency_us"]["value"] = (-3.0).into()),
        ),
        (
            "device h100: link.bandwidth_gb_s 1000000000 is past 10000",
            Box::new(|v| v["devices"][0]["link"]["bandwidth_gb_s"]["value"] = 1e9.into()),
        ),
        (
            "device a100: published vllm qwen2.5-0.5b: tp 0 is not 1 to 64",
            Box::new(|v| v["devices"][2]["published"][0]["tp"] = 0.into()),
        ),
        (
            "device a100: published nonesuch qwen2.5-0.5b: engine has no calibration",
            Box::new(|v| v["devices"][2]["published"][0]["engine"] = "nonesuch".into()),
        ),
        (
            "device a100: published vllm qwen2.5-0.5b: output_tps must be a positive number",
            Box::new(|v| v["devices"][2]["published"][0]["output_tps"] = (-1.0).into()),
        ),
    ];
    for (want, edit) in cases {
        let e = edited(edit).expect_err(want);
        assert!(e.to_string().contains(want), "{e} (wanted: {want})");
    }
    // A link without its figures is a parse error, not a default.
    let e = edited(|v| {
        v["devices"][0]["link"]
            .as_object_mut()
            .unwrap()
            .remove("latency_us");
    })
    .expect_err("missing latency");
    assert!(e.to_string().contains("latency_us"), "{e}");
}

/// Every published row: the held-out multi-GPU ones are predicted from calibrations fitted on
/// single-GPU runs only (BENCHMARKS.md, "Multi-GPU planner (issue 47)").
#[test]
fn published_multi_gpu_runs_are_predicted_within_the_stated_error() {
    let t = table();
    let mut held_out_multi = 0;
    for id in ["a100", "h20"] {
        for c in check_published(&t, t.device(id).unwrap()).unwrap() {
            eprintln!("{}", c.text());
            let r = &c.row;
            if r.fitted {
                // The hand fit reproduces the rows it was solved from (KV reads aside).
                assert!(c.err.abs() < 0.03, "{}", c.text());
                continue;
            }
            assert!(r.tp * r.pp > 1, "held-out rows are the multi-GPU ones");
            if r.engine == "sglang" && r.model == "qwen3-235b-a22b" {
                // A known miss, stated in BENCHMARKS.md: SGLang's batch-1 MoE decode over 8
                // H20s is much slower than the dense and single-GPU runs its calibration was
                // fitted on. If this starts landing inside 35%, update BENCHMARKS.md.
                assert!((0.35..0.80).contains(&c.err), "{}", c.text());
                continue;
            }
            held_out_multi += 1;
            assert!(c.err.abs() <= 0.35, "{}", c.text());
        }
    }
    assert!(
        held_out_multi >= 3,
        "{held_out_multi} held-out multi-GPU rows"
    );
}
