//! Weight element types ([`WType`]): ggml's block sizes, and the one table of their names
//! (`Display` writes ggml's, `FromStr` reads those and the llama.cpp spellings users type).

use std::fmt;
use std::str::FromStr;

/// Weight element types, with ggml's block layouts (so GGUF tensor bytes are used as they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
    /// ggml `block_q4_K`: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of
    /// nibbles; 256 elements.
    Q4K,
    /// ggml `block_q6_K`: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 i8 scales, f16 d;
    /// 256 elements.
    Q6K,
    /// ggml `block_q5_K`: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins (as Q4_K), 32
    /// bytes of fifth bits, 128 bytes of low nibbles; 256 elements.
    Q5K,
    /// ggml `block_q5_0`: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles; x = d * (q - 16);
    /// 32 elements.
    Q5_0,
    /// ggml `block_q5_1`: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles;
    /// x = d * q + m; 32 elements.
    Q5_1,
    /// ggml `block_q2_K`: 16 bytes of 4-bit scale / 4-bit min pairs, 64 bytes of 2-bit levels,
    /// f16 d, f16 dmin; 16 sub-blocks of 16; 256 elements.
    Q2K,
    /// ggml `block_q3_K`: 32 bytes of high bits, 64 bytes of low 2-bit levels, 12 bytes of
    /// packed 6-bit scales, f16 d; 16 sub-blocks of 16; 256 elements.
    Q3K,
    /// ggml `block_iq4_nl`: f16 d, 16 bytes of nibbles indexing the non-linear
    /// `kvalues_iq4nl` grid; 32 elements.
    IQ4NL,
    /// ggml `block_iq4_xs`: f16 d, 2 bytes of high and 4 of low scale bits (8 6-bit scales), 128
    /// bytes of `kvalues_iq4nl` indices; 256 elements.
    IQ4XS,
    /// ggml `block_mxfp4` (OCP microscaling FP4, gpt-oss's experts): one e8m0 exponent byte,
    /// 16 bytes of e2m1 nibbles (low nibbles first); x = 2^(e - 128) * `kvalues_mxfp4[q]` (the
    /// grid doubled, the scale halved); 32 elements.
    MXFP4,
}

/// Other spellings [`WType::from_str`] takes: llama.cpp's file-type names for the K-quant mixes
/// (whose matrices are mostly that type) and the "fp" float names.
const ALIASES: [(&str, WType); 5] = [
    ("fp32", WType::F32),
    ("fp16", WType::F16),
    ("q4_k_m", WType::Q4K),
    ("q4_k_s", WType::Q4K),
    ("q5_k_m", WType::Q5K),
];

impl WType {
    /// Every type, in the order of the kernels' type ids.
    pub const ALL: [WType; 16] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q8_0,
        Self::Q4K,
        Self::Q6K,
        Self::Q5K,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q2K,
        Self::Q3K,
        Self::IQ4NL,
        Self::IQ4XS,
        Self::MXFP4,
    ];

    /// ggml's name of the type ("Q4_K"), as GGUF tools and llama.cpp print it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q6K => "Q6_K",
            Self::Q5K => "Q5_K",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::IQ4NL => "IQ4_NL",
            Self::IQ4XS => "IQ4_XS",
            Self::MXFP4 => "MXFP4",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q8_0 | Self::Q5_0 | Self::Q5_1 | Self::IQ4NL => 32,
            Self::MXFP4 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K | Self::Q2K | Self::Q3K | Self::IQ4XS => 256,
        }
    }
    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::IQ4NL => 18,
            Self::IQ4XS => 136,
            Self::MXFP4 => 17,
        }
    }
    /// Bytes of one row of `k` elements.
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_size() * self.type_size()
    }
}

impl fmt::Display for WType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: widths and alignment in table columns apply.
        f.pad(self.name())
    }
}

impl FromStr for WType {
    type Err = UnknownWType;

    /// ggml's names and the other spellings (`ALIASES`), ignoring case and surrounding blanks:
    /// "q8_0", " Q4_K ", "Q4_K_M" (-> Q4_K).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        let alias = || ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(name));
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .or_else(|| alias().map(|&(_, t)| t))
            .ok_or_else(|| UnknownWType(s.to_string()))
    }
}

/// A name [`WType::from_str`] does not know; the message lists the names it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWType(pub String);

impl fmt::Display for UnknownWType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown weight type '{}' (known: ", self.0)?;
        for (i, t) in WType::ALL.into_iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{}", t.name().to_ascii_lowercase())?;
            let aliases: Vec<&str> = ALIASES
                .iter()
                .filter(|(_, a)| *a == t)
                .map(|(n, _)| *n)
                .collect();
            if !aliases.is_empty() {
                write!(f, " ({})", aliases.join(", "))?;
            }
        }
        f.write_str(")")
    }
}

impl std::error::Error for UnknownWType {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_through_its_name() {
        let names: Vec<String> = WType::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q5_0",
                "Q5_1", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4"
            ]
        );
        for t in WType::ALL {
            assert_eq!(t.to_string().parse::<WType>(), Ok(t));
            assert_eq!(t.name().to_ascii_lowercase().parse::<WType>(), Ok(t));
            assert_eq!(
                format!("  {t}\t").parse::<WType>(),
                Ok(t),
                "blanks around {t}"
            );
        }
        assert_eq!(format!("[{:>6}]", WType::Q8_0), "[  Q8_0]");
    }

    #[test]
    fn the_llama_cpp_spellings_are_accepted() {
        for (name, t) in [
            ("fp32", WType::F32),
            ("FP16", WType::F16),
            ("q4_k_m", WType::Q4K),
            ("Q4_K_S", WType::Q4K),
            (" q5_k_m ", WType::Q5K),
            ("bf16", WType::BF16),
        ] {
            assert_eq!(name.parse::<WType>(), Ok(t), "{name}");
        }
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        for bad in ["q3", "", "Q4_K_L", "q4", "f16 x", "Q8_0\0", "iq4"] {
            let e = bad.parse::<WType>().expect_err(bad);
            assert_eq!(e, UnknownWType(bad.to_string()));
            let msg = e.to_string();
            assert!(msg.contains(&format!("'{bad}'")), "{msg}");
            for t in WType::ALL {
                assert!(msg.contains(&t.name().to_ascii_lowercase()), "{t} in {msg}");
            }
            assert!(msg.contains("q4_k (q4_k_m, q4_k_s)"), "{msg}");
        }
    }
}
