//! Token sampling: penalties, then greedy or top-k / top-p / min-p / temperature sampling from
//! one row of logits, with a per-request seeded RNG so seeded runs repeat exactly.
//!
//! Order follows llama.cpp's default chain: repetition/frequency/presence penalties, then top-k,
//! top-p, min-p (all three on the temperature-1 distribution), then temperature, softmax, draw.
//! Temperature 0 means greedy: the highest logit, lowest id on ties.
//!
//! Cost per call is O(vocab) plus O(k log k) for the candidates that are sorted; buffers are
//! kept in the sampler and reused, so steady-state sampling does not allocate.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The greedy pick (the host side of [`crate::device::RowNeed::Argmax`]).
pub use crate::device::argmax;

/// How to pick the next token. `Default` is greedy decoding (temperature 0), no penalties:
/// deterministic output is the safe default for an engine whose figures must be reproducible;
/// chat front ends set a temperature explicitly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 = greedy. Logits are divided by this before the softmax.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 = off.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens whose probability adds up to at least this; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Values above 1 discourage tokens already in the prompt or output (HF / llama.cpp style:
    /// positive logits are divided by it, negative ones multiplied); 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI style: subtract `frequency_penalty * count` for each generated occurrence; 0 = off.
    pub frequency_penalty: f32,
    /// OpenAI style: subtract `presence_penalty` once for any generated token; 0 = off.
    pub presence_penalty: f32,
    /// Fixed seed for a repeatable run; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// OpenAI's `logit_bias`: added to a token's logit before anything else (ids outside the
    /// vocabulary are skipped; the server checks them first).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

/// A parameter outside its meaningful range (for front ends to reject a request with).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid sampling parameter {name} = {value}: {expected}")]
pub struct SamplingError {
    pub name: &'static str,
    pub value: f32,
    pub expected: &'static str,
}

impl SamplingParams {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Checks ranges the way OpenAI-compatible servers do. [`Sampler::new`] never fails: it
    /// clamps anything out of range, so an unchecked value cannot crash the engine.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let check = |name, value: f32, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(SamplingError {
                    name,
                    value,
                    expected,
                })
            }
        };
        let t = self.temperature;
        check(
            "temperature",
            t,
            t.is_finite() && t >= 0.0,
            "a finite number >= 0",
        )?;
        let p = self.top_p;
        check("top_p", p, p > 0.0 && p <= 1.0, "in (0, 1]")?;
        let m = self.min_p;
        check("min_p", m, (0.0..=1.0).contains(&m), "in [0, 1]")?;
        let r = self.repetition_penalty;
        check(
            "repetition_penalty",
            r,
            r.is_finite() && r > 0.0,
            "a finite number > 0",
        )?;
        let f = self.frequency_penalty;
        check(
            "frequency_penalty",
            f,
            (-2.0..=2.0).contains(&f),
            "in [-2, 2]",
        )?;
        let pr = self.presence_penalty;
        check(
            "presence_penalty",
            pr,
            (-2.0..=2.0).contains(&pr),
            "in [-2, 2]",
        )?;
        Ok(())
    }
}

/// Per-token counts, reused across calls; only the entries touched are reset.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    in_history: bool,
    generated: u32,
}

/// Samples tokens for one request. Owns its RNG and scratch buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Candidate ids, reused (vocab-sized after the first call).
    candidates: Vec<u32>,
    seen: Vec<Seen>,
    touched: Vec<u32>,
    weights: Vec<f64>,
}

