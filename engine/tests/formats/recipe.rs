//! Every registered architecture's recipe on the recording device: the ops it issues are the
//! family's graph as llama.cpp builds it (written out here from the configuration alone), and
//! the CPU device receives exactly that sequence, with the logits it computes unchanged by the
//! recording. (On a GPU machine `cuda_model.rs` holds the CUDA device to the same sequence.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tpslab_engine::device::{Workspace, cpu::CpuOps};
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::Model;
use tpslab_engine::model::arch::{self, Family};
use tpslab_engine::model::config::{Extras, ModelConfig, RopeScaling};
use tpslab_engine::model::ops::{Activation, AttnOpts, Buf, Heads, ParamShape, Rope};
use tpslab_engine::model::record::{Op, Recording};
use tpslab_engine::model::synthetic::{ArchSpec, synthetic_weights};
use tpslab_kernels::{ThreadPool, WType};

/// A two-layer model of architecture `name` with grouped-query attention, small enough to run.
fn tiny(name: &'static str, tied: bool, qkv_bias: bool) -> ArchSpec {
    let (family, a) = arch::lookup(name).unwrap();
    ArchSpec {
        name,
        config: ModelConfig {
            arch: name.into(),
            family,
            n_layers: 2,
            hidden: 64,
            ffn: 96,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            vocab: 300,
            context_len: 256,
            rope_theta: 10_000.0,
            rope_dim: 16,
            rope_style: a.rope_style,
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            extras: Extras::plain(16),
        },
        tied_embeddings: tied,
        qkv_bias,
        qk_norm: false,
        sinks_and_biases: false,
    }
}

fn matrix(ty: WType, n: usize, k: usize, bias: bool) -> ParamShape {
    ParamShape::Matrix { ty, n, k, bias }
}

/// llama.cpp's `llm_build_llama` (and `llm_build_qwen2`), op by op: per block an RMS norm,
/// Q/K/V (fused here), RoPE on Q and K with the KV store, attention, the output projection and
/// the residual add, an RMS norm and the SwiGLU FFN and its residual add; then the output norm
/// and the output projection of the sampled rows. Residual adds are fused into the next norm.
fn llama_graph(spec: &ArchSpec, ty: WType) -> Vec<Op> {
    let c = &spec.config;
    let heads = Heads {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
    };
    let rope = Rope {
        dim: c.rope_dim,
        theta: c.rope_theta,
        style: c.rope_style,
        freq_scale: 1.0,
        yarn: None,
        mscale: 1.0,
    };
    let (h, kv, eps) = (c.hidden, c.n_kv_heads * c.head_dim, c.rms_eps);
    let mut ops = vec![Op::Embed {
        table: matrix(ty, c.vocab, h, false),
        out: Buf::X,
    }];
    for layer in 0..c.n_layers {
        ops.push(if layer == 0 {
            Op::RmsNorm {
                x: Buf::X,
                w: ParamShape::Vector(h),
                eps,
                out: Buf::H,
            }
        } else {
            Op::AddRmsNorm {
                x: Buf::X,
                y: Buf::Tmp,
                w: ParamShape::Vector(h),
                eps,
                out: Buf::H,
            }
        });
        ops.extend([
            Op::Linear {
                w: matrix(ty, h + 2 * kv, h, spec.qkv_bias),
                x: Buf::H,
                y: Buf::Qkv,
            },
            Op::RopeStore {
                layer,
                qkv: Buf::Qkv,
                heads,
                rope: Some(rope),
                factors: None,
            },
            Op::Attention {
                layer,
                qkv: Buf::Qkv,
                heads,
                opts: AttnOpts::plain(c.head_dim),
                sinks: None,
                out: Buf::Attn,
            },
            Op::Linear {
                w: matrix(ty, h, h, false),
                x: Buf::Attn,
                y: Buf::Tmp,
            },
            Op::AddRmsNorm {
                x: Buf::X,
                y: Buf::Tmp,
                w: ParamShape::Vector(h),
                eps,
                out: Buf::H,
            },
            Op::GatedFfn {
                gate_up: matrix(ty, 2 * c.ffn, h, false),
                down: matrix(ty, h, c.ffn, false),
                act: Activation::Silu,
                x: Buf::H,
                out: Buf::Tmp,
            },
        ]);
    }
    ops.extend([
        Op::Add {
            x: Buf::X,
            y: Buf::Tmp,
        },
        Op::GatherRmsNorm {
            x: Buf::X,
            w: ParamShape::Vector(h),
            eps,
            out: Buf::Last,
        },
        Op::Logits {
            head: matrix(ty, c.vocab, h, false),
            x: Buf::Last,
            out: Buf::Logits,
        },
    ]);
    ops
}

/// A mixed batch: a prefill chunk of 5 tokens and a decode, both sampled.
fn batch() -> Batch {
    let mut b = Batch::default();
    b.push_seq(vec![0], 0, &[1, 2, 3, 4, 5], true);
    b.push_seq(vec![1], 3, &[7], true);
    b
}

/// Each registered architecture of the Llama family with the plain Llama block, tied and untied,
/// with and without Q/K/V biases, in two precisions (what each family adds is checked on its
/// own files in `recipe_files.rs`).
fn cases() -> Vec<(ArchSpec, WType)> {
    let mut v = Vec::new();
    let llama_block = arch::archs().filter(|(f, _)| !matches!(*f, Family::GEMMA | Family::GPT_OSS));
    for (_, a) in llama_block {
        for (tied, bias) in [(true, false), (false, true)] {
            for ty in [WType::F32, WType::Q8_0] {
                v.push((tiny(a.name, tied, bias), ty));
            }
        }
    }
    v
}

#[test]
fn every_architecture_issues_its_family_graph() {
    for (spec, ty) in cases() {
        let w = synthetic_weights(&spec, ty, 1, 1).unwrap();
        let mut rec = Recording::new();
        match arch::forward(&spec.config, &w.shapes(), &mut rec) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        assert_eq!(rec.ops, llama_graph(&spec, ty), "{} {ty:?}", spec.name);
    }
}

#[test]
fn the_cpu_device_receives_the_recorded_sequence_and_computes_the_same_logits() {
    let pool = ThreadPool::new(2);
    for (spec, ty) in cases() {
        let cfg = spec.config.clone();
        let weights = synthetic_weights(&spec, ty, 2, 1).unwrap();
        let model = Model { cfg, weights };
        let b = batch();

        let mut kv = KvCache::new(&model.cfg, 16, 4).unwrap();
        let mut ws = Workspace::default();
        let plain = model.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec();
        assert_eq!(plain.len(), 2 * model.cfg.vocab);
        assert!(plain.iter().all(|v| v.is_finite()));

        let mut kv = KvCache::new(&model.cfg, 16, 4).unwrap();
        let mut ws = Workspace::default();
        let mut rec = Recording::around(CpuOps::new(&pool, &b, &mut kv, &mut ws));
        match arch::forward(&model.cfg, &model.weights, &mut rec) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        let (_, ops) = rec.into_parts();
        assert_eq!(ops, llama_graph(&spec, ty), "{} {ty:?}", spec.name);
        assert_eq!(
            ws.buf(Buf::Logits),
            plain.as_slice(),
            "{} {ty:?}",
            spec.name
        );
    }
}
