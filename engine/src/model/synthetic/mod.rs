//! Synthetic weights (vLLM's "dummy" load format): a model of a known architecture's exact shape
//! with seeded random weights in a chosen precision, so speed can be measured where no model file
//! can travel. The numbers are noise; the shapes, byte sizes, block formats and kernels are real.
//!
//! Every matrix is generated directly in its block format, in parallel, in place: no f32 copy of
//! the model is ever made (an 8B model in F16 is 16 GB). Each tensor is cut into fixed chunks of
//! blocks and each chunk has its own generator seeded from (seed, tensor, chunk), so the bytes
//! depend on the seed only, never on the thread count.
//!
//! Modules: this file, the architectures and the model built from them; `blocks`, the random
//! bytes of every weight type's blocks.

use std::path::PathBuf;

use tpslab_kernels::WType;

use crate::model::LoadedModel;
use crate::model::Model;
use crate::model::arch::{Family, KnownShape};
use crate::model::config::{Extras, ModelConfig, MoeConfig, RopeScaling};
use crate::model::precision::Precision;
pub use crate::model::precision::matrix_type;
use crate::model::weights::{Expert, Ffn, LayerWeights, Linear, MoeWeights, Weights};
use crate::text::chat::ChatTemplate;
use crate::text::tokenizer::{PreTokenizerKind, Tokenizer, TokenizerConfig, TokenizerError};

mod blocks;

use blocks::{Rng, f32_bytes, fill_blocks, mix};

/// What a synthetic model's path starts with ("synthetic:llama-3-8b").
pub const SYNTHETIC_PREFIX: &str = "synthetic:";

#[derive(Debug, thiserror::Error)]
pub enum SyntheticError {
    #[error("unknown synthetic architecture '{name}' (known: {known})")]
    Arch { name: String, known: String },
    #[error("{what} has {k} inputs, not a multiple of the {ty} block of {block}")]
    Shape {
        what: String,
        k: usize,
        ty: WType,
        block: usize,
    },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// A known architecture: its shape, and the two things [`ModelConfig`] does not say.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchSpec {
    pub name: &'static str,
    pub config: ModelConfig,
    /// The output projection is the embedding (no `output.weight`).
    pub tied_embeddings: bool,
    /// Q, K and V have biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head Q and K norms (Qwen3).
    pub qk_norm: bool,
    /// Biases on the attention output, the router and the experts, and a sink per head
    /// (gpt-oss).
    pub sinks_and_biases: bool,
}

/// Every known shape, from the families that list them (`FamilyDef::known_shapes`), in the
/// registry's order.
fn table() -> impl Iterator<Item = (Family, &'static KnownShape)> {
    crate::model::arch::listed(|d| d.known_shapes())
}

/// The names [`arch`] knows, in table order.
pub fn known_archs() -> Vec<&'static str> {
    table().map(|(_, r)| r.name).collect()
}

/// The architecture called `name` (case-insensitive), or an error listing the known ones.
pub fn arch(name: &str) -> Result<ArchSpec, SyntheticError> {
    let wanted = name.trim().to_ascii_lowercase();
    let (family, r) =
        table()
            .find(|(_, r)| r.name == wanted)
            .ok_or_else(|| SyntheticError::Arch {
                name: name.to_string(),
                known: known_archs().join(", "),
            })?;
    // The RoPE layout is the architecture's (one owner: its family).
    let rope_style = crate::model::arch::lookup(r.arch)
        .filter(|(f, _)| *f == family)
        .map(|(_, a)| a.rope_style)
        .ok_or_else(|| SyntheticError::Arch {
            name: r.arch.to_string(),
            known: crate::model::arch::names(),
        })?;
    let extras = Extras {
        moe: r.experts.map(|(n_expert, n_used, ffn_exp)| MoeConfig {
            n_expert,
            ffn_exp,
            router: family.def().experts(r.arch).router(n_used),
        }),
        ..Extras::plain(r.head_dim)
    };
    let mut config = ModelConfig {
        arch: r.arch.into(),
        family,
        n_layers: r.n_layers,
        hidden: r.hidden,
        ffn: r.ffn,
        n_heads: r.n_heads,
        n_kv_heads: r.n_kv_heads,
        head_dim: r.head_dim,
        vocab: r.vocab,
        context_len: r.context_len,
        rope_theta: r.rope_theta,
        rope_dim: r.head_dim,
        rope_style,
        rope_scaling: RopeScaling::None,
        rms_eps: r.rms_eps,
        extras,
    };
    family.def().known_settings(&mut config);
    Ok(ArchSpec {
        name: r.name,
        config,
        tied_embeddings: r.tied_embeddings,
        qkv_bias: r.qkv_bias,
        qk_norm: r.qk_norm,
        sinks_and_biases: r.sinks_and_biases,
    })
}

