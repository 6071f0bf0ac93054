//! A whole model on the GPU against the CPU: logits of a prefill and of decode steps through
//! the paged KV pool, and the engine end to end on CUDA. Synthetic weights of the default
//! model's exact shape (smollm2-135m), since no model file travels to a GPU machine; with the
//! real default model present it is checked too. Without a GPU the tests that need one are listed
//! as ignored, with the reason.
//!
//! Tolerance: relative L2 error of the logits under 3e-2. The CPU path quantizes activations to
//! 8 bits (as llama.cpp does) and the GPU path keeps them in f32 (f16 on the cuBLAS path), so the
//! two differ by about the activation quantization error, not by rounding alone.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::mpsc;

use tpslab_engine::device::cuda::{CudaBackend, CudaOpts};
use tpslab_engine::device::{Backend, CpuBackend, DeviceChoice, RowNeed};
use tpslab_engine::formats::gguf::Value;
use tpslab_engine::kv::Batch;
use tpslab_engine::model::arch;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::model::record::Recording;
use tpslab_engine::model::synthetic::synthetic_tokenizer;
use tpslab_engine::model::tiny::{variants, write_tiny};
use tpslab_engine::model::{LoadedModel, Model};
use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Event, Knobs, Request};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::ChatTemplate;
use tpslab_kernels::WType;

/// These tests are ignored by default, with the reason (a machine without a GPU lists them as
/// ignored, never as passed); run with `--include-ignored` where there is one, and fail when
/// there is not.
fn require_gpu() {
    if let Err(e) = tpslab_kernels::cuda::probe() {
        panic!("this test needs a CUDA GPU: {e}");
    }
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Prefill of `prompt` then `steps` decodes of fixed tokens, on both backends (the GPU with its
/// opt-in kernels when `trial`); returns the worst logits error over the steps.
fn compare(lm: &Arc<LoadedModel>, prompt: &[u32], steps: usize, trial: bool) -> f64 {
    let opts = CudaOpts {
        untried: true,
        trial_kernels: trial,
        ..CudaOpts::default()
    };
    compare_with(lm, prompt, steps, opts, &mut |_, _| {})
}

/// [`compare`] with the GPU opened with `opts`; `check` sees both backends after each step.
fn compare_with(
    lm: &Arc<LoadedModel>,
    prompt: &[u32],
    steps: usize,
    opts: CudaOpts,
    check: &mut dyn FnMut(&CudaBackend, &CpuBackend),
) -> f64 {
    let bs = 16;
    let blocks = 64;
    let mut cpu = CpuBackend::new(Arc::clone(lm), 0, bs, blocks).unwrap();
    let mut gpu = CudaBackend::new_with(
        lm,
        0,
        bs,
        blocks * tpslab_engine::kv::KvTypes::F16.bytes_per_block(&lm.model.cfg, bs),
        0.0,
        opts,
    )
    .unwrap();
    assert_eq!(gpu.num_blocks(), blocks);
    // Shuffled block table.
    let table: Vec<u32> = (0..blocks as u32).rev().step_by(3).collect();
    let mut worst = 0.0f64;
    let mut pos = 0;
    let mut toks = prompt.to_vec();
    for step in 0..=steps {
        let mut b = Batch::default();
        b.push_seq(table.clone(), pos, &toks, true);
        let want = cpu.forward(&b, &[RowNeed::Full]).unwrap().logits.to_vec();
        let out = gpu.forward(&b, &[RowNeed::Full]).unwrap();
        assert_eq!(out.logits.len(), want.len());
        assert!(
            out.logits.iter().all(|v| v.is_finite()),
            "non-finite GPU logits"
        );
        let err = rel_err(out.logits, &want);
        println!(
            "step {step}: {} tokens, logits rel err {err:.2e}",
            toks.len()
        );
        check(&gpu, &cpu);
        worst = worst.max(err);
        pos += toks.len();
        toks = vec![(step as u32 * 7919 + 13) % lm.model.cfg.vocab as u32];
    }
    worst
}

#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn synthetic_model_logits_match_cpu_in_every_precision() {
    require_gpu();
    for prec in [
        WType::F16,
        WType::Q8_0,
        WType::Q4_0,
        WType::Q4_1,
        WType::Q4K,
        WType::Q6K,
    ] {
        let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", prec, 7, 0).unwrap());
        let prompt: Vec<u32> = (0..37).map(|i| (i * 131 + 5) % 49_152).collect();
        let err = compare(&lm, &prompt, 4, false);
        println!("{prec:?}: worst logits rel err {err:.2e}");
        assert!(err < 3e-2, "{prec:?}: logits rel err {err:e}");
    }
}

/// The same with the kernels that are opt-in until measured (mmvq, the fused GEMM, wide F16
/// loads, flash prefill): prompts of 37 and 150 tokens (one flash tile, then three; the fused
/// GEMM at 37 and 150 rows), then decodes.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn synthetic_model_logits_match_cpu_with_the_trial_kernels() {
    require_gpu();
    for prec in [WType::F16, WType::Q8_0, WType::Q4_1, WType::Q4K, WType::Q6K] {
        let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", prec, 7, 0).unwrap());
        for len in [37, 150] {
            let prompt: Vec<u32> = (0..len).map(|i| (i * 131 + 5) % 49_152).collect();
            let err = compare(&lm, &prompt, 3, true);
            println!("{prec:?}, prompt {len}: worst logits rel err {err:.2e}");
            assert!(err < 3e-2, "{prec:?}, prompt {len}: logits rel err {err:e}");
        }
    }
}

