//! The quantization presets users know ([`Preset`]: llama.cpp's file types Q8_0, Q6_K, Q5_K_M,
//! Q4_K_M, Q3_K_M, Q2_K, IQ4_XS, ...) and the type each tensor gets under one
//! ([`tensor_types`]): llama.cpp's `llama_tensor_get_type` without an importance matrix, for
//! the dense models this engine runs.

use std::fmt;
use std::str::FromStr;

use tpslab_kernels::{UnknownWType, WType};

use crate::formats::gguf::{GgufFile, TensorInfo};

/// A target of `tpslab quantize`: a llama.cpp file type (`llama_ftype`), named as
/// `llama-quantize` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    F32,
    F16,
    BF16,
    Q8_0,
    Q6K,
    Q5KM,
    Q5KS,
    Q5_1,
    Q5_0,
    Q4KM,
    Q4KS,
    Q4_1,
    Q4_0,
    IQ4XS,
    IQ4NL,
    Q3KM,
    Q2K,
}

impl Preset {
    /// Every preset, from the most bits to the fewest (the order the wizard lists them in).
    pub const ALL: [Preset; 17] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q6K,
        Self::Q5KM,
        Self::Q5KS,
        Self::Q5_1,
        Self::Q5_0,
        Self::Q4KM,
        Self::Q4KS,
        Self::Q4_1,
        Self::Q4_0,
        Self::IQ4XS,
        Self::IQ4NL,
        Self::Q3KM,
        Self::Q2K,
    ];

    /// llama.cpp's name ("Q4_K_M").
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q6K => "Q6_K",
            Self::Q5KM => "Q5_K_M",
            Self::Q5KS => "Q5_K_S",
            Self::Q5_1 => "Q5_1",
            Self::Q5_0 => "Q5_0",
            Self::Q4KM => "Q4_K_M",
            Self::Q4KS => "Q4_K_S",
            Self::Q4_1 => "Q4_1",
            Self::Q4_0 => "Q4_0",
            Self::IQ4XS => "IQ4_XS",
            Self::IQ4NL => "IQ4_NL",
            Self::Q3KM => "Q3_K_M",
            Self::Q2K => "Q2_K",
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub const fn file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 7,
            Self::Q5_0 => 8,
            Self::Q5_1 => 9,
            Self::Q2K => 10,
            Self::Q3KM => 12,
            Self::Q4KS => 14,
            Self::Q4KM => 15,
            Self::Q5KS => 16,
            Self::Q5KM => 17,
            Self::Q6K => 18,
            Self::IQ4NL => 25,
            Self::IQ4XS => 30,
            Self::BF16 => 32,
        }
    }

    /// The type most matrices get (`llama_ftype_get_default_type`).
    pub const fn default_type(self) -> WType {
        match self {
            Self::F32 => WType::F32,
            Self::F16 => WType::F16,
            Self::BF16 => WType::BF16,
            Self::Q8_0 => WType::Q8_0,
            Self::Q6K => WType::Q6K,
            Self::Q5KM | Self::Q5KS => WType::Q5K,
            Self::Q5_1 => WType::Q5_1,
            Self::Q5_0 => WType::Q5_0,
            Self::Q4KM | Self::Q4KS => WType::Q4K,
            Self::Q4_1 => WType::Q4_1,
            Self::Q4_0 => WType::Q4_0,
            Self::IQ4XS => WType::IQ4XS,
            Self::IQ4NL => WType::IQ4NL,
            Self::Q3KM => WType::Q3K,
            Self::Q2K => WType::Q2K,
        }
    }

    /// A line on what the preset trades (bits per weight of its main type).
    pub const fn note(self) -> &'static str {
        match self {
            Self::F32 => "32-bit float: exact, 4 bytes per weight",
            Self::F16 => "16-bit float: practically lossless, 2 bytes per weight",
            Self::BF16 => "bfloat16: float range, fewer mantissa bits than F16",
            Self::Q8_0 => "8-bit, 32-weight blocks: near-lossless, 8.5 bits per weight",
            Self::Q6K => "6-bit K-quant: very close to F16, 6.56 bits per weight",
            Self::Q5KM => "5-bit K-quant, Q6_K for half the attn_v / ffn_down: ~5.7 bits",
            Self::Q5KS => "5-bit K-quant everywhere: 5.5 bits per weight",
            Self::Q5_1 => "5-bit with scale and min per 32 weights: 6 bits per weight",
            Self::Q5_0 => "5-bit with one scale per 32 weights: 5.5 bits per weight",
            Self::Q4KM => "4-bit K-quant, Q6_K for half the attn_v / ffn_down: ~4.9 bits",
            Self::Q4KS => "4-bit K-quant, Q5_K for the first layers: ~4.6 bits",
            Self::Q4_1 => "4-bit with scale and min per 32 weights: 5 bits per weight",
            Self::Q4_0 => "4-bit with one scale per 32 weights: 4.5 bits per weight",
            Self::IQ4XS => "4-bit non-linear grid, 6-bit sub-block scales: 4.25 bits",
            Self::IQ4NL => "4-bit non-linear grid per 32 weights: 4.5 bits per weight",
            Self::Q3KM => "3-bit K-quant, 4-5 bits for attn_v / ffn_down / attn_output",
            Self::Q2K => "2-bit K-quant, Q3_K for ffn_down / attn_v: the smallest, lossy",
        }
    }
}

