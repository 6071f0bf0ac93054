//! Synthetic weights (vLLM's "dummy" load format): a model of a known architecture's exact shape
//! with seeded random weights in a chosen precision, so speed can be measured where no model file
//! can travel. The numbers are noise; the shapes, byte sizes, block formats and kernels are real.
//!
//! Every matrix is generated directly in its block format, in parallel, in place: no f32 copy of
//! the model is ever made (an 8B model in F16 is 16 GB). Each tensor is cut into fixed chunks of
//! blocks and each chunk has its own generator seeded from (seed, tensor, chunk), so the bytes
//! depend on the seed only, never on the thread count.

use std::path::PathBuf;
use std::sync::OnceLock;

use tpslab_kernels::WType;

use crate::model::LoadedModel;
use crate::model::Model;
use crate::model::config::{Extras, ModelConfig, MoeConfig, RopeScaling, router_rule};
use crate::model::precision::Precision;
pub use crate::model::precision::matrix_type;
use crate::model::weights::{Expert, Ffn, LayerWeights, Linear, MoeWeights, Weights};
use crate::text::chat::ChatTemplate;
use crate::text::tokenizer::{PreTokenizerKind, Tokenizer, TokenizerConfig, TokenizerError};

/// What a synthetic model's path starts with ("synthetic:llama-3-8b").
pub const SYNTHETIC_PREFIX: &str = "synthetic:";

/// Spread of the random weights: uniform on [-A, A] has a standard deviation of 0.02, the usual
/// initializer scale, so activations stay finite through every layer.
const A: f32 = 0.02 * 1.732_050_8;

/// Bytes of blocks per generator chunk (rounded down to whole blocks): the unit of parallel work.
const CHUNK_BYTES: usize = 256 << 10;

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
}

/// One row of the architecture table.
struct Row {
    name: &'static str,
    arch: &'static str,
    hidden: usize,
    ffn: usize,
    n_layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    context_len: usize,
    rope_theta: f32,
    rms_eps: f32,
    tied_embeddings: bool,
    qkv_bias: bool,
    /// A mixture of experts: (experts, used per token, expert FFN width).
    experts: Option<(usize, usize, usize)>,
}

/// The shapes of the real models (from their `config.json` / GGUF metadata).
const TABLE: [Row; 6] = [
    Row {
        name: "smollm2-135m",
        arch: "llama",
        hidden: 576,
        ffn: 1536,
        n_layers: 30,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        vocab: 49152,
        context_len: 8192,
        rope_theta: 100_000.0,
        rms_eps: 1e-5,
        tied_embeddings: true,
        qkv_bias: false,
        experts: None,
    },
    Row {
        name: "llama-3.2-1b",
        arch: "llama",
        hidden: 2048,
        ffn: 8192,
        n_layers: 16,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 64,
        vocab: 128_256,
        context_len: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied_embeddings: true,
        qkv_bias: false,
        experts: None,
    },
    Row {
        name: "qwen2.5-0.5b",
        arch: "qwen2",
        hidden: 896,
        ffn: 4864,
        n_layers: 24,
        n_heads: 14,
        n_kv_heads: 2,
        head_dim: 64,
        vocab: 151_936,
        context_len: 32_768,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: true,
        qkv_bias: true,
        experts: None,
    },
    Row {
        name: "llama-3-8b",
        arch: "llama",
        hidden: 4096,
        ffn: 14336,
        n_layers: 32,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 128_256,
        context_len: 8192,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied_embeddings: false,
        qkv_bias: false,
        experts: None,
    },
    // Qwen3-30B-A3B: 128 experts of width 768, 8 routed per token (about 3B of 30B active).
    Row {
        name: "qwen3-30b-a3b",
        arch: "qwen3moe",
        hidden: 2048,
        ffn: 6144,
        n_layers: 48,
        n_heads: 32,
        n_kv_heads: 4,
        head_dim: 128,
        vocab: 151_936,
        context_len: 40_960,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: false,
        experts: Some((128, 8, 768)),
    },
    // gpt-oss-20b: 32 experts of width 2880, 4 routed per token (about 3.6B of 21B active),
    // 64 query heads of 64 over 8 K/V heads, a 128-token window on every other layer, YaRN 32
    // over a trained 4096, biases everywhere and a sink per head; experts in MXFP4 whatever
    // the precision asked, as the released files have them.
    Row {
        name: "gpt-oss-20b",
        arch: "gpt-oss",
        hidden: 2880,
        ffn: 2880,
        n_layers: 24,
        n_heads: 64,
        n_kv_heads: 8,
        head_dim: 64,
        vocab: 201_088,
        context_len: 131_072,
        rope_theta: 150_000.0,
        rms_eps: 1e-5,
        tied_embeddings: false,
        qkv_bias: true,
        experts: Some((32, 4, 2880)),
    },
];