/// Descending by logit, ascending by id on ties: a total order, so results never depend on the
/// sort algorithm.
fn better(logits: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
    logits[b as usize]
        .total_cmp(&logits[a as usize])
        .then(a.cmp(&b))
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Self {
        let mut p = params.clone();
        // Clamp instead of failing: NaN or out-of-range values fall back to "off" / greedy.
        if !(p.temperature.is_finite() && p.temperature > 0.0) {
            p.temperature = 0.0;
        }
        if !(p.top_p > 0.0 && p.top_p < 1.0) {
            p.top_p = 1.0;
        }
        if !(p.min_p > 0.0 && p.min_p <= 1.0) {
            p.min_p = 0.0;
        }
        if !(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0) {
            p.repetition_penalty = 1.0;
        }
        if !p.frequency_penalty.is_finite() {
            p.frequency_penalty = 0.0;
        }
        if !p.presence_penalty.is_finite() {
            p.presence_penalty = 0.0;
        }
        p.logit_bias.retain(|&(_, b)| b.is_finite() && b != 0.0);
        for (_, b) in &mut p.logit_bias {
            *b = b.clamp(-100.0, 100.0);
        }
        let rng = match p.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        Self {
            params: p,
            rng,
            candidates: Vec::new(),
            seen: Vec::new(),
            touched: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// The parameters in effect (after clamping).
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// `Some(k)` when the `k` largest logits are all this sampler reads (top-k sampling with a
    /// temperature and no penalties), so a GPU backend can send those alone.
    pub fn top_k_only(&self) -> Option<usize> {
        let p = &self.params;
        (p.temperature > 0.0 && p.top_k > 1 && !self.reads_history() && p.logit_bias.is_empty())
            .then_some(p.top_k as usize)
    }

    /// Samples from candidates (ids and their logits) that hold at least the top-k of the row,
    /// as [`Sampler::sample`] would from the full row: top-k, min-p, top-p, temperature. The
    /// candidates are put in id order first, so a seeded run repeats whatever order they came in.
    pub fn sample_candidates(&mut self, ids: &[u32], vals: &[f32]) -> u32 {
        let mut pairs: Vec<(u32, f32)> = ids.iter().copied().zip(vals.iter().copied()).collect();
        pairs.sort_unstable_by_key(|&(id, _)| id);
        let compact: Vec<f32> = pairs
            .iter()
            .map(|&(_, v)| if v.is_nan() { f32::NEG_INFINITY } else { v })
            .collect();
        if compact.is_empty() {
            return 0;
        }
        let j = if self.params.temperature == 0.0 || self.params.top_k == 1 {
            argmax(&compact)
        } else {
            self.sample_stochastic(&compact)
        };
        pairs.get(j as usize).map_or(0, |&(id, _)| id)
    }

    /// Whether the token history changes what this sampler picks (any penalty is on).
    pub fn reads_history(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
    }

    /// Whether this sampler reads the whole logits row; `false` means the row's argmax is all it
    /// uses (greedy, no penalties), so a GPU backend need not copy the row back.
    pub fn needs_logits(&self) -> bool {
        let p = &self.params;
        let greedy = p.temperature == 0.0 || p.top_k == 1;
        !greedy || self.reads_history() || !p.logit_bias.is_empty()
    }

    /// Picks the next token. `history` is prompt + generated tokens; every token in it counts for
    /// all penalties (llama.cpp style). Modifies `logits` in place (penalties, NaN -> -inf).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.sample_with_prompt(logits, history, 0)
    }

    /// As [`Sampler::sample`], but only `history[prompt_len..]` (the generated tokens) counts for
    /// the frequency and presence penalties, as in OpenAI's API and vLLM; the repetition penalty
    /// still covers the whole history.
    pub fn sample_with_prompt(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        prompt_len: usize,
    ) -> u32 {
        if let Some(t) = self.prepare(logits, history, prompt_len) {
            return t;
        }
        self.sample_stochastic(logits)
    }

    /// NaN to -inf, the logit bias and the penalties, in place; then the token when the choice is already
    /// made (an empty row: 0; greedy: the argmax), `None` when it is to be drawn.
    fn prepare(&mut self, logits: &mut [f32], history: &[u32], prompt_len: usize) -> Option<u32> {
        for l in logits.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        for &(id, b) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        self.apply_penalties(logits, history, prompt_len.min(history.len()));
        if logits.is_empty() {
            return Some(0);
        }
        (self.params.temperature == 0.0 || self.params.top_k == 1).then(|| argmax(logits))
    }

    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32], prompt_len: usize) {
        let p = &self.params;
        let rep = p.repetition_penalty;
        let (freq, pres) = (p.frequency_penalty, p.presence_penalty);
        if rep == 1.0 && freq == 0.0 && pres == 0.0 {
            return;
        }
        if self.seen.len() < logits.len() {
            self.seen.resize(logits.len(), Seen::default());
        }
        for (i, &t) in history.iter().enumerate() {
            let Some(s) = self
                .seen
                .get_mut(t as usize)
                .filter(|_| (t as usize) < logits.len())
            else {
                continue; // ids outside this vocabulary cannot be penalised
            };
            if !s.in_history {
                self.touched.push(t);
            }
            s.in_history = true;
            if i >= prompt_len {
                s.generated += 1;
            }
        }
        for &t in &self.touched {
            let s = self.seen[t as usize];
            let l = &mut logits[t as usize];
            if rep != 1.0 && s.in_history {
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
            if s.generated > 0 {
                *l -= s.generated as f32 * freq + pres;
            }
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
            self.seen[t as usize] = Seen::default();
        }
        self.touched.clear();
    }

    /// Speculative decoding's verification of one proposed token against its row: the row's
    /// distribution after penalties and filters is `p`, the proposer's a point mass on `draft`
    /// (every proposer here proposes greedily). Rejection sampling as vLLM does it: `draft` is
    /// kept with probability `p(draft)`, else a token is drawn from `p` without it,
    /// renormalised; the token returned is thus distributed exactly as [`Self::sample_with_prompt`]
    /// would draw it, whatever was proposed. Greedy: the row's argmax (kept iff it is `draft`).
    /// The proposal was accepted iff the returned token is `draft`.
    pub fn verify(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        prompt_len: usize,
        draft: u32,
    ) -> u32 {
        if let Some(t) = self.prepare(logits, history, prompt_len) {
            return t;
        }
        let Some(total) = self.distribution(logits) else {
            return argmax(logits);
        };
        let w_draft = self
            .candidates
            .iter()
            .position(|&c| c == draft)
            .map_or(0.0, |i| self.weights[i]);
        if self.rng.random::<f64>() * total < w_draft {
            return draft;
        }
        self.draw(total - w_draft, Some(draft))
            .unwrap_or_else(|| argmax(logits))
    }

    fn sample_stochastic(&mut self, logits: &[f32]) -> u32 {
        match self.distribution(logits) {
            Some(total) => self.draw(total, None).unwrap_or_else(|| argmax(logits)),
            None => argmax(logits),
        }
    }

    /// Fills `candidates` and their unnormalised `weights` with the row's distribution after
    /// top-k, min-p, top-p and temperature; returns the weights' sum, or `None` when nothing is
    /// possible (every logit -inf, or the weights do not sum to a finite positive number).
    fn distribution(&mut self, logits: &[f32]) -> Option<f64> {
        let p = &self.params;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return None; // nothing is possible; same fallback as argmax
        }
        self.candidates.clear();
        self.candidates.extend(
            (0u32..)
                .zip(logits.iter())
                .filter(|&(_, &l)| l > f32::NEG_INFINITY)
                .map(|(i, _)| i),
        );
        let cands = &mut self.candidates;
        let k = p.top_k as usize;
        if k > 0 && k < cands.len() {
            cands.select_nth_unstable_by(k - 1, |&a, &b| better(logits, a, b));
            cands.truncate(k);
        }
        // Top-p's probabilities are normalised over the top-k set (llama.cpp renormalises after
        // top-k), before min-p drops anything.
        let weight = |l: f32| (f64::from(l) - f64::from(max)).exp();
        let z: f64 = if p.top_p < 1.0 {
            cands.iter().map(|&i| weight(logits[i as usize])).sum()
        } else {
            0.0
        };
        if p.min_p > 0.0 {
            // p >= min_p * p_max  <=>  logit >= max + ln(min_p). The survivors are a prefix of
            // the sorted order, so the nucleus below is the shorter of the two prefixes.
            let min_logit = max + p.min_p.ln();
            cands.retain(|&i| logits[i as usize] >= min_logit);
        }
        if p.top_p < 1.0 {
            let n = nucleus_len(cands, logits, max, z, p.top_p);
            cands.truncate(n);
        }
        // Temperature, softmax (relative to the max, so nothing overflows).
        let inv_t = 1.0 / f64::from(p.temperature);
        self.weights.clear();
        self.weights.extend(
            cands
                .iter()
                .map(|&i| ((f64::from(logits[i as usize]) - f64::from(max)) * inv_t).exp()),
        );
        let total: f64 = self.weights.iter().sum();
        (total > 0.0 && total.is_finite()).then_some(total)
    }

    /// Draws one of `candidates` by `weights` (summing to `total` without `skip`'s), never
    /// `skip`; `None` when no candidate has weight.
    fn draw(&mut self, total: f64, skip: Option<u32>) -> Option<u32> {
        let mut u = self.rng.random::<f64>() * total;
        let mut last = None;
        for (&id, &w) in self.candidates.iter().zip(&self.weights) {
            if Some(id) == skip || w <= 0.0 {
                continue;
            }
            if u < w {
                return Some(id);
            }
            u -= w;
            last = Some(id);
        }
        // Rounding left u just past the end: the last candidate with weight.
        last
    }
}

