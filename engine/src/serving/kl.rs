//! KL divergence of a model's next-token distributions from a base model's, computed as
//! llama.cpp's `llama-perplexity --kl-divergence` does (tools/perplexity/perplexity.cpp): over the
//! same windows and scored tokens as [`perplexity`](super::perplexity), the mean KL and its
//! percentiles, top-1 agreement ("Same top p"), the probability of the right token (Δp), and the
//! perplexity of each model with the uncertainties llama.cpp prints. Both models run here, side by
//! side, chunk by chunk, so memory stays one chunk of logits per model (llama.cpp writes the base's
//! log-probs to a file because it runs one model per process).
//!
//! One difference from llama.cpp, on purpose: llama.cpp stores the base's log-probs as 16-bit
//! steps over the top 16 nats (and drops tokens below that from the sum); here both distributions
//! are exact f32 logits summed in f64, so the KL of a model against itself is exactly 0.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tpslab_kernels::ThreadPool;

use crate::kv::KvTypes;
use crate::model::LoadedModel;
use crate::serving::perplexity::{
    PerplexityError, Scorer, Windows, chunks, is_cancelled, resolve_threads,
};

/// Tokens per forward pass (as the perplexity run).
const CHUNK: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum KlError {
    #[error(transparent)]
    Run(#[from] PerplexityError),
    #[error(
        "the models do not share a vocabulary ({what}): KL divergence compares the same tokens' \
         probabilities, so the model must come from the base (a re-quantization of it)"
    )]
    Vocabulary { what: String },
}

/// A mean with its standard error, as llama.cpp prints `value ± unc`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Estimate {
    pub value: f64,
    pub unc: f64,
}

/// Percentiles of per-token values, with llama.cpp's interpolation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Spread {
    pub max: f64,
    pub p99_9: f64,
    pub p99: f64,
    pub p95: f64,
    pub p90: f64,
    pub median: f64,
    pub p10: f64,
    pub p5: f64,
    pub p1: f64,
    pub p0_1: f64,
    pub min: f64,
}

/// The result of a KL-divergence run: MODEL against BASE.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KlReport {
    /// Mean KL(base ‖ model) per scored token, in nats.
    pub kld: Estimate,
    pub kld_spread: Spread,
    /// Fraction of scored tokens where both models' most likely next token is the same.
    pub same_top: Estimate,
    /// Perplexity of the model and of the base over the same tokens.
    pub ppl: Estimate,
    pub ppl_base: Estimate,
    /// Correlation of the two models' per-token log-likelihoods.
    pub ppl_correlation: f64,
    /// ln(PPL(model) / PPL(base)), PPL(model) / PPL(base) and PPL(model) - PPL(base).
    pub ln_ppl_ratio: Estimate,
    pub ppl_ratio: Estimate,
    pub ppl_diff: Estimate,
    /// Δp = p_model(right token) - p_base(right token): mean, RMS and spread (probabilities, not %).
    pub dp: Estimate,
    pub dp_rms: Estimate,
    pub dp_spread: Spread,
    pub tokens_scored: usize,
    pub text_tokens: usize,
    pub windows: usize,
    pub ctx: usize,
    pub seconds: f64,
}

