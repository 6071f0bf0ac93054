//! Every architecture's recipe on a tiny file laid out as that family's real GGUF files are
//! (`model::tiny`): the ops it issues are the family's graph as llama.cpp's builder for it
//! (`src/models/<arch>.cpp`) computes it, written out here from what the file holds, with what
//! each family adds: QK-norm, RoPE frequency factors and scaling per layer, layers without RoPE,
//! local and global layers with their own bases, sliding windows, soft-caps, Gemma's scaled
//! embedding and sandwich norms, gpt-oss's biases, sinks and MXFP4 experts. The CPU device
//! receives exactly that sequence, its logits unchanged by the recording; the CUDA path refuses
//! what it has no kernel for, by name. The graphs are written out for the variants in
//! [`GRAPHS`]; a family added since is held to llama.cpp's numbers (`tests/parity/arch_reference.rs`)
//! and runs here on the CPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tpslab_engine::device::{Workspace, cpu::CpuOps};
use tpslab_engine::formats::gguf::Value;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::Model;
use tpslab_engine::model::arch::{self, Family};
use tpslab_engine::model::config::{ModelConfig, RopeStyle};
use tpslab_engine::model::ops::{Activation, AttnOpts, Buf, Heads, ParamShape, Rope};
use tpslab_engine::model::record::{Op, Recording};
use tpslab_engine::model::tiny::{WINDOW, variants, write_tiny};
use tpslab_kernels::{ThreadPool, WType};

const VOCAB: usize = 300;

