//! Perplexity of a model over a text, computed as llama.cpp's `llama-perplexity` does: the
//! tokens cut into non-overlapping windows of `ctx`, each window run through the batched forward
//! from an empty KV cache, and only the second half of each window scored (so every scored token
//! sees at least `ctx / 2` tokens of context). The bundled text is public domain. A run can be
//! cancelled through a flag, checked between chunks of a window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tpslab_kernels::ThreadPool;

use crate::device::{BatchError, Workspace};
use crate::kv::{Batch, KvCache, KvError};
use crate::model::LoadedModel;
use crate::model::ModelError;
use crate::serving::generate::GenerateError;

/// Chapter 1 of *Pride and Prejudice* (Project Gutenberg #1342), see `assets/perplexity/`.
pub const BUNDLED_TEXT: &str =
    include_str!("../../../assets/perplexity/pride-and-prejudice-ch1.txt");
/// Where [`BUNDLED_TEXT`] comes from, for reports.
pub const BUNDLED_TEXT_NAME: &str = "Pride and Prejudice, chapter 1 (Project Gutenberg #1342)";

/// KV block size of the perplexity cache (any works; the whole window fits).
const BLOCK: usize = 16;
/// Tokens per forward pass: a window runs as chunks of this many (chunked prefill over the same
/// KV cache, the same arithmetic per token), so a cancel waits for one chunk, not a whole window.
const CHUNK: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("context {ctx} is out of range: it must be at least 8 and at most the model's {max}")]
    Ctx { ctx: usize, max: usize },
    #[error("the text has {tokens} tokens, fewer than one window of {ctx}; use a smaller --ctx")]
    TooShort { tokens: usize, ctx: usize },
    #[error("perplexity cancelled")]
    Cancelled,
}

/// The result of a perplexity run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PerplexityReport {
    /// exp(mean negative log-likelihood) over the scored tokens.
    pub perplexity: f64,
    /// Mean negative log-likelihood (nats per token).
    pub nll: f64,
    pub tokens_scored: usize,
    pub text_tokens: usize,
    pub windows: usize,
    pub ctx: usize,
    pub seconds: f64,
}

/// Perplexity of `lm` on `text` with windows of `ctx` tokens, on the CPU with `threads` threads
/// (0 = one per core). `progress(done, total)` is called after each window. Setting `cancel`
/// stops the run before its next chunk with [`PerplexityError::Cancelled`].
pub fn perplexity(
    lm: &LoadedModel,
    text: &str,
    ctx: usize,
    threads: usize,
    cancel: Option<&AtomicBool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, PerplexityError> {
    run(lm, text, ctx, threads, CHUNK, cancel, progress)
}

/// [`perplexity`] with forward passes of at most `chunk` tokens.
fn run(
    lm: &LoadedModel,
    text: &str,
    ctx: usize,
    threads: usize,
    chunk: usize,
    cancel: Option<&AtomicBool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, PerplexityError> {
    let cancelled = || cancel.is_some_and(|c| c.load(Ordering::Relaxed));
    let cfg = &lm.model.cfg;
    if ctx < 8 || ctx > cfg.context_len {
        return Err(PerplexityError::Ctx {
            ctx,
            max: cfg.context_len,
        });
    }
    let start = Instant::now();
    let tokens = lm.raw_prompt(text).map_err(GenerateError::from)?;
    let windows = tokens.len() / ctx;
    if windows == 0 {
        return Err(PerplexityError::TooShort {
            tokens: tokens.len(),
            ctx,
        });
    }
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
        n => n,
    };
    let pool = ThreadPool::new(threads);
    let table: Vec<u32> = (0..ctx.div_ceil(BLOCK) as u32).collect();
    let mut kv = KvCache::new(cfg, BLOCK, table.len())?;
    let mut ws = Workspace::default();
    let bos = lm.tokenizer.bos_id().filter(|_| lm.tokenizer.add_bos());
    let first = ctx / 2;
    let vocab = cfg.vocab;
    let (mut nll, mut count) = (0f64, 0usize);
    for w in 0..windows {
        let mut win = tokens[w * ctx..(w + 1) * ctx].to_vec();
        // As llama.cpp: each window starts with BOS when the model's prompts do.
        if let Some(b) = bos {
            win[0] = b;
        }
        // Logits at positions first..ctx-1 predict tokens first+1..ctx.
        for from in (0..ctx).step_by(chunk.max(1)) {
            if cancelled() {
                return Err(PerplexityError::Cancelled);
            }
            let to = (from + chunk.max(1)).min(ctx);
            let mut batch = Batch::default();
            batch.push_seq(table.clone(), from, &win[from..to], false);
            let scored = first.max(from)..(ctx - 1).min(to);
            batch.logit_rows = scored.clone().map(|p| p - from).collect();
            let logits = lm.model.forward(&pool, &batch, &mut kv, &mut ws)?;
            for (p, row) in scored.zip(logits.chunks_exact(vocab)) {
                let target = tokens[w * ctx + p + 1] as usize;
                nll += neg_log_softmax(row, target);
                count += 1;
            }
        }
        progress(w + 1, windows);
    }
    let mean = nll / count as f64;
    Ok(PerplexityReport {
        perplexity: mean.exp(),
        nll: mean,
        tokens_scored: count,
        text_tokens: tokens.len(),
        windows,
        ctx,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// -log softmax(row)[target], in f64.
fn neg_log_softmax(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    sum.ln() + max - row[target] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_windows_score_as_whole_windows_do() {
        let path = crate::library::resolve_model("default", &mut |m| eprintln!("{m}"))
            .expect("default model");
        let lm = LoadedModel::load(&path).expect("load");
        let ctx = 256;
        let whole = run(&lm, BUNDLED_TEXT, ctx, 2, ctx, None, &mut |_, _| {}).expect("whole");
        // Chunks that split both the unscored and the scored half.
        let chunked = run(&lm, BUNDLED_TEXT, ctx, 2, 96, None, &mut |_, _| {}).expect("chunked");
        assert_eq!(whole.tokens_scored, chunked.tokens_scored);
        let rel = (chunked.nll / whole.nll - 1.0).abs();
        assert!(
            rel < 1e-4,
            "nll {} chunked vs {} whole",
            chunked.nll,
            whole.nll
        );
    }
}