/// KL divergence of `model` from `base` on `text` with windows of `ctx` tokens (the text is
/// tokenized once, by the base, as llama.cpp does), on the CPU with `threads` threads (0 = one
/// per core). `progress(done, total)` is called after each window; setting `cancel` stops the run
/// before its next chunk. The models must share the vocabulary. `model`'s KV cache is stored as
/// `model_kv`, the base's as f16: the same model on both sides measures what a quantized cache
/// costs (KL against f16 KV).
#[allow(clippy::too_many_arguments)]
pub fn kl_divergence(
    model: &LoadedModel,
    base: &LoadedModel,
    text: &str,
    ctx: usize,
    threads: usize,
    model_kv: KvTypes,
    cancel: Option<&AtomicBool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<KlReport, KlError> {
    same_vocabulary(model, base)?;
    let start = Instant::now();
    let windows = Windows::new(base, text, ctx)?;
    // The model must also be able to take this window length.
    let max = model.model.cfg.context_len;
    if ctx > max {
        return Err(PerplexityError::Ctx { ctx, max }.into());
    }
    let pool = ThreadPool::new(resolve_threads(threads));
    let mut q = Scorer::new(model, ctx, model_kv)?;
    let mut b = Scorer::new(base, ctx, KvTypes::F16)?;
    let vocab = base.model.cfg.vocab;
    let mut acc = Accumulator::default();
    for w in 0..windows.count {
        let win = windows.window(w);
        for (from, to) in chunks(ctx, CHUNK) {
            if is_cancelled(cancel) {
                return Err(PerplexityError::Cancelled.into());
            }
            let (scored, base_logits) = b.chunk(&pool, &win, from, to)?;
            let (_, logits) = q.chunk(&pool, &win, from, to)?;
            let rows = logits
                .chunks_exact(vocab)
                .zip(base_logits.chunks_exact(vocab));
            for (p, (row, base_row)) in scored.zip(rows) {
                acc.add(row, base_row, windows.target(w, p) as usize);
            }
        }
        progress(w + 1, windows.count);
    }
    Ok(acc.report(&windows, start.elapsed().as_secs_f64()))
}

/// Refuses two models whose logits do not index the same tokens.
fn same_vocabulary(model: &LoadedModel, base: &LoadedModel) -> Result<(), KlError> {
    let (m, b) = (model.model.cfg.vocab, base.model.cfg.vocab);
    if m != b {
        return Err(KlError::Vocabulary {
            what: format!("{m} logits per token against the base's {b}"),
        });
    }
    let (mt, bt) = (&model.tokenizer, &base.tokenizer);
    if mt.vocab_size() != bt.vocab_size() {
        return Err(KlError::Vocabulary {
            what: format!(
                "{} tokens against the base's {}",
                mt.vocab_size(),
                bt.vocab_size()
            ),
        });
    }
    for id in 0..bt.vocab_size() as u32 {
        let (x, y) = (mt.id_to_token(id), bt.id_to_token(id));
        if x != y {
            return Err(KlError::Vocabulary {
                what: format!("token {id} is {x:?} against the base's {y:?}"),
            });
        }
    }
    Ok(())
}

/// The per-token sums of llama.cpp's `kl_divergence_result`, and the per-token values its
/// percentiles are taken over.
#[derive(Default)]
struct Accumulator {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    same_top: usize,
    kld: Vec<f32>,
    p_diff: Vec<f32>,
}

/// log-softmax pieces of one logits row: (index of the first maximum, max + ln Σ exp(x - max)).
fn log_norm(row: &[f32]) -> (usize, f64) {
    (
        crate::device::argmax(row) as usize,
        crate::serving::logprobs::log_sum_exp(row),
    )
}

impl Accumulator {
    /// One scored token: the model's and the base's logits, and the text's next token.
    fn add(&mut self, row: &[f32], base_row: &[f32], target: usize) {
        let (top, norm) = log_norm(row);
        let (top_base, norm_base) = log_norm(base_row);
        let nll = norm - f64::from(row[target]);
        let nll_base = norm_base - f64::from(base_row[target]);
        self.sum_nll += nll;
        self.sum_nll2 += nll * nll;
        self.sum_nll_base += nll_base;
        self.sum_nll_base2 += nll_base * nll_base;
        self.sum_nll_nll_base += nll * nll_base;
        // KL(base ‖ model) = Σ p_base (log p_base - log p_model).
        let kld: f64 = row
            .iter()
            .zip(base_row)
            .map(|(&x, &y)| {
                let log_p_base = f64::from(y) - norm_base;
                log_p_base.exp() * (log_p_base - (f64::from(x) - norm))
            })
            .sum();
        // Rounding can leave a hair below zero for identical rows; KL is never negative.
        let kld = kld.max(0.0);
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.same_top += usize::from(top == top_base);
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff;
        self.sum_p_diff2 += p_diff * p_diff;
        self.sum_p_diff4 += p_diff.powi(4);
        self.kld.push(kld as f32);
        self.p_diff.push(p_diff as f32);
    }

    fn report(mut self, windows: &Windows, seconds: f64) -> KlReport {
        let n = self.kld.len();
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, n);
        let log_ppl_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n);
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let ppl = Estimate {
            value: log_ppl.value.exp(),
            unc: log_ppl.value.exp() * log_ppl.unc,
        };
        let ppl_base = Estimate {
            value: log_ppl_base.value.exp(),
            unc: log_ppl_base.value.exp() * log_ppl_base.unc,
        };
        let ln_ratio = Estimate {
            value: log_ppl.value - log_ppl_base.value,
            unc: (log_ppl.unc.powi(2) + log_ppl_base.unc.powi(2) - 2.0 * cov)
                .max(0.0)
                .sqrt(),
        };
        let ratio = ln_ratio.value.exp();
        let ppl_cov = ppl.value * ppl_base.value * cov;
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, n);
        let rms = mse.value.sqrt();
        let same = self.same_top as f64 / n as f64;
        self.kld.sort_by(f32::total_cmp);
        self.p_diff.sort_by(f32::total_cmp);
        KlReport {
            kld: mean_and_uncertainty(self.sum_kld, self.sum_kld2, n),
            kld_spread: spread(&self.kld),
            same_top: Estimate {
                value: same,
                unc: (same * (1.0 - same) / (n.max(2) - 1) as f64).sqrt(),
            },
            ppl,
            ppl_base,
            ppl_correlation: cov / (log_ppl.unc * log_ppl_base.unc),
            ln_ppl_ratio: ln_ratio,
            ppl_ratio: Estimate {
                value: ratio,
                unc: ratio * ln_ratio.unc,
            },
            ppl_diff: Estimate {
                value: ppl.value - ppl_base.value,
                unc: (ppl.unc.powi(2) + ppl_base.unc.powi(2) - 2.0 * ppl_cov)
                    .max(0.0)
                    .sqrt(),
            },
            dp: mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n),
            dp_rms: Estimate {
                value: rms,
                unc: if rms > 0.0 { 0.5 / rms * mse.unc } else { 0.0 },
            },
            dp_spread: spread(&self.p_diff),
            tokens_scored: n,
            text_tokens: windows.tokens.len(),
            windows: windows.count,
            ctx: windows.ctx,
            seconds,
        }
    }
}