fn load(arch: &str) -> Model {
    // Tests run in parallel: a folder of each call's own.
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tpslab-recipe-{arch}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    let tokens = (0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect();
    let tokenizer = [("tokenizer.ggml.tokens".to_string(), Value::Array(tokens))];
    write_tiny(arch, &tokenizer, &path).unwrap();
    let (model, _) = Model::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    model
}

fn m(n: usize, k: usize, bias: bool) -> ParamShape {
    ParamShape::Matrix {
        ty: WType::F32,
        n,
        k,
        bias,
    }
}

fn v(n: usize) -> ParamShape {
    ParamShape::Vector(n)
}

/// ggml's YaRN correction dimensions (betas 32 and 1).
fn corr_dims(n_dims: f32, n_ctx_orig: f32, base: f32) -> [f32; 2] {
    let d = |rot: f32| {
        n_dims * (n_ctx_orig / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
    };
    [d(32.0).floor().max(0.0), d(1.0).ceil().min(n_dims - 1.0)]
}

/// What llama.cpp's builder of `arch` does at layer `li`: the rotation (with its frequency
/// factors) and the attention options, from the tiny file's metadata.
fn layer_of(
    arch: &str,
    c: &ModelConfig,
    li: usize,
) -> (Option<Rope>, Option<ParamShape>, AttnOpts) {
    let hd = c.head_dim;
    let plain = Rope {
        dim: hd,
        theta: 10_000.0,
        style: if matches!(arch, "llama" | "mistral" | "smollm" | "smollm3" | "mixtral") {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Neox
        },
        freq_scale: 1.0,
        yarn: None,
        mscale: 1.0,
    };
    let mut attn = AttnOpts::plain(hd);
    let (rope, factors) = match arch {
        "llama" => (
            Some(Rope {
                theta: 500_000.0,
                ..plain
            }),
            Some(v(hd / 2)),
        ),
        "mistral" => {
            attn.window = Some(WINDOW as usize);
            (Some(plain), None)
        }
        "qwen3moe" | "mixtral" => (
            Some(Rope {
                theta: 1e6,
                ..plain
            }),
            None,
        ),
        // YaRN on every layer, the sliding (even) ones included; queries scaled by the
        // rotated size.
        "gpt-oss" => {
            attn.window = li.is_multiple_of(2).then_some(WINDOW as usize);
            (
                Some(Rope {
                    theta: 150_000.0,
                    freq_scale: 0.25,
                    yarn: Some(corr_dims(hd as f32, 64.0, 150_000.0)),
                    mscale: 1.0 + 0.1 * 4f32.ln(),
                    ..plain
                }),
                None,
            )
        }
        "qwen2" => (
            Some(Rope {
                theta: 1e6,
                freq_scale: 0.25,
                yarn: Some(corr_dims(hd as f32, 64.0, 1e6)),
                mscale: 1.0 + 0.1 * 4f32.ln(),
                ..plain
            }),
            None,
        ),
        "phi3" => (
            Some(Rope {
                mscale: 1.19,
                ..plain
            }),
            Some(v(hd / 2)),
        ),
        // Every fourth layer has no RoPE.
        "smollm3" => ((li % 4 != 3).then_some(plain), None),
        "gemma2" => {
            attn.softcap = Some(20.0);
            attn.window = li.is_multiple_of(2).then_some(WINDOW as usize);
            (Some(plain), None)
        }
        // Five local layers (base 10 000, unscaled) then a global one (base 1e6, linear 8).
        "gemma3" if li % 6 < 5 => {
            attn.window = Some(WINDOW as usize);
            (Some(plain), None)
        }
        "gemma3" => (
            Some(Rope {
                theta: 1e6,
                freq_scale: 0.125,
                ..plain
            }),
            None,
        ),
        _ => (Some(plain), None),
    };
    if arch.starts_with("gemma") {
        attn.scale = 1.0 / (hd as f32).sqrt();
    }
    (rope, factors, attn)
}

/// The variants whose graphs [`graph`] writes out.
const GRAPHS: [&str; 12] = [
    "llama", "mistral", "smollm", "mixtral", "qwen2", "qwen3", "qwen3moe", "phi3", "smollm3",
    "gemma2", "gemma3", "gpt-oss",
];

/// The family's graph for the tiny file of `arch`.
#[allow(clippy::too_many_lines)] // one list of ops, in graph order
fn graph(arch: &str, c: &ModelConfig) -> Vec<Op> {
    let (h, q, kv, hd, ffn, eps) = (
        c.hidden,
        c.q_dim(),
        c.kv_dim(),
        c.head_dim,
        c.ffn,
        c.rms_eps,
    );
    let heads = Heads {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
    };
    let gemma = arch.starts_with("gemma");
    let gpt_oss = arch == "gpt-oss";
    let mut ops = vec![Op::Embed {
        table: m(VOCAB, h, false),
        out: Buf::X,
    }];
    if gemma {
        ops.push(Op::Scale {
            x: Buf::X,
            s: (h as f32).sqrt(),
        });
    }
    for li in 0..c.n_layers {
        ops.push(if li == 0 {
            Op::RmsNorm {
                x: Buf::X,
                w: v(h),
                eps,
                out: Buf::H,
            }
        } else {
            Op::AddRmsNorm {
                x: Buf::X,
                y: Buf::Tmp,
                w: v(h),
                eps,
                out: Buf::H,
            }
        });
        ops.push(Op::Linear {
            w: m(q + 2 * kv, h, matches!(arch, "qwen2" | "gpt-oss")),
            x: Buf::H,
            y: Buf::Qkv,
        });
        if matches!(arch, "qwen3" | "qwen3moe" | "gemma3") {
            ops.push(Op::QkNorm {
                qkv: Buf::Qkv,
                heads,
                q: v(hd),
                k: v(hd),
                eps,
            });
        }
        let (rope, factors, opts) = layer_of(arch, c, li);
        ops.push(Op::RopeStore {
            layer: li,
            qkv: Buf::Qkv,
            heads,
            rope,
            factors,
        });
        ops.push(Op::Attention {
            layer: li,
            qkv: Buf::Qkv,
            heads,
            opts,
            sinks: gpt_oss.then_some(v(c.n_heads)),
            out: Buf::Attn,
        });
        ops.push(Op::Linear {
            w: m(h, q, gpt_oss),
            x: Buf::Attn,
            y: Buf::Tmp,
        });
        if gemma {
            ops.push(Op::RmsNorm {
                x: Buf::Tmp,
                w: v(h),
                eps,
                out: Buf::Tmp,
            });
        }
        ops.push(Op::AddRmsNorm {
            x: Buf::X,
            y: Buf::Tmp,
            w: v(h),
            eps,
            out: Buf::H,
        });
        // llama.cpp's `build_moe_ffn`: for Qwen3-MoE and Mixtral softmax, top-k,
        // renormalized, no scale; for gpt-oss the top-k biased logits softmaxed, biased MXFP4
        // experts, OpenAI's SwiGLU.
        if let Some(e) = c.extras.moe {
            let expert = |n, k| ParamShape::Matrix {
                ty: if gpt_oss { WType::MXFP4 } else { WType::F32 },
                n,
                k,
                bias: gpt_oss,
            };
            ops.push(Op::MoeFfn {
                router: m(e.n_expert, h, gpt_oss),
                gate_up: expert(2 * e.ffn_exp, h),
                down: expert(h, e.ffn_exp),
                n_expert: e.n_expert,
                rule: tpslab_kernels::moe::Router {
                    n_used: e.router.n_used,
                    gating: if gpt_oss {
                        tpslab_kernels::moe::Gating::SoftmaxWeight
                    } else {
                        tpslab_kernels::moe::Gating::Softmax
                    },
                    norm: !gpt_oss,
                    scale: 0.0,
                },
                act: if gpt_oss {
                    Activation::SwigluOai
                } else {
                    Activation::Silu
                },
                x: Buf::H,
                out: Buf::Tmp,
            });
        } else {
            ops.push(Op::GatedFfn {
                gate_up: m(2 * ffn, h, false),
                down: m(h, ffn, false),
                act: if gemma {
                    Activation::GeluTanh
                } else {
                    Activation::Silu
                },
                x: Buf::H,
                out: Buf::Tmp,
            });
        }
        if gemma {
            ops.push(Op::RmsNorm {
                x: Buf::Tmp,
                w: v(h),
                eps,
                out: Buf::Tmp,
            });
        }
    }
    ops.extend([
        Op::Add {
            x: Buf::X,
            y: Buf::Tmp,
        },
        Op::GatherRmsNorm {
            x: Buf::X,
            w: v(h),
            eps,
            out: Buf::Last,
        },
        Op::Logits {
            head: m(VOCAB, h, false),
            x: Buf::Last,
            out: Buf::Logits,
        },
    ]);
    if arch == "gemma2" {
        ops.push(Op::Softcap {
            x: Buf::Logits,
            cap: 10.0,
        });
    }
    ops
}

#[test]
fn each_family_issues_its_graph_on_the_recorder_and_the_cpu() {
    let pool = ThreadPool::new(2);
    for name in GRAPHS {
        assert!(
            variants().contains(&name),
            "{name} is no longer a tiny variant"
        );
    }
    for arch in variants() {
        let model = load(arch);
        let c = &model.cfg;
        // The file resolves to the family that declares the variant.
        let declared = Family::ALL
            .iter()
            .find(|f| f.def().tiny().iter().any(|t| t.variant == arch));
        assert_eq!(Some(&c.family), declared, "{arch}");
        let mut rec = Recording::new();
        match arch::forward(c, &model.weights.shapes(), &mut rec) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        let recorded = rec.ops;
        if GRAPHS.contains(&arch) {
            assert_eq!(recorded, graph(arch, c), "{arch}: recorded");
        }

        // A prefill longer than the window, and a decode past it.
        let mut b = Batch::default();
        let prompt: Vec<u32> = (0..40).map(|i| (i * 7 % VOCAB) as u32).collect();
        b.push_seq(vec![0, 1, 2], 0, &prompt, true);
        b.push_seq(vec![3, 4, 5], 37, &[9], true);
        let mut kv = KvCache::new(c, 16, 6).unwrap();
        let mut ws = Workspace::default();
        let plain = model.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec();
        assert!(plain.iter().all(|x| x.is_finite()), "{arch}");
        let mut kv = KvCache::new(c, 16, 6).unwrap();
        let mut ws = Workspace::default();
        let mut rec = Recording::around(CpuOps::new(&pool, &b, &mut kv, &mut ws));
        match arch::forward(c, &model.weights, &mut rec) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        let (_, ops) = rec.into_parts();
        assert_eq!(ops, recorded, "{arch}: CPU");
        assert_eq!(ws.buf(Buf::Logits), plain.as_slice(), "{arch}");
    }
}

/// The CUDA path names the first op it has no kernel for (found on the recorder, before any
/// upload), and takes the families it runs.
#[cfg(feature = "cuda")]
#[test]
fn cuda_refuses_what_it_cannot_run_by_name() {
    use tpslab_engine::device::cuda::cuda_gap;
    use tpslab_kernels::cuda::{Feature, Support, Unsupported};
    let models: Vec<_> = variants().into_iter().map(|a| (a, load(a))).collect();
    // By variant name, so the registry's order does not matter.
    let gaps = |untried: bool| -> std::collections::BTreeMap<&str, Option<Unsupported>> {
        models
            .iter()
            .map(|(a, m)| (*a, cuda_gap(&m.cfg, &m.weights, untried)))
            .collect()
    };
    // Until tests/gpu/gpu-check.sh has run them, the kernels checked only on the CPU simulator
    // are refused by name.
    let gap = |f: Feature| {
        assert_eq!(f.support(), Support::Untried, "{f}");
        Some(Unsupported(f))
    };
    let listed = std::collections::BTreeMap::from([
        ("llama", gap(Feature::RopeFactors)),
        ("mistral", gap(Feature::SlidingWindow)),
        ("smollm", None),
        ("qwen2", gap(Feature::RopeScaling)),
        ("qwen3", gap(Feature::QkNorm)),
        ("gemma2", gap(Feature::ConstScale)),
        ("gemma3", gap(Feature::ConstScale)),
        ("phi3", gap(Feature::RopeFactors)),
        ("smollm3", gap(Feature::NoRope)),
        ("qwen3moe", gap(Feature::QkNorm)),
        ("mixtral", gap(Feature::Experts)),
        ("gpt-oss", gap(Feature::RopeScaling)),
    ]);
    // The variants written out here (a family added since has its own gap, whatever it is).
    let got = gaps(false);
    for (name, gap) in &listed {
        assert_eq!(got.get(name), Some(gap), "{name}");
    }
    // With them, every family runs (gpt-oss's MXFP4 experts still wait on their type's row).
    let untried = gaps(true);
    assert_eq!(untried.len(), variants().len());
    assert!(untried.values().all(Option::is_none), "{untried:?}");
}

/// The families' metadata from a hostile file is refused with a clear error before anything is
/// sized from it: a head size past the kernels', a layer pattern of the wrong length or type, an
/// unknown RoPE scaling, a zero or non-finite soft-cap and scale.
#[test]
fn hostile_family_metadata_is_refused_by_name() {
    use tpslab_engine::formats::gguf::GgufFile;
    use tpslab_engine::formats::gguf_write::copy_with_metadata;
    let dir = std::env::temp_dir().join(format!("tpslab-recipe-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("gemma2.gguf");
    let tokens = (0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect();
    write_tiny(
        "gemma2",
        &[("tokenizer.ggml.tokens".to_string(), Value::Array(tokens))],
        &src,
    )
    .unwrap();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "gemma2.attention.key_length",
            Value::U32(1 << 30),
            "key_length",
        ),
        (
            "gemma2.attention.key_length",
            Value::U32(512),
            "different sizes",
        ),
        (
            "gemma2.attention.value_length",
            Value::U32(16),
            "different sizes",
        ),
        (
            "gemma2.attention.sliding_window_pattern",
            Value::Array(vec![Value::Bool(true)]),
            "sliding_window_pattern",
        ),
        (
            "gemma2.attention.sliding_window_pattern",
            Value::Array(vec![Value::U32(1); 4]),
            "sliding_window_pattern",
        ),
        (
            "gemma2.rope.scaling.factor",
            Value::F32(f32::NAN),
            "rope.scaling.factor",
        ),
        (
            "gemma2.attn_logit_softcapping",
            Value::F32(0.0),
            "attn_logit_softcapping",
        ),
        (
            "gemma2.final_logit_softcapping",
            Value::F32(-3.0),
            "final_logit_softcapping",
        ),
        (
            "gemma2.rope.freq_base_swa",
            Value::F32(f32::INFINITY),
            "freq_base_swa",
        ),
    ];
    for (i, (key, value, says)) in cases.into_iter().enumerate() {
        let bad = dir.join(format!("bad{i}.gguf"));
        copy_with_metadata(&src, &bad, &[(key.to_string(), value)]).unwrap();
        let f = GgufFile::open(&bad).unwrap();
        let err = ModelConfig::from_gguf(&f).expect_err(key).to_string();
        assert!(err.contains(says), "{key}: {err}");
    }
    // An unknown scaling type with a factor.
    let bad = dir.join("bad-scaling.gguf");
    let set = [
        (
            "gemma2.rope.scaling.type".to_string(),
            Value::String("dynamic-ntk".into()),
        ),
        ("gemma2.rope.scaling.factor".to_string(), Value::F32(4.0)),
    ];
    copy_with_metadata(&src, &bad, &set).unwrap();
    let err = ModelConfig::from_gguf(&GgufFile::open(&bad).unwrap()).expect_err("scaling");
    assert!(err.to_string().contains("dynamic-ntk"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Granite's scales from a hostile file are refused by name: a logit scale of 0 (the logits
/// are divided by it) or not finite, a negative residual or embedding scale.
#[test]
fn hostile_granite_scales_are_refused_by_name() {
    use tpslab_engine::formats::gguf::GgufFile;
    use tpslab_engine::formats::gguf_write::copy_with_metadata;
    let dir = std::env::temp_dir().join(format!("tpslab-recipe-granite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("granite.gguf");
    let tokens = (0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect();
    write_tiny(
        "granite",
        &[("tokenizer.ggml.tokens".to_string(), Value::Array(tokens))],
        &src,
    )
    .unwrap();
    assert!(ModelConfig::from_gguf(&GgufFile::open(&src).unwrap()).is_ok());
    let cases: [(&str, Value); 4] = [
        ("granite.logit_scale", Value::F32(0.0)),
        ("granite.logit_scale", Value::F32(f32::NAN)),
        ("granite.residual_scale", Value::F32(-1.0)),
        ("granite.embedding_scale", Value::F32(f32::INFINITY)),
    ];
    for (i, (key, value)) in cases.into_iter().enumerate() {
        let bad = dir.join(format!("bad{i}.gguf"));
        copy_with_metadata(&src, &bad, &[(key.to_string(), value)]).unwrap();
        let err = ModelConfig::from_gguf(&GgufFile::open(&bad).unwrap())
            .expect_err(key)
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