impl From<WType> for Preset {
    /// The preset whose main type is `ty` (a K-quant's `_M` mix, as `llama-quantize`'s
    /// "Q4_K" alias).
    fn from(ty: WType) -> Self {
        match ty {
            WType::F32 => Self::F32,
            WType::F16 => Self::F16,
            WType::BF16 => Self::BF16,
            WType::Q8_0 => Self::Q8_0,
            WType::Q6K => Self::Q6K,
            WType::Q5K => Self::Q5KM,
            WType::Q5_1 => Self::Q5_1,
            WType::Q5_0 => Self::Q5_0,
            WType::Q4K => Self::Q4KM,
            WType::Q4_1 => Self::Q4_1,
            WType::Q4_0 => Self::Q4_0,
            WType::IQ4XS => Self::IQ4XS,
            WType::IQ4NL => Self::IQ4NL,
            // No preset quantizes to MXFP4 (gpt-oss's files come with it): IQ4_NL, the other
            // 32-weight 4-bit grid, stands in.
            WType::MXFP4 => Self::IQ4NL,
            WType::Q3K => Self::Q3KM,
            WType::Q2K => Self::Q2K,
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A name [`Preset::from_str`] does not know; the message lists the ones it does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown quantization type '{0}' (known: {known})", known = known_names())]
pub struct UnknownPreset(pub String);

fn known_names() -> String {
    let names: Vec<String> = Preset::ALL
        .iter()
        .map(|p| p.name().to_ascii_lowercase())
        .collect();
    format!("{}; q4_k, q5_k, q3_k mean their _m mix", names.join(", "))
}

impl FromStr for Preset {
    type Err = UnknownPreset;

    /// llama.cpp's names, ignoring case and surrounding blanks, and the weight type names
    /// ([`WType`]'s, so "q4_k" is Q4_K_M and "fp16" F16, as `llama-quantize` reads them).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .or_else(|| name.parse::<WType>().ok().map(Self::from))
            .ok_or_else(|| UnknownPreset(s.to_string()))
    }
}

/// A weight type as users name it: a type's name ("q4_k", "fp16"), or a preset's meaning the
/// type most of its matrices get ("Q4_K_M" -> Q4_K). What `--precision` and the planner read;
/// an unknown name's error lists the types.
pub fn weight_type(s: &str) -> Result<WType, UnknownWType> {
    s.parse::<WType>()
        .or_else(|e| s.parse::<Preset>().map(Preset::default_type).map_err(|_| e))
}

// Written as its llama.cpp name ("Q4_K_M"), read back through `Preset::from_str`.
serde_as_label!(Preset);

/// What the per-tensor rules read of a model besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Query heads per KV head (llama.cpp's `n_gqa()`); 1 when the file does not say.
    pub n_gqa: usize,
    /// Layers (`{arch}.block_count`, else the highest `blk.N` + 1): how ffn_down layers are
    /// numbered.
    pub n_layer: usize,
}

impl ModelShape {
    pub fn of_file(f: &GgufFile) -> Self {
        let arch = f.get_str("general.architecture").unwrap_or("llama");
        // Per-layer head counts (arrays) read as their first layer's, as llama.cpp's n_gqa().
        let key = |k: &str| {
            let v = f.get(&format!("{arch}.{k}"))?;
            v.as_u64().or_else(|| v.as_array()?.first()?.as_u64())
        };
        let heads = key("attention.head_count").unwrap_or(1).max(1);
        let kv = key("attention.head_count_kv").unwrap_or(heads).max(1);
        let n_layer = key("block_count").map_or_else(
            || {
                f.tensors
                    .iter()
                    .filter_map(|t| layer_of(&t.name))
                    .max()
                    .map_or(0, |l| l + 1)
            },
            |n| n as usize,
        );
        Self {
            n_gqa: (heads / kv) as usize,
            n_layer,
        }
    }
}

/// The layer number of a `blk.N.*` tensor name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third one
/// between get more bits in the `_M` mixes.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// What a tensor is to the rules (llama.cpp's `tensor_category`, by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    /// attn_v, attn_qkv and attn_kv_b: the attention-value-like tensors.
    AttnV,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    match name {
        "output.weight" => Category::Output,
        "token_embd.weight" | "per_layer_token_embd.weight" => Category::TokenEmbd,
        n if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
            .iter()
            .any(|p| n.contains(p)) =>
        {
            Category::AttnV
        }
        n if n.contains("attn_k.weight") || n.contains("attn_q.weight") => Category::Other,
        n if n.contains("attn_output.weight") => Category::AttnOutput,
        n if n.contains("ffn_up") || n.contains("ffn_gate") => Category::Other,
        n if n.contains("ffn_down") => Category::FfnDown,
        _ => Category::Other,
    }
}