/// Tensor ids for the generator seeds (stable: changing them changes every synthetic model).
const ID_EMBED: u64 = 0;
const ID_LM_HEAD: u64 = 1;
fn layer_id(layer: usize, part: u64) -> u64 {
    16 + layer as u64 * 8 + part
}
/// Expert matrices' ids, apart from the dense ones (part 0: gate-up, 1: down).
fn expert_id(layer: usize, expert: usize, part: u64) -> u64 {
    (1 << 40) + (layer as u64 * 4096 + expert as u64) * 2 + part
}

/// All the weights of `spec` in `precision` (see [`matrix_type`] for K-quant fallbacks), random
/// but fixed by `seed`, generated on `threads` threads (0 = one per core). Norms are 1.0; Q/K/V
/// biases (Qwen2) are small; tied architectures get no `lm_head`.
pub fn synthetic_weights(
    spec: &ArchSpec,
    precision: WType,
    seed: u64,
    threads: usize,
) -> Result<Weights, SyntheticError> {
    let c = &spec.config;
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
        n => n,
    };
    let (h, q, kv, ffn) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
    let gpt_oss = spec.sinks_and_biases;
    // Experts in the type the family's released files keep them in (gpt-oss: MXFP4).
    let expert_type = c.family.def().released_expert_type().unwrap_or(precision);
    let small = |n: usize, id: u64| -> Vec<f32> {
        let mut rng = Rng::new(mix(seed, id));
        (0..n).map(|_| rng.uniform()).collect()
    };
    let typed = |ty: WType, what: &str, n: usize, k: usize, id: u64| {
        let ty = matrix_type(ty, k);
        if !k.is_multiple_of(ty.block_size()) {
            return Err(SyntheticError::Shape {
                what: what.into(),
                k,
                ty,
                block: ty.block_size(),
            });
        }
        let mut data = vec![0u8; n * ty.row_bytes(k)];
        fill_blocks(ty, &mut data, mix(seed, id), threads);
        Ok(Linear::new(ty, n, k, data))
    };
    let matrix = |what: &str, n: usize, k: usize, id: u64| typed(precision, what, n, k, id);
    // An expert's matrix, with gpt-oss's bias.
    let expert = |what: &str, n: usize, k: usize, id: u64| -> Result<Linear, SyntheticError> {
        let mut m = typed(expert_type, what, n, k, id)?;
        m.bias = gpt_oss.then(|| small(n, id ^ (1 << 62)));
        Ok(m)
    };
    let embed = matrix("token_embd", c.vocab, h, ID_EMBED)?;
    let lm_head = match spec.tied_embeddings {
        true => None,
        false => Some(matrix("output", c.vocab, h, ID_LM_HEAD)?),
    };
    let qk_norm = spec.qk_norm;
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let mut wqkv = matrix("attn_qkv", q + 2 * kv, h, layer_id(i, 0))?;
        if spec.qkv_bias {
            wqkv.bias = Some(small(wqkv.n, layer_id(i, 4)));
        }
        let mut wo = matrix("attn_output", h, q, layer_id(i, 1))?;
        wo.bias = gpt_oss.then(|| small(h, layer_id(i, 6)));
        layers.push(LayerWeights {
            attn_norm: vec![1.0; h],
            wqkv,
            // Per-head Q and K norms where the shape has them (Qwen3-MoE).
            q_norm: qk_norm.then(|| vec![1.0; c.head_dim]),
            k_norm: qk_norm.then(|| vec![1.0; c.head_dim]),
            attn_sinks: gpt_oss.then(|| small(c.n_heads, layer_id(i, 7))),
            wo,
            post_attn_norm: None,
            ffn_norm: vec![1.0; h],
            ffn: match &c.extras.moe {
                None => Ffn::Dense {
                    gate_up: matrix("ffn_gate_up", 2 * ffn, h, layer_id(i, 2))?,
                    down: matrix("ffn_down", h, ffn, layer_id(i, 3))?,
                },
                Some(m) => {
                    let mut experts = Vec::with_capacity(m.n_expert);
                    for e in 0..m.n_expert {
                        experts.push(Expert {
                            gate_up: expert(
                                "ffn_gate_up_exps",
                                2 * m.ffn_exp,
                                h,
                                expert_id(i, e, 0),
                            )?,
                            down: expert("ffn_down_exps", h, m.ffn_exp, expert_id(i, e, 1))?,
                        });
                    }
                    Ffn::Moe(MoeWeights {
                        // The router stays F32, as llama.cpp's quantizer keeps ffn_gate_inp.
                        router: Linear {
                            bias: gpt_oss.then(|| small(m.n_expert, layer_id(i, 5) ^ (1 << 62))),
                            ..Linear::new(
                                WType::F32,
                                m.n_expert,
                                h,
                                f32_bytes(m.n_expert * h, mix(seed, layer_id(i, 5))),
                            )
                        },
                        experts,
                        rule: m.router,
                    })
                }
            },
            post_ffn_norm: None,
        });
    }
    Ok(Weights {
        embed,
        layers,
        out_norm: vec![1.0; h],
        lm_head,
        rope_factors: None,
    }
    .into_arena())
}

