//! `--kv-budget-mb`, `--gpu-kv-fraction` and `--block-size`: the KV cache's size as flags,
//! shared by `bench`, `tune` and `serve`; `--cache-type-k` / `--cache-type-v` ([`KvTypeArgs`];
//! llama.cpp's `-ctk` / `-ctv`, rewritten by `cli::llama_spelling`): its element types, also
//! taken by `generate` and `perplexity`.

use clap::Args;
use tpslab_engine::kv::{KvType, KvTypes, UnknownKvType};
use tpslab_engine::serving::engine::KvSettings;

/// The KV cache's element types.
#[derive(Args, Debug, Clone)]
pub struct KvTypeArgs {
    /// Element type of the KV cache's keys: f16, bf16, q8_0, q4_0 (llama.cpp's --cache-type-k,
    /// also spelled -ctk). q8_0 holds 1.88x the tokens of f16 in the same memory, q4_0
    /// 3.5x; the CPU runs them all, CUDA f16 only.
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type_k: KvType,
    /// Element type of the KV cache's values (llama.cpp's --cache-type-v, -ctv), as
    /// --cache-type-k.
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type_v: KvType,
}

impl KvTypeArgs {
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    s.parse().map_err(|e: UnknownKvType| e.to_string())
}

/// How large the KV pool is, and in blocks of how many tokens.
#[derive(Args, Debug, Clone)]
pub struct KvArgs {
    /// KV cache memory in MiB (default: 1024 for `bench`, 512 for `serve` and `tune`).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    pub kv_budget_mb: Option<u32>,
    /// On a GPU: size the KV cache as this fraction of the memory left free after the weights
    /// (like vLLM's --gpu-memory-utilization, but of what is free), instead of --kv-budget-mb.
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    pub gpu_kv_fraction: Option<f32>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub block_size: u32,
    #[command(flatten)]
    pub types: KvTypeArgs,
}

impl KvArgs {
    /// The engine's KV settings, `default_mb` MiB when `--kv-budget-mb` is not given.
    pub fn settings(&self, default_mb: usize) -> KvSettings {
        KvSettings {
            budget_bytes: self.kv_budget_mb.map_or(default_mb, |m| m as usize) << 20,
            block_size: self.block_size as usize,
            types: self.types.types(),
        }
    }

    /// The engine's `gpu_kv_fraction` (0: size by the budget).
    pub fn gpu_fraction(&self) -> f32 {
        self.gpu_kv_fraction.unwrap_or(0.0)
    }
}

/// A fraction in (0, 0.95].
fn parse_fraction(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(f) if f > 0.0 && f <= 0.95 => Ok(f),
        _ => Err(format!("'{s}' is not a fraction between 0 and 0.95")),
    }
}