/// gpt-oss's trained context under YaRN, its scaling factor and its window.
const GPT_OSS_YARN: (f32, usize) = (32.0, 4096);
const GPT_OSS_WINDOW: usize = 128;

/// The names [`arch`] knows, in table order.
pub fn known_archs() -> Vec<&'static str> {
    TABLE.iter().map(|r| r.name).collect()
}

/// The architecture called `name` (case-insensitive), or an error listing the known ones.
pub fn arch(name: &str) -> Result<ArchSpec, SyntheticError> {
    let wanted = name.trim().to_ascii_lowercase();
    let r = TABLE
        .iter()
        .find(|r| r.name == wanted)
        .ok_or_else(|| SyntheticError::Arch {
            name: name.to_string(),
            known: known_archs().join(", "),
        })?;
    // The recipe and RoPE layout are the architecture's (one owner: `model::arch`).
    let known = crate::model::arch::lookup(r.arch).ok_or_else(|| SyntheticError::Arch {
        name: r.arch.to_string(),
        known: crate::model::arch::names(),
    })?;
    let gpt_oss = known.family == crate::model::config::Family::GptOss;
    let mut extras = Extras {
        moe: r.experts.map(|(n_expert, n_used, ffn_exp)| MoeConfig {
            n_expert,
            ffn_exp,
            router: router_rule(r.arch, n_used),
        }),
        ..Extras::plain(r.head_dim)
    };
    let mut rope_scaling = RopeScaling::None;
    if gpt_oss {
        // As `config::extras` reads a gpt-oss file: the even layers slide, keeping the base
        // and the scaling.
        extras.window = Some(GPT_OSS_WINDOW);
        extras.swa_layers = (0..r.n_layers).map(|i| i % 2 == 0).collect();
        extras.rope_theta_swa = r.rope_theta;
        extras.rope_scaled_swa = true;
        let (factor, orig_ctx) = GPT_OSS_YARN;
        rope_scaling = RopeScaling::Yarn { factor, orig_ctx };
    }
    Ok(ArchSpec {
        name: r.name,
        config: ModelConfig {
            arch: r.arch.into(),
            family: known.family,
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
            rope_style: known.rope_style,
            rope_scaling,
            rms_eps: r.rms_eps,
            extras,
        },
        tied_embeddings: r.tied_embeddings,
        qkv_bias: r.qkv_bias,
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
    let gpt_oss = c.family == crate::model::config::Family::GptOss;
    // gpt-oss's experts are MXFP4 in every released file.
    let expert_type = if gpt_oss { WType::MXFP4 } else { precision };
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
    let qk_norm = c.arch == "qwen3moe" && c.extras.moe.is_some();
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
            // Qwen3-MoE's experts come with per-head Q and K norms (the table's only QK-norm
            // row; a spec without experts stays a plain Llama block).
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

/// splitmix64's finalizer: a strong 64-bit mix, used to derive seeds.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` floats uniform on [-A, A] as F32 bytes, fixed by `seed` (the router of a synthetic
/// mixture of experts: small, so kept in F32 as in real files).
fn f32_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..n).flat_map(|_| rng.uniform().to_le_bytes()).collect()
}

/// splitmix64: one add and a mix per 64 random bits; plenty for noise weights.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0, 0)
    }

    /// Uniform on [-A, A].
    fn uniform(&mut self) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * A
    }

    /// Fills `out` with random bytes, eight per draw.
    fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let n = rest.len();
            rest.copy_from_slice(&self.next().to_le_bytes()[..n]);
        }
    }
}