/// llama.cpp's `mean_and_uncertainty`: the mean and its standard error (0 below 11 values).
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> Estimate {
    if count == 0 {
        return Estimate {
            value: 0.0,
            unc: 0.0,
        };
    }
    let f = sum / count as f64;
    let var = sum2 / count as f64 - f * f;
    let unc = if var > 0.0 && count > 10 {
        (var / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    Estimate { value: f, unc }
}

/// llama.cpp's `covariance` of two means (0 below 10 values).
fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1.0)
}

/// llama.cpp's `percentile` of sorted values: linear between the two nearest ranks.
fn percentile(sorted: &[f32], fraction: f64) -> f64 {
    let (Some(&lo), Some(&hi)) = (sorted.first(), sorted.last()) else {
        return 0.0;
    };
    if fraction <= 0.0 {
        return f64::from(lo);
    }
    if fraction >= 1.0 {
        return f64::from(hi);
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let ip = p as usize;
    let t = p - ip as f64;
    let next = sorted[(ip + 1).min(sorted.len() - 1)];
    (1.0 - t) * f64::from(sorted[ip]) + t * f64::from(next)
}

/// The percentiles llama.cpp prints (its median is the mean of the two middle values).
fn spread(sorted: &[f32]) -> Spread {
    let n = sorted.len();
    let median = match n {
        0 => 0.0,
        _ if n.is_multiple_of(2) => 0.5 * (f64::from(sorted[n / 2]) + f64::from(sorted[n / 2 - 1])),
        _ => f64::from(sorted[n / 2]),
    };
    Spread {
        max: percentile(sorted, 1.0),
        p99_9: percentile(sorted, 0.999),
        p99: percentile(sorted, 0.99),
        p95: percentile(sorted, 0.95),
        p90: percentile(sorted, 0.90),
        median,
        p10: percentile(sorted, 0.10),
        p5: percentile(sorted, 0.05),
        p1: percentile(sorted, 0.01),
        p0_1: percentile(sorted, 0.001),
        min: percentile(sorted, 0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_as_llama_cpp() {
        let v: Vec<f32> = (0..=10).map(|i| i as f32).collect();
        let s = spread(&v);
        assert_eq!(s.max, 10.0);
        assert_eq!(s.min, 0.0);
        assert_eq!(s.median, 5.0);
        assert!((s.p95 - 9.5).abs() < 1e-6);
        assert!((s.p99 - 9.9).abs() < 1e-6);
        let even = spread(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(even.median, 2.5);
    }

    #[test]
    fn kl_of_a_shifted_row_is_zero_and_of_another_row_positive() {
        let row = [1.0f32, 2.0, 3.0, 0.5];
        let shifted = row.map(|x| x + 7.0);
        let mut acc = Accumulator::default();
        acc.add(&shifted, &row, 2);
        assert!(acc.kld[0].abs() < 1e-9);
        assert_eq!(acc.same_top, 1);
        // Two-token check against the closed form.
        let (p, q) = ([0.0f32, 0.0], [0.0f32, (3.0f32).ln()]);
        let mut acc = Accumulator::default();
        acc.add(&q, &p, 0);
        // KL([.5,.5] ‖ [.25,.75]) = .5 ln 2 + .5 ln(2/3)
        let want = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
        assert!((f64::from(acc.kld[0]) - want).abs() < 1e-6);
        assert_eq!(acc.same_top, 0);
    }
}