/// Mixed steps replayed as padded graphs (with the trial kernels): the same step shape three
/// times (run, captured, replayed) with other tokens and block tables each time, logits against
/// the CPU's.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn padded_mixed_step_graphs_match_cpu() {
    require_gpu();
    let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", WType::Q4K, 7, 0).unwrap());
    let (bs, blocks) = (16, 64);
    let mut cpu = CpuBackend::new(Arc::clone(&lm), 0, bs, blocks).unwrap();
    let bytes = blocks * tpslab_engine::kv::KvTypes::F16.bytes_per_block(&lm.model.cfg, bs);
    let mut gpu = CudaBackend::new(&lm, 0, bs, bytes, 0.0).unwrap();
    gpu.set_trial_kernels(true);
    for round in 0..3u32 {
        // Three fresh sequences of 20, 3 and 5 prompt tokens: 28 tokens, 3 sampled rows.
        let mut b = Batch::default();
        for (s, len) in [20u32, 3, 5].into_iter().enumerate() {
            let table: Vec<u32> = (0..2)
                .map(|j| (round * 6 + s as u32 * 2 + j) % 64)
                .collect();
            let toks: Vec<u32> = (0..len)
                .map(|i| (i * 977 + round * 31 + s as u32) % 49_152)
                .collect();
            b.push_seq(table, 0, &toks, true);
        }
        let needs = [RowNeed::Full, RowNeed::Full, RowNeed::Full];
        let want = cpu.forward(&b, &needs).unwrap().logits.to_vec();
        let got = gpu.forward(&b, &needs).unwrap().logits.to_vec();
        let err = rel_err(&got, &want);
        println!("round {round}: logits rel err {err:.2e}");
        assert!(err < 3e-2, "round {round}: logits rel err {err:e}");
    }
}