/// Whether llama.cpp quantizes tensor `t` at all (`tensor_allows_quantization`, the parts
/// that apply to these models): matrices named `*weight`, not norms or expert gates.
fn quantizable(t: &TensorInfo) -> bool {
    let n_dims = t.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && t.name.ends_with("weight")
        && !t.name.contains("_norm.weight")
        && !t.name.contains("ffn_gate_inp.weight")
}

/// llama.cpp's `tensor_type_fallback`: a type whose block does not divide the rows (`k`)
/// gives way to a 32-element type, and to F16 when even that does not divide them.
fn fallback(ty: WType, k: usize) -> WType {
    if k.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let t = match ty {
        WType::IQ4XS => WType::IQ4NL,
        WType::Q2K | WType::Q3K => WType::Q4_0,
        WType::Q4K => WType::Q5_0,
        WType::Q5K => WType::Q5_1,
        WType::Q6K => WType::Q8_0,
        t => t,
    };
    if k.is_multiple_of(t.block_size()) {
        t
    } else {
        WType::F16
    }
}

/// Where the rules are in their walk over the tensors (llama.cpp's `quantize_state_impl`
/// counters).
struct Walk {
    preset: Preset,
    shape: ModelShape,
    tied: bool,
    n_attn_v: usize,
    i_attn_v: usize,
    i_ffn_down: usize,
}

impl Walk {
    /// `llama_tensor_get_type_impl` for a quantizable tensor of `k` columns (the ncols of
    /// llama.cpp), before the fallback.
    fn mixed_type(&mut self, name: &str, k: usize) -> WType {
        use Preset as P;
        let p = self.preset;
        let ty = p.default_type();
        match category(name) {
            c if c == Category::Output || (self.tied && c == Category::TokenEmbd) => {
                if !k.is_multiple_of(ty.block_size()) {
                    WType::Q8_0
                } else if ty != WType::Q8_0 {
                    WType::Q6K
                } else {
                    ty
                }
            }
            Category::AttnV => {
                let (i, n) = (self.i_attn_v, self.n_attn_v);
                self.i_attn_v += 1;
                match p {
                    P::Q2K if self.shape.n_gqa >= 4 => WType::Q4K,
                    P::Q2K => WType::Q3K,
                    P::Q3KM if i < 2 => WType::Q5K,
                    P::Q3KM => WType::Q4K,
                    P::IQ4NL | P::IQ4XS if self.shape.n_gqa >= 4 => WType::Q5K,
                    P::Q4KM | P::Q5KM if use_more_bits(i, n) => WType::Q6K,
                    P::Q4KS if i < 4 => WType::Q5K,
                    _ => ty,
                }
            }
            Category::FfnDown => {
                let (i, n) = (self.i_ffn_down, self.shape.n_layer);
                self.i_ffn_down += 1;
                match p {
                    P::Q2K => WType::Q3K,
                    P::Q3KM if i < n / 16 => WType::Q5K,
                    P::Q3KM => WType::Q4K,
                    P::Q4KM if use_more_bits(i, n) => WType::Q6K,
                    P::Q4KM => ty,
                    P::IQ4NL | P::IQ4XS if i < n / 8 => WType::Q5K,
                    P::Q5KM if use_more_bits(i, n) => WType::Q6K,
                    P::Q4KS if i < n / 8 => WType::Q5K,
                    _ => ty,
                }
            }
            Category::AttnOutput => match p {
                P::Q2K => WType::Q3K,
                P::Q3KM => WType::Q4K,
                _ => ty,
            },
            _ => ty,
        }
    }
}