/// Fills `data` (whole blocks of `ty`) chunk by chunk on `threads` threads.
fn fill_blocks(ty: WType, data: &mut [u8], seed: u64, threads: usize) {
    let ts = ty.type_size();
    let chunk = (CHUNK_BYTES / ts).max(1) * ts;
    let mut chunks: Vec<(usize, &mut [u8])> = data.chunks_mut(chunk).enumerate().collect();
    let per = chunks.len().div_ceil(threads.max(1)).max(1);
    let work = |part: &mut [(usize, &mut [u8])]| {
        for (i, c) in part.iter_mut() {
            fill_chunk(ty, c, &mut Rng::new(mix(seed, *i as u64)));
        }
    };
    if chunks.len() <= per {
        work(&mut chunks);
        return;
    }
    std::thread::scope(|s| {
        for part in chunks.chunks_mut(per) {
            s.spawn(move || work(part));
        }
    });
}

fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// 16 block scales from `base` to 15% below it, picked by 4 random bits: blocks differ a little,
/// as real ones do.
fn scale_table(base: f32) -> [[u8; 2]; 16] {
    std::array::from_fn(|j| f16_bits(base * (1.0 - 0.15 * j as f32 / 15.0)))
}

/// Every 16-bit pattern's value on a uniform grid over [-A, A], as F16 and as BF16 bits: one
/// table lookup per element.
fn half_table(ty: WType) -> &'static [u16] {
    static F16: OnceLock<Vec<u16>> = OnceLock::new();
    static BF16: OnceLock<Vec<u16>> = OnceLock::new();
    let grid = |i: usize| -A + (i as f32 + 0.5) * (2.0 * A / 65536.0);
    match ty {
        WType::BF16 => BF16.get_or_init(|| {
            (0..1 << 16)
                .map(|i| half::bf16::from_f32(grid(i)).to_bits())
                .collect()
        }),
        _ => F16.get_or_init(|| {
            (0..1 << 16)
                .map(|i| half::f16::from_f32(grid(i)).to_bits())
                .collect()
        }),
    }
}

/// Fills `out` (whole blocks of `ty`) with random weights of spread about [-A, A].
fn fill_chunk(ty: WType, out: &mut [u8], rng: &mut Rng) {
    match ty {
        WType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.uniform().to_le_bytes());
            }
        }
        WType::F16 | WType::BF16 => {
            let table = half_table(ty);
            for c in out.chunks_mut(8) {
                let r = rng.next();
                for (j, e) in c.chunks_exact_mut(2).enumerate() {
                    let v = table[(r >> (16 * j)) as usize & 0xffff];
                    e.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        // d * q, q in [-127, 127].
        WType::Q8_0 => {
            let d = scale_table(A / 127.0);
            for b in out.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&d[rng.next() as usize & 15]);
                rng.fill(&mut b[2..]);
                for q in &mut b[2..] {
                    // -128 has no positive twin; ggml's quantizer never writes it.
                    if *q == 0x80 {
                        *q = 0x81;
                    }
                }
            }
        }
        // d * (q - 8), q in 0..16; d of either sign (as ggml's quantizer writes it), so the
        // values are centred.
        WType::Q4_0 => {
            let d = scale_table(A / 8.0);
            for b in out.chunks_exact_mut(18) {
                let r = rng.next();
                b[..2].copy_from_slice(&d[r as usize & 15]);
                b[1] |= (r as u8) & 0x80;
                rng.fill(&mut b[2..]);
            }
        }
        // d * q + m, q in 0..16, centred: m = -7.5 d.
        WType::Q4_1 => {
            let base = 2.0 * A / 15.0;
            let d = scale_table(base);
            let m: [[u8; 2]; 16] =
                std::array::from_fn(|j| f16_bits(-7.5 * base * (1.0 - 0.15 * j as f32 / 15.0)));
            for b in out.chunks_exact_mut(20) {
                let j = rng.next() as usize & 15;
                b[..2].copy_from_slice(&d[j]);
                b[2..4].copy_from_slice(&m[j]);
                rng.fill(&mut b[4..]);
            }
        }
        WType::Q4K => fill_q45k(out, rng, 144, 15.0),
        WType::Q5K => fill_q45k(out, rng, 176, 31.0),
        WType::Q6K => fill_q6k(out, rng),
        WType::Q5_0 | WType::Q5_1 | WType::IQ4NL => fill_32(ty, out, rng),
        WType::Q2K | WType::Q3K | WType::IQ4XS => fill_lowbit_k(ty, out, rng),
        // x = 2^(e - 128) * grid[q]: random indices (the grid's spread is 5.85) at e = 119 or
        // 120 (2^-9 or 2^-8): a spread near 0.018, |x| up to 0.047.
        WType::MXFP4 => {
            for b in out.chunks_exact_mut(17) {
                rng.fill(b);
                b[0] = 119 + (b[0] & 1);
            }
        }
    }
}

