//! Weight element types ([`WType`]): the one table of ggml's types the project reads, writes and
//! computes with, each with its ggml id (the number in a GGUF tensor header), its name, its block
//! and the bytes of a block. The file formats, the quantizers and the kernels all read it.
//! `Display` writes ggml's name, `FromStr` reads it (and the float spellings fp32 / fp16);
//! llama.cpp's file-type names (Q4_K_M) are presets, the engine's `quant::preset`.

use std::fmt;
use std::str::FromStr;

/// Weight element types, with ggml's block layouts (so GGUF tensor bytes are used as they are).
/// The discriminant is the type's row in [`TABLE`] (and the kernels' type id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
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

/// What the table knows of a type.
struct Info {
    /// ggml's name ("Q4_K"), as GGUF tools and llama.cpp print it.
    name: &'static str,
    /// ggml's `ggml_type` number, as GGUF tensor headers store it.
    ggml_id: u32,
    /// Elements per block.
    block: usize,
    /// Bytes per block.
    bytes: usize,
}

const fn info(name: &'static str, ggml_id: u32, block: usize, bytes: usize) -> Info {
    Info {
        name,
        ggml_id,
        block,
        bytes,
    }
}

/// Every type, in [`WType::ALL`]'s order (row `t as usize` is type `t`'s).
const TABLE: [Info; 16] = [
    info("F32", 0, 1, 4),
    info("F16", 1, 1, 2),
    info("BF16", 30, 1, 2),
    info("Q4_0", 2, 32, 18),
    info("Q4_1", 3, 32, 20),
    info("Q8_0", 8, 32, 34),
    info("Q4_K", 12, 256, 144),
    info("Q6_K", 14, 256, 210),
    info("Q5_K", 13, 256, 176),
    info("Q5_0", 6, 32, 22),
    info("Q5_1", 7, 32, 24),
    info("Q2_K", 10, 256, 84),
    info("Q3_K", 11, 256, 110),
    info("IQ4_NL", 20, 32, 18),
    info("IQ4_XS", 23, 256, 136),
    info("MXFP4", 39, 32, 17),
];

/// The float types' other spellings [`WType::from_str`] takes.
const ALIASES: [(&str, WType); 2] = [("fp32", WType::F32), ("fp16", WType::F16)];

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

    const fn info(self) -> &'static Info {
        &TABLE[self as usize]
    }

    /// ggml's name of the type ("Q4_K"), as GGUF tools and llama.cpp print it.
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// ggml's number of the type (`ggml_type`), as a GGUF tensor header stores it.
    pub const fn ggml_id(self) -> u32 {
        self.info().ggml_id
    }

    /// The type of ggml number `id`, if it is one of these.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        self.info().block
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        self.info().bytes
    }

    /// Bytes of one row of `k` elements.
    pub const fn row_bytes(self, k: usize) -> usize {
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

    /// ggml's names and the float spellings (`ALIASES`), ignoring case and surrounding blanks:
    /// "q8_0", " Q4_K ", "fp16".
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

/// Written as its name ("Q4_1"), as the library index and reports always wrote it; read back
/// through [`WType::from_str`].
impl serde::Serialize for WType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for WType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
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
    fn the_float_spellings_are_accepted_and_presets_are_not_types() {
        for (name, t) in [
            ("fp32", WType::F32),
            ("FP16", WType::F16),
            ("bf16", WType::BF16),
        ] {
            assert_eq!(name.parse::<WType>(), Ok(t), "{name}");
        }
        // llama.cpp's file types are mixes (the engine's presets), not one type.
        for preset in ["q4_k_m", "Q4_K_S", "q5_k_m"] {
            assert!(preset.parse::<WType>().is_err(), "{preset}");
        }
    }

    #[test]
    fn the_table_matches_ggml() {
        // ggml.h's `ggml_type` numbers and ggml.c's `type_traits` (blck_size, type_size).
        let ggml = [
            ("F32", 0, 1, 4),
            ("F16", 1, 1, 2),
            ("Q4_0", 2, 32, 18),
            ("Q4_1", 3, 32, 20),
            ("Q5_0", 6, 32, 22),
            ("Q5_1", 7, 32, 24),
            ("Q8_0", 8, 32, 34),
            ("Q2_K", 10, 256, 84),
            ("Q3_K", 11, 256, 110),
            ("Q4_K", 12, 256, 144),
            ("Q5_K", 13, 256, 176),
            ("Q6_K", 14, 256, 210),
            ("IQ4_NL", 20, 32, 18),
            ("IQ4_XS", 23, 256, 136),
            ("BF16", 30, 1, 2),
            ("MXFP4", 39, 32, 17),
        ];
        assert_eq!(ggml.len(), WType::ALL.len());
        for (i, t) in WType::ALL.into_iter().enumerate() {
            assert_eq!(t as usize, i, "{t}: ALL's order is the table's");
        }
        for (name, id, block, bytes) in ggml {
            let t = WType::from_ggml_id(id).expect(name);
            assert_eq!((t.name(), t.ggml_id()), (name, id));
            assert_eq!((t.block_size(), t.type_size()), (block, bytes), "{name}");
        }
        for id in [4, 5, 9, 15, 16, 21, 29, 31, 40, u32::MAX] {
            assert_eq!(WType::from_ggml_id(id), None, "ggml type {id}");
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
            assert!(msg.contains("f16 (fp16)"), "{msg}");
        }
    }
}