/// GPT-2's byte-level alphabet: the vocabulary string of each byte.
fn byte_level_char(b: u8) -> char {
    let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
    if printable {
        return b as char;
    }
    // The other 68 bytes are shifted, in order, to U+0100 and up.
    let rank = (0..b)
        .filter(|&x| !matches!(x, 33..=126 | 161..=172 | 174..=255))
        .count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// A tokenizer for a random model of `vocab` tokens: the 256 byte tokens (so any text encodes,
/// one token per byte) and placeholders `<synthetic_N>` for the rest. No merges, no BOS and no
/// end-of-sequence token, so a random model never stops early.
pub fn synthetic_tokenizer(vocab: usize) -> Result<Tokenizer, SyntheticError> {
    const TYPE_NORMAL: u64 = 1;
    const TYPE_BYTE: u64 = 6;
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| byte_level_char(b).to_string())
        .collect();
    let mut types = vec![TYPE_BYTE; tokens.len()];
    tokens.extend((tokens.len()..vocab).map(|i| format!("<synthetic_{i}>")));
    types.resize(tokens.len(), TYPE_NORMAL);
    Ok(Tokenizer::from_config(TokenizerConfig {
        tokens,
        types,
        merges: Vec::new(),
        pre: PreTokenizerKind::Gpt2,
        bos: None,
        eos: None,
        extra_stop: Vec::new(),
        add_bos: false,
    })?)
}

/// `n` token ids drawn uniformly from `0..vocab`, fixed by `seed`: the prompts of benchmarks on
/// a synthetic model (its tokenizer has no real text to cut them from).
pub fn random_tokens(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(mix(seed, u64::MAX));
    let vocab = vocab.max(1) as u64;
    // Multiply-shift: uniform enough for prompts, and no division per token.
    (0..n)
        .map(|_| (((rng.next() >> 32) * vocab) >> 32) as u32)
        .collect()
}

impl LoadedModel {
    /// A model of architecture `arch_name` (see [`known_archs`]) with random weights in `precision`,
    /// fixed by `seed`, built on `threads` threads (0 = one per core). Its path reads
    /// `synthetic:ARCH`; its chat template is ChatML over byte tokens.
    pub fn synthetic(
        arch_name: &str,
        precision: WType,
        seed: u64,
        threads: usize,
    ) -> Result<Self, SyntheticError> {
        let spec = arch(arch_name)?;
        let weights = synthetic_weights(&spec, precision, seed, threads)?;
        let tokenizer = synthetic_tokenizer(spec.config.vocab)?;
        Ok(Self {
            path: PathBuf::from(format!("{SYNTHETIC_PREFIX}{}", spec.name)),
            precision: Precision::built(&spec.config, precision),
            model: Model {
                cfg: spec.config,
                weights,
            },
            tokenizer,
            template: ChatTemplate::chatml(),
        })
    }

    /// Whether this model was built by [`LoadedModel::synthetic`] (random weights).
    pub fn is_synthetic(&self) -> bool {
        self.path
            .to_str()
            .is_some_and(|p| p.starts_with(SYNTHETIC_PREFIX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_match_gpt2() {
        assert_eq!(byte_level_char(b' '), 'Ġ');
        assert_eq!(byte_level_char(b'\n'), 'Ċ');
        assert_eq!(byte_level_char(b'a'), 'a');
        let all: std::collections::HashSet<char> = (0..=255).map(byte_level_char).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn random_tokens_stay_in_the_vocabulary() {
        let t = random_tokens(1000, 10_000, 3);
        assert!(t.iter().all(|&t| t < 1000));
        assert!(t.iter().any(|&t| t > 900) && t.iter().any(|&t| t < 100));
        assert_eq!(t, random_tokens(1000, 10_000, 3));
    }
}