/// How many of `cands` (unsorted, any order) form the top-p nucleus: sorts only as much of the
/// front as needed, growing the sorted prefix geometrically.
fn nucleus_len(cands: &mut [u32], logits: &[f32], max: f32, z: f64, top_p: f32) -> usize {
    let target = f64::from(top_p) * z;
    let mut sorted = 0usize;
    let mut chunk = 64usize;
    let mut cum = 0.0f64;
    while sorted < cands.len() {
        let end = (sorted + chunk).min(cands.len());
        if end < cands.len() {
            cands[sorted..].select_nth_unstable_by(end - sorted - 1, |&a, &b| better(logits, a, b));
        }
        cands[sorted..end].sort_unstable_by(|&a, &b| better(logits, a, b));
        for (i, &id) in cands[sorted..end].iter().enumerate() {
            cum += (f64::from(logits[id as usize]) - f64::from(max)).exp();
            if cum >= target {
                return sorted + i + 1;
            }
        }
        sorted = end;
        chunk *= 4;
    }
    cands.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_ties_and_empty() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 4]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn nucleus_len_matches_full_sort() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = logits
            .iter()
            .map(|&l| (f64::from(l) - f64::from(max)).exp())
            .sum();
        for top_p in [0.01f32, 0.3, 0.9, 0.999] {
            let mut cands: Vec<u32> = (0..1000).collect();
            let n = nucleus_len(&mut cands, &logits, max, z, top_p);
            let mut all: Vec<u32> = (0..1000).collect();
            all.sort_by(|&a, &b| better(&logits, a, b));
            let mut cum = 0.0;
            let mut expect = all.len();
            for (i, &id) in all.iter().enumerate() {
                cum += (f64::from(logits[id as usize]) - f64::from(max)).exp();
                if cum >= f64::from(top_p) * z {
                    expect = i + 1;
                    break;
                }
            }
            assert_eq!(n, expect, "top_p {top_p}");
            let mut got = cands[..n].to_vec();
            got.sort_unstable();
            let mut want = all[..n].to_vec();
            want.sort_unstable();
            assert_eq!(got, want);
        }
    }
}