/// ggml `block_q5_0` (x = d * (q - 16)), `block_q5_1` (x = d * q + m, m = -15.5 d) and
/// `block_iq4_nl` (x = d * grid[q]): random levels, d of either sign where the type allows,
/// putting x in about [-A, A].
fn fill_32(ty: WType, out: &mut [u8], rng: &mut Rng) {
    let ts = ty.type_size();
    let base = match ty {
        WType::Q5_0 => A / 16.0,
        WType::Q5_1 => 2.0 * A / 31.0,
        _ => A / 127.0,
    };
    let d = scale_table(base);
    let m: [[u8; 2]; 16] =
        std::array::from_fn(|j| f16_bits(-15.5 * base * (1.0 - 0.15 * j as f32 / 15.0)));
    for b in out.chunks_exact_mut(ts) {
        rng.fill(b);
        let r = rng.next();
        let j = r as usize & 15;
        b[..2].copy_from_slice(&d[j]);
        if ty == WType::Q5_1 {
            b[2..4].copy_from_slice(&m[j]);
        } else {
            b[1] |= (r >> 8) as u8 & 0x80;
        }
    }
}

/// A random scale magnitude in `lo..lo + 8` or `lo..lo + 16` with a random sign, as a 6-bit
/// field offset by 32.
fn signed6(r: u8, lo: u8, span: u8) -> u8 {
    let mag = lo + (r & (span - 1));
    if r & 0x80 != 0 {
        32 - mag
    } else {
        32 + mag.min(31)
    }
}