/// Every family the CUDA path takes (tiny random models laid out as each family's GGUF files
/// are, `tpslab_engine::model::tiny`: Llama 3's rope_freqs, Qwen2's YaRN, Qwen3's QK-norm,
/// Gemma's scales, soft-caps, GELU and sliding windows, Phi-3's LongRoPE, SmolLM3's layers
/// without RoPE, Qwen3-MoE's and Mixtral's experts routed on the host), logits against the
/// CPU's over a prompt longer than the window, with and without the trial kernels.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn every_family_but_gpt_oss_matches_cpu() {
    require_gpu();
    let dir = std::env::temp_dir().join(format!("tpslab-cuda-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for variant in variants().into_iter().filter(|v| *v != "gpt-oss") {
        let lm = tiny(variant, &dir);
        let vocab = lm.model.cfg.vocab as u32;
        let prompt: Vec<u32> = (0..37).map(|i| (i * 131 + 5) % vocab).collect();
        for trial in [false, true] {
            let err = compare(&lm, &prompt, 4, trial);
            println!("{variant} (trial kernels {trial}): worst logits rel err {err:.2e}");
            assert!(
                err < 3e-2,
                "{variant} (trial {trial}): logits rel err {err:e}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tiny model of `variant`'s layout (F32, gpt-oss's experts MXFP4) with a byte-level vocabulary
/// of 300 tokens, written under `dir`.
fn tiny(variant: &str, dir: &std::path::Path) -> Arc<LoadedModel> {
    let tokens = (0..300).map(|i| Value::String(format!("t{i}"))).collect();
    let tokenizer = [
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
    ];
    let path = dir.join(format!("{variant}.gguf"));
    write_tiny(variant, &tokenizer, &path).unwrap();
    let (model, _) = Model::load(&path).unwrap();
    Arc::new(LoadedModel {
        path: path.clone(),
        precision: Precision::built(&model.cfg, WType::F32),
        tokenizer: synthetic_tokenizer(model.cfg.vocab).unwrap(),
        template: ChatTemplate::chatml(),
        model,
    })
}

/// `--n-cpu-moe`: with every expert on the device, then those of the first block, then of every
/// block kept in host memory and run by the CPU, each mixture-of-experts family's logits match
/// the CPU's; the memory figures move those experts from the device's weights to the host's,
/// and the expert load is counted on both paths as the CPU counts it. gpt-oss runs here too
/// once its MXFP4 experts are the CPU's.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn experts_kept_in_host_memory_match_cpu() {
    require_gpu();
    let dir = std::env::temp_dir().join(format!("tpslab-cuda-cpu-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for variant in ["qwen3moe", "mixtral", "gpt-oss"] {
        let lm = tiny(variant, &dir);
        let all = lm.model.weights.bytes();
        let experts: usize = (lm.model.weights)
            .leading_experts(usize::MAX)
            .map(|l| l.bytes())
            .sum();
        let vocab = lm.model.cfg.vocab as u32;
        let prompt: Vec<u32> = (0..37).map(|i| (i * 131 + 5) % vocab).collect();
        // 0: every expert on the device (gpt-oss's MXFP4 experts have no CUDA kernel yet).
        let all_on_device = (variant != "gpt-oss").then_some(0);
        for layers in all_on_device.into_iter().chain([1, usize::MAX]) {
            let opts = CudaOpts {
                untried: true,
                cpu_moe_layers: layers,
                threads: 2,
                ..CudaOpts::default()
            };
            let kept: usize = (lm.model.weights)
                .leading_experts(layers)
                .map(|l| l.bytes())
                .sum();
            assert!((kept > 0) == (layers > 0) && kept <= experts);
            let mut checked = 0;
            let err = compare_with(&lm, &prompt, 4, opts, &mut |gpu, cpu| {
                let mem = gpu.memory();
                assert_eq!((mem.weights, mem.host_weights), (all - kept, kept));
                let (g, c) = (gpu.expert_load().unwrap(), cpu.expert_load().unwrap());
                assert_eq!(g.layers, c.layers);
                assert_eq!(g.bytes_total, c.bytes_total);
                let chose = |l: &tpslab_engine::device::ExpertLoad| -> u32 {
                    l.tokens_per_expert.iter().sum()
                };
                assert_eq!(chose(g), chose(c));
                checked += 1;
            });
            println!("{variant}, experts of {layers} blocks on the CPU: worst rel err {err:.2e}");
            assert!(err < 3e-2, "{variant} ({layers}): logits rel err {err:e}");
            assert_eq!(checked, 5);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Experts kept in host memory are the CPU's to run, so their type needs no CUDA kernel:
/// gpt-oss's MXFP4 experts are refused by name on the device and pass the check when kept on
/// the host (without a GPU the backend then fails at opening one, which this machine may lack).
#[test]
fn experts_kept_in_host_memory_need_no_cuda_kernel() {
    let dir = std::env::temp_dir().join(format!("tpslab-cpu-moe-types-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lm = tiny("gpt-oss", &dir);
    let open = |layers: usize| {
        let opts = CudaOpts {
            untried: true,
            cpu_moe_layers: layers,
            ..CudaOpts::default()
        };
        CudaBackend::new_with(&lm, 0, 16, 64 << 20, 0.0, opts)
            .err()
            .map(|e| e.to_string())
    };
    let refused = open(0).expect("MXFP4 experts on the device are refused");
    assert!(
        refused.contains("MXFP4 has a CUDA kernel that has not run on a GPU yet"),
        "{refused}"
    );
    // One block's experts kept: the other blocks' are still on the device and refused.
    let one = open(1).expect("refused");
    assert!(one.contains("MXFP4 has a CUDA"), "{one}");
    if let Some(e) = open(usize::MAX) {
        assert!(!e.contains("MXFP4"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The CUDA device receives the recording device's op sequence for each synthetic
/// architecture (same recipe, same shapes), on a mixed prefill + decode batch.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn the_cuda_device_receives_the_recorded_sequence() {
    require_gpu();
    for name in ["smollm2-135m", "qwen2.5-0.5b"] {
        let lm = Arc::new(LoadedModel::synthetic(name, WType::Q8_0, 3, 0).unwrap());
        let bs = 16;
        let bytes = 8 * tpslab_engine::kv::KvTypes::F16.bytes_per_block(&lm.model.cfg, bs);
        let mut gpu = CudaBackend::new(&lm, 0, bs, bytes, 0.0).unwrap();
        let mut b = Batch::default();
        b.push_seq(vec![0, 1], 0, &[1, 2, 3, 4, 5], true);
        b.push_seq(vec![2], 3, &[7], true);
        let ops = gpu.recorded_step(&b).unwrap();
        let mut rec = Recording::new();
        match arch::forward(&lm.model.cfg, &lm.model.weights.shapes(), &mut rec) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        assert_eq!(ops, rec.ops, "{name}");
        assert!(!ops.is_empty());
    }
}

/// A model with weights of a type the CUDA backend does not take yet (its kernel untried) is
/// refused with an error naming the type, before any GPU is touched (so this runs without one).
#[test]
fn types_without_a_cuda_kernel_are_refused() {
    for prec in WType::ALL
        .into_iter()
        .filter(|&t| !tpslab_kernels::cuda::Feature::Type(t).runs(false))
    {
        let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", prec, 7, 0).unwrap());
        let err = CudaBackend::new(&lm, 0, 16, 64 << 20, 0.0)
            .err()
            .expect("refused")
            .to_string();
        // The first matrix checked may be a 576-wide one in its fallback (IQ4_XS -> IQ4_NL).
        let fallback = tpslab_engine::model::synthetic::matrix_type(prec, 576);
        assert!(
            err.contains(&format!("{prec} has a CUDA kernel that has not run"))
                || err.contains(&format!("{fallback} has a CUDA kernel that has not run")),
            "{prec:?}: {err}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn real_default_model_logits_match_cpu() {
    require_gpu();
    // Never fetch here: a GPU machine may have no network.
    let path = tpslab_engine::library::models_dir()
        .unwrap()
        .join(tpslab_engine::library::default_manifest().unwrap().file);
    assert!(
        path.exists(),
        "this test needs the default model at {} (gpu-check.sh skips it by name without)",
        path.display()
    );
    let lm = Arc::new(LoadedModel::load(&path).unwrap());
    let prompt = lm.raw_prompt("The capital of France is").unwrap();
    let err = compare(&lm, &prompt, 8, false);
    assert!(err < 3e-2, "logits rel err {err:e}");
}

/// A greedy request for exactly `max_tokens` tokens (the end of sequence ignored).
fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        sampling: SamplingParams::greedy(),
        stop: StopCriteria {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..StopCriteria::default()
        },
        ..Request::default()
    }
}

/// Submits the requests together and returns each one's tokens.
fn run_requests(engine: &EngineHandle, reqs: Vec<Request>) -> Vec<Vec<u32>> {
    let (tx, rx) = mpsc::channel();
    let ids: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r, tx.clone()))
        .collect();
    let mut out = vec![Vec::new(); ids.len()];
    let mut done = 0;
    while done < ids.len() {
        match rx.recv().expect("event") {
            Event::Token { id, token, .. } => {
                out[ids.iter().position(|&x| x == id).unwrap()].push(token)
            }
            Event::Finished { .. } => done += 1,
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            _ => {}
        }
    }
    out
}

/// Speculative decoding with the model on the GPU and the drafter on the CPU (n-gram lookup, and
/// self-drafting from the model's first layers on a CPU backend beside it): each request's
/// greedy tokens are those without speculation, and proposals were made and verified. Steps stay
/// within the GPU's batch-invariant shapes (up to 8 tokens: a request and its 4 proposals).
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn speculation_with_the_model_on_the_gpu_keeps_greedy_tokens() {
    use tpslab_engine::spec::{SpecConfig, SpecMethod};
    require_gpu();
    let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", WType::Q8_0, 3, 0).unwrap());
    let start = |method: SpecMethod| {
        let mut knobs = Knobs::default();
        knobs.scheduler.max_num_batched_tokens = 8;
        knobs.spec = SpecConfig {
            method,
            num_tokens: 4,
            // Every proposal verified, as on the CPU's tests of the same tokens.
            payoff: false,
            ..SpecConfig::default()
        };
        EngineHandle::start(
            Arc::clone(&lm),
            EngineConfig {
                device: DeviceChoice::Cuda(0),
                threads: 2,
                knobs,
                ..EngineConfig::default()
            },
            None,
        )
        .unwrap()
    };
    // A repeated pattern, so that lookup finds n-grams to propose.
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|r| (0..40).map(|i| (i % 7) * 1009 + r * 31).collect())
        .collect();
    let run = |engine: &EngineHandle, prompt: &[u32]| -> (Vec<u32>, usize) {
        let (tx, rx) = mpsc::channel();
        engine.submit(greedy(prompt.to_vec(), 32), tx);
        let mut tokens = Vec::new();
        loop {
            match rx.recv().expect("event") {
                Event::Token { token, .. } => tokens.push(token),
                Event::Finished { usage, .. } => return (tokens, usage.spec.draft_tokens),
                Event::Refused { reason, .. } => panic!("refused: {reason}"),
                _ => {}
            }
        }
    };
    let off = start(SpecMethod::Off);
    assert!(
        off.stats().device.starts_with("CUDA"),
        "{}",
        off.stats().device
    );
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| run(&off, p).0).collect();
    drop(off);
    for method in [SpecMethod::Ngram, SpecMethod::SelfDraft] {
        let engine = start(method);
        let mut drafted = 0;
        for (p, want) in prompts.iter().zip(&want) {
            let (got, d) = run(&engine, p);
            assert_eq!(&got, want, "{method}");
            drafted += d;
        }
        println!("{method}: {drafted} tokens proposed");
        assert!(drafted > 0, "{method}: nothing proposed");
    }
}

/// Top-k sampling with the candidates chosen on the device: seeded requests repeat exactly, stay
/// in the vocabulary, and a request that needs whole rows (a penalty) runs beside them.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn top_k_sampling_on_the_device_repeats_with_a_seed() {
    require_gpu();
    let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", WType::Q8_0, 5, 0).unwrap());
    let engine = EngineHandle::start(
        Arc::clone(&lm),
        EngineConfig {
            device: DeviceChoice::Cuda(0),
            ..EngineConfig::default()
        },
        None,
    )
    .unwrap();
    let req = |penalty: f32| Request {
        prompt: (0..30).map(|i| (i * 31 + 7) % 49_152).collect(),
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 40,
            repetition_penalty: penalty,
            seed: Some(9),
            ..SamplingParams::default()
        },
        stop: StopCriteria {
            max_tokens: Some(20),
            ignore_eos: true,
            ..StopCriteria::default()
        },
        ..Request::default()
    };
    let a = run_requests(&engine, vec![req(1.0), req(1.2)]);
    let b = run_requests(&engine, vec![req(1.0), req(1.2)]);
    assert_eq!(a, b, "seeded top-k runs differ");
    assert!(
        a.iter()
            .flatten()
            .all(|&t| (t as usize) < lm.model.cfg.vocab)
    );
    assert!(a.iter().all(|t| t.len() == 20));
}

/// Greedy tokens of requests run alone and all together on the GPU are identical (the kernels
/// compute each row independently, as long as every step stays on the matrix-vector path: the
/// token budget keeps steps at 8 tokens), and the KV pool is whole afterwards.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn engine_on_cuda_is_batch_invariant() {
    require_gpu();
    let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", WType::Q8_0, 3, 0).unwrap());
    let start = || {
        EngineHandle::start(
            Arc::clone(&lm),
            EngineConfig {
                device: DeviceChoice::Cuda(0),
                knobs: {
                    let mut k = Knobs::default();
                    k.scheduler.max_num_batched_tokens = 8;
                    k
                },
                ..EngineConfig::default()
            },
            None,
        )
        .unwrap()
    };
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|r| {
            (0..(20 + 9 * r))
                .map(|i| (i * 97 + r * 1009) % 49_152)
                .collect()
        })
        .collect();
    let req = |i: usize| greedy(prompts[i].clone(), 24);
    let run = |engine: &EngineHandle, which: &[usize]| -> Vec<Vec<u32>> {
        run_requests(engine, which.iter().map(|&i| req(i)).collect())
    };
    let engine = start();
    assert!(
        engine.stats().device.starts_with("CUDA"),
        "{}",
        engine.stats().device
    );
    let alone: Vec<Vec<u32>> = (0..prompts.len())
        .map(|i| run(&engine, &[i]).remove(0))
        .collect();
    let together = run(&engine, &(0..prompts.len()).collect::<Vec<_>>());
    assert_eq!(alone, together);
    assert!(alone.iter().all(|t| t.len() == 24));
    // The snapshot is published when the engine goes idle, just after the last event.
    let mut s = engine.stats();
    for _ in 0..50 {
        if s.kv_used_blocks == 0 && s.running == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        s = engine.stats();
    }
    assert_eq!(s.kv_used_blocks, 0, "KV blocks still held");
    let mem = s.memory;
    println!("memory: {mem:?}");
    assert!(mem.device_total.unwrap_or(0) > 0 && mem.weights > 0 && mem.kv > 0);
}

/// The live precision knob on the GPU: after `set_precision`, the engine on CUDA gives the tokens
/// a fresh CUDA engine gives on the same weights re-quantized offline (the captured graphs of the
/// old weights are dropped, not replayed).
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn precision_switch_on_cuda_matches_a_fresh_engine() {
    require_gpu();
    let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", WType::F16, 11, 0).unwrap());
    let start = |lm: &Arc<LoadedModel>| {
        EngineHandle::start(
            Arc::clone(lm),
            EngineConfig {
                device: DeviceChoice::Cuda(0),
                ..EngineConfig::default()
            },
            None,
        )
        .unwrap()
    };
    let req = |r: u32| greedy((0..30).map(|i| (i * 31 + r * 7) % 49_152).collect(), 16);
    let engine = start(&lm);
    // Decode steps of this batch size run twice, so a graph is captured on the F16 weights.
    for _ in 0..2 {
        run_requests(&engine, (0..3).map(req).collect());
    }
    engine.set_precision(WType::Q4K);
    let t0 = std::time::Instant::now();
    while !(engine.stats().precision).is_some_and(|p| p.to_string().starts_with("Q4_K")) {
        let s = engine.stats();
        assert!(s.last_error.is_none(), "{:?}", s.last_error);
        assert!(t0.elapsed().as_secs() < 120, "no switch: {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let switched: Vec<_> = (0..2)
        .map(|_| run_requests(&engine, (0..3).map(req).collect()))
        .collect();
    let (q4, _) = tpslab_engine::serving::requant::requantize(&lm, WType::Q4K, 0).unwrap();
    let fresh = run_requests(&start(&Arc::new(q4)), (0..3).map(req).collect());
    assert_eq!(switched[0], fresh);
    assert_eq!(switched[1], fresh);
}