/// The type of each of `tensors` in a model of shape `shape` quantized to `preset`, as
/// llama.cpp's quantizer chooses it without an importance matrix:
/// - tensors it does not quantize (vectors, norms, expert gates) are F32 here (llama.cpp keeps
///   their type, which in the files it writes is F32);
/// - float presets give every other tensor their type;
/// - otherwise `llama_tensor_get_type_impl`'s mix (the output and a tied token embedding get
///   Q6_K or Q8_0; attn_v, ffn_down and attn_output get more bits where the preset says, the
///   attn_v and ffn_down counted in llama.cpp's order: by layer, then name), then
///   `tensor_type_fallback` for rows that are not whole blocks.
///
/// Not modelled (no model this engine runs has them): MoE experts, Falcon, the 70B attn_v bump.
pub fn tensor_types(tensors: &[TensorInfo], preset: Preset, shape: ModelShape) -> Vec<WType> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    let key = |i: &usize| {
        let n = &tensors[*i].name;
        (layer_of(n).map_or(-1, |l| l as i64), n.clone())
    };
    order.sort_by_key(key);
    let mut walk = Walk {
        preset,
        shape,
        tied: !tensors.iter().any(|t| t.name == "output.weight"),
        n_attn_v: tensors
            .iter()
            .filter(|t| category(&t.name) == Category::AttnV)
            .count(),
        i_attn_v: 0,
        i_ffn_down: 0,
    };
    let float = matches!(preset, Preset::F32 | Preset::F16 | Preset::BF16);
    let mut out = vec![WType::F32; tensors.len()];
    for i in order {
        let t = &tensors[i];
        if !quantizable(t) {
            continue;
        }
        let k = t.dims[0] as usize;
        out[i] = if float {
            preset.default_type()
        } else {
            fallback(walk.mixed_type(&t.name, k), k)
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases_are_llama_quantizes() {
        for p in Preset::ALL {
            assert_eq!(p.to_string().parse::<Preset>(), Ok(p));
            assert_eq!(
                format!(" {} ", p.name().to_ascii_lowercase()).parse(),
                Ok(p)
            );
        }
        for (s, p) in [
            ("q4_k", Preset::Q4KM),
            ("Q5_K", Preset::Q5KM),
            ("q3_k", Preset::Q3KM),
            ("fp16", Preset::F16),
            ("q4_k_s", Preset::Q4KS),
            ("iq4_xs", Preset::IQ4XS),
        ] {
            assert_eq!(s.parse::<Preset>(), Ok(p), "{s}");
        }
        for bad in ["", "q4", "Q4_K_L", "q3_k_xl", "q8_0\0"] {
            let e = bad.parse::<Preset>().expect_err(bad);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("'{bad}'")) && msg.contains("q4_k_m"),
                "{msg}"
            );
        }
    }

    #[test]
    fn use_more_bits_is_llama_cpps() {
        // 30 layers: 0..3, 26..29 and every third from 3 + 2.
        let picked: Vec<usize> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
    }

    #[test]
    fn fallbacks_are_llama_cpps() {
        for (ty, want) in [
            (WType::IQ4XS, WType::IQ4NL),
            (WType::Q2K, WType::Q4_0),
            (WType::Q3K, WType::Q4_0),
            (WType::Q4K, WType::Q5_0),
            (WType::Q5K, WType::Q5_1),
            (WType::Q6K, WType::Q8_0),
            (WType::Q8_0, WType::Q8_0),
        ] {
            assert_eq!(fallback(ty, 576), want, "{ty}");
            assert_eq!(fallback(ty, 512), ty, "{ty}");
            assert_eq!(fallback(ty, 100), WType::F16, "{ty}");
        }
    }
}