/// ggml `block_q2_K` (x = d * sc * q - dmin * m, with m = sc and dmin = 1.5 d so each
/// sub-block is centred), `block_q3_K` (x = d * s * q, q in -4..=3, |s| in 16..32 of either
/// sign) and `block_iq4_xs` (x = d * s * grid[q], |s| in 24..32 of either sign): random levels,
/// x in about [-A, A].
fn fill_lowbit_k(ty: WType, out: &mut [u8], rng: &mut Rng) {
    let ts = ty.type_size();
    for b in out.chunks_exact_mut(ts) {
        rng.fill(b);
        let mut raw = [0u8; 16];
        rng.fill(&mut raw);
        match ty {
            WType::Q2K => {
                for (s, r) in b[..16].iter_mut().zip(raw) {
                    let sc = 8 + (r & 7);
                    *s = sc | (sc << 4);
                }
                b[80..82].copy_from_slice(&f16_bits(A / 22.5));
                b[82..84].copy_from_slice(&f16_bits(1.5 * A / 22.5));
            }
            WType::Q3K => {
                let sc = &mut b[96..108];
                sc.fill(0);
                for (j, &r) in raw.iter().enumerate() {
                    let v = signed6(r, 16, 16);
                    if j < 8 {
                        sc[j] = v & 0xf;
                    } else {
                        sc[j - 8] |= (v & 0xf) << 4;
                    }
                    sc[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
                }
                b[108..110].copy_from_slice(&f16_bits(A / 124.0));
            }
            _ => {
                let mut sh = 0u16;
                for (ib, &r) in raw.iter().take(8).enumerate() {
                    let v = signed6(r, 24, 8);
                    if ib % 2 == 0 {
                        b[4 + ib / 2] = v & 0xf;
                    } else {
                        b[4 + ib / 2] |= (v & 0xf) << 4;
                    }
                    sh |= ((v >> 4) as u16) << (2 * ib);
                }
                b[2..4].copy_from_slice(&sh.to_le_bytes());
                b[..2].copy_from_slice(&f16_bits(A / (31.0 * 127.0)));
            }
        }
    }
}

/// ggml `block_q4_K` / `block_q5_K` (`ts` bytes, levels 0..=`qmax`): x = d * sc * q - dmin * m
/// per 32-element sub-block, with 6-bit sc and m in 40..56 packed as `get_scale_min_k4` reads
/// them; d and dmin put x in about [-A, A]; the level bits (Q5_K's qh too) are random.
fn fill_q45k(out: &mut [u8], rng: &mut Rng, ts: usize, qmax: f32) {
    let d = f16_bits(2.0 * A / (qmax * 48.0));
    let dmin = f16_bits(A / 48.0);
    for b in out.chunks_exact_mut(ts) {
        b[..2].copy_from_slice(&d);
        b[2..4].copy_from_slice(&dmin);
        let mut raw = [0u8; 16];
        rng.fill(&mut raw);
        let (sc, m): ([u8; 8], [u8; 8]) = (
            std::array::from_fn(|j| 40 + (raw[j] & 15)),
            std::array::from_fn(|j| 40 + (raw[8 + j] & 15)),
        );
        let q = &mut b[4..16];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
        }
        rng.fill(&mut b[16..]);
    }
}

/// ggml `block_q6_K`: x = d * sc * (q - 32), q 6 bits from 128 bytes of low nibbles and 64 of
/// high pairs, sc an i8 per 16 elements (96..128, either sign); d puts x in about [-A, A].
fn fill_q6k(out: &mut [u8], rng: &mut Rng) {
    let d = f16_bits(A / (32.0 * 112.0));
    for b in out.chunks_exact_mut(210) {
        rng.fill(&mut b[..208]);
        for s in &mut b[192..208] {
            let mag = 96 + (*s & 31) as i8;
            *s = if *s & 0x80 != 0 { -mag } else { mag } as u8;
        }
        b[208..].copy_from_slice(&d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every precision's bytes decode to finite values centred on 0 with a spread near 0.02.
    #[test]
    fn blocks_decode_to_small_centred_values() {
        for ty in WType::ALL {
            let k = 4096;
            let mut data = vec![0u8; 16 * ty.row_bytes(k)];
            fill_blocks(ty, &mut data, 7, 2);
            let mut row = vec![0f32; k];
            let (mut sum, mut sq, mut max) = (0f64, 0f64, 0f32);
            for r in data.chunks(ty.row_bytes(k)) {
                tpslab_kernels::dequantize_row(ty, r, &mut row);
                for &x in &row {
                    assert!(x.is_finite(), "{ty:?}");
                    sum += x as f64;
                    sq += (x * x) as f64;
                    max = max.max(x.abs());
                }
            }
            let n = (16 * k) as f64;
            let (mean, std) = (sum / n, (sq / n).sqrt());
            assert!(mean.abs() < 0.002, "{ty:?}: mean {mean}");
            assert!((0.012..0.028).contains(&std), "{ty:?}: std {std}");
            assert!(max < 0.06, "{ty:?}: max {max}");
        }
    }

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
