//! Perplexity of a model over a text, computed as llama.cpp's `llama-perplexity` does: the
//! tokens cut into non-overlapping windows of `ctx`, each window run through the batched forward
//! from an empty KV cache, and only the second half of each window scored (so every scored token
//! sees at least `ctx / 2` tokens of context). The bundled text is public domain. A run can be
//! cancelled through a flag, checked between chunks of a window.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tpslab_kernels::ThreadPool;

use crate::device::{BatchError, Workspace};
use crate::kv::{Batch, KvCache, KvError, KvTypes};
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
/// (0 = one per core), over an f16 KV cache. `progress(done, total)` is called after each window.
/// Setting `cancel` stops the run before its next chunk with [`PerplexityError::Cancelled`].
pub fn perplexity(
    lm: &LoadedModel,
    text: &str,
    ctx: usize,
    threads: usize,
    cancel: Option<&AtomicBool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, PerplexityError> {
    perplexity_kv(lm, text, ctx, threads, KvTypes::F16, cancel, progress)
}

/// [`perplexity`] with the KV cache stored as `kv` (what a quantized cache costs in quality).
pub fn perplexity_kv(
    lm: &LoadedModel,
    text: &str,
    ctx: usize,
    threads: usize,
    kv: KvTypes,
    cancel: Option<&AtomicBool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, PerplexityError> {
    let opts = RunOpts {
        threads,
        kv,
        chunk: CHUNK,
    };
    run(lm, text, ctx, opts, cancel, progress)
}

/// How a run computes: threads, KV types, and the most tokens per forward pass.
struct RunOpts {
    threads: usize,
    kv: KvTypes,
    chunk: usize,
}

/// [`perplexity_kv`] with forward passes of at most `opts.chunk` tokens.
fn run(
    lm: &LoadedModel,
    text: &str,
    ctx: usize,
    opts: RunOpts,
    cancel: Option<&AtomicBool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, PerplexityError> {
    let start = Instant::now();
    let windows = Windows::new(lm, text, ctx)?;
    let pool = ThreadPool::new(resolve_threads(opts.threads));
    let mut scorer = Scorer::new(lm, ctx, opts.kv)?;
    let chunk = opts.chunk;
    let vocab = lm.model.cfg.vocab;
    let (mut nll, mut count) = (0f64, 0usize);
    for w in 0..windows.count {
        let win = windows.window(w);
        for (from, to) in chunks(ctx, chunk) {
            if is_cancelled(cancel) {
                return Err(PerplexityError::Cancelled);
            }
            let (scored, logits) = scorer.chunk(&pool, &win, from, to)?;
            for (p, row) in scored.zip(logits.chunks_exact(vocab)) {
                nll += neg_log_softmax(row, windows.target(w, p) as usize);
                count += 1;
            }
        }
        progress(w + 1, windows.count);
    }
    let mean = nll / count as f64;
    Ok(PerplexityReport {
        perplexity: mean.exp(),
        nll: mean,
        tokens_scored: count,
        text_tokens: windows.tokens.len(),
        windows: windows.count,
        ctx,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Whether a run was asked to stop.
pub(crate) fn is_cancelled(cancel: Option<&AtomicBool>) -> bool {
    cancel.is_some_and(|c| c.load(Ordering::Relaxed))
}

/// `threads`, with 0 meaning one per core.
pub(crate) fn resolve_threads(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
        n => n,
    }
}

/// The forward passes of one window, as `(from, to)` position ranges of at most `chunk` tokens.
pub(crate) fn chunks(ctx: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = chunk.max(1);
    (0..ctx)
        .step_by(step)
        .map(move |from| (from, (from + step).min(ctx)))
}

/// A text cut into llama.cpp's windows: `count` non-overlapping windows of `ctx` tokens.
pub(crate) struct Windows {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub ctx: usize,
    bos: Option<u32>,
}

impl Windows {
    /// Tokenizes `text` with `lm`'s tokenizer and checks that `ctx` fits the model and the text.
    pub fn new(lm: &LoadedModel, text: &str, ctx: usize) -> Result<Self, PerplexityError> {
        let max = lm.model.cfg.context_len;
        if ctx < 8 || ctx > max {
            return Err(PerplexityError::Ctx { ctx, max });
        }
        let tokens = lm.raw_prompt(text).map_err(GenerateError::from)?;
        let count = tokens.len() / ctx;
        if count == 0 {
            return Err(PerplexityError::TooShort {
                tokens: tokens.len(),
                ctx,
            });
        }
        let bos = lm.tokenizer.bos_id().filter(|_| lm.tokenizer.add_bos());
        Ok(Self {
            tokens,
            count,
            ctx,
            bos,
        })
    }

    /// The tokens window `w` is run on.
    pub fn window(&self, w: usize) -> Vec<u32> {
        let mut win = self.tokens[w * self.ctx..(w + 1) * self.ctx].to_vec();
        // As llama.cpp: each window starts with BOS when the model's prompts do.
        if let Some(b) = self.bos {
            win[0] = b;
        }
        win
    }

    /// The token that the logits at position `p` of window `w` predict (the text's own, not BOS).
    pub fn target(&self, w: usize, p: usize) -> u32 {
        self.tokens[w * self.ctx + p + 1]
    }
}

/// One model's forward passes over windows: its own KV cache (one window long, of the given
/// types) and workspace, so two models (or one model over two KV types) can be run side by side,
/// chunk by chunk, with bounded memory.
pub(crate) struct Scorer<'a> {
    lm: &'a LoadedModel,
    kv: KvCache,
    ws: Workspace,
    table: Vec<u32>,
    ctx: usize,
}

impl<'a> Scorer<'a> {
    pub fn new(lm: &'a LoadedModel, ctx: usize, kv: KvTypes) -> Result<Self, PerplexityError> {
        let table: Vec<u32> = (0..ctx.div_ceil(BLOCK) as u32).collect();
        let kv = KvCache::with_types(&lm.model.cfg, BLOCK, table.len(), kv)?;
        Ok(Self {
            lm,
            kv,
            ws: Workspace::default(),
            table,
            ctx,
        })
    }

    /// Runs positions `from..to` of `win` (after `0..from`, which must have run just before) and
    /// returns the positions scored in this chunk (the second half of the window, less the last
    /// position, which predicts nothing inside the window) with their logits rows, in order.
    pub fn chunk(
        &mut self,
        pool: &ThreadPool,
        win: &[u32],
        from: usize,
        to: usize,
    ) -> Result<(Range<usize>, &[f32]), PerplexityError> {
        let first = self.ctx / 2;
        let mut batch = Batch::default();
        batch.push_seq(self.table.clone(), from, &win[from..to], false);
        let scored = first.max(from)..(self.ctx - 1).min(to);
        batch.logit_rows = scored.clone().map(|p| p - from).collect();
        let logits = self
            .lm
            .model
            .forward(pool, &batch, &mut self.kv, &mut self.ws)?;
        Ok((scored, logits))
    }
}

/// -log softmax(row)[target], in f64.
pub(crate) fn neg_log_softmax(row: &[f32], target: usize) -> f64 {
    crate::serving::logprobs::log_sum_exp(row) - row[target] as f64
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
        let opts = |chunk| RunOpts {
            threads: 2,
            kv: KvTypes::F16,
            chunk,
        };
        let whole = run(&lm, BUNDLED_TEXT, ctx, opts(ctx), None, &mut |_, _| {}).expect("whole");
        // Chunks that split both the unscored and the scored half.
        let chunked = run(&lm, BUNDLED_TEXT, ctx, opts(96), None, &mut |_, _| {}).expect("chunked");
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
