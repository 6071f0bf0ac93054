//! `--kv-budget-mb`, `--gpu-kv-fraction` and `--block-size`: the KV cache's size as flags,
//! shared by `bench`, `tune` and `serve`.

use clap::Args;
use tpslab_engine::serving::engine::KvSettings;

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
}

impl KvArgs {
    /// The engine's KV settings, `default_mb` MiB when `--kv-budget-mb` is not given.
    pub fn settings(&self, default_mb: usize) -> KvSettings {
        KvSettings {
            budget_bytes: self.kv_budget_mb.map_or(default_mb, |m| m as usize) << 20,
            block_size: self.block_size as usize,
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
