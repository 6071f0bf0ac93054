//! Log-probabilities of generated tokens, as OpenAI's `logprobs` / `top_logprobs` return them:
//! the log-softmax of the model's raw logits row (before logit bias, penalties, temperature
//! and the top-k / top-p / min-p filters, as vLLM's default `raw_logprobs` mode), for the chosen
//! token and for the `top` most likely tokens of the row.

/// One generated token's log-probability and the row's most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// `ln p(token)`; `-inf` for a token the row gives no probability.
    pub logprob: f32,
    /// The token's rank in the row, from 1, as vLLM counts it: the entries at least as likely
    /// as the token, itself included (one past the row for an id outside it).
    pub rank: u32,
    /// The `top` most likely tokens with their log-probabilities, most likely first (lower id
    /// first on ties).
    pub top: Vec<(u32, f32)>,
}

/// The most top alternatives a request may ask for (OpenAI's cap for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `ln sum(exp(row))`, computed from the row's maximum (NaN counts as `-inf`); `-inf` for an
/// empty row or one with every entry `-inf`.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    if max == f32::INFINITY {
        return f64::INFINITY;
    }
    let m = f64::from(max);
    let sum: f64 = row
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (f64::from(v) - m).exp())
        .sum();
    m + sum.ln()
}

/// The log-probability of `token` under the raw `row`, and the row's `top` (at most
/// [`MAX_TOP_LOGPROBS`]) most likely tokens. O(vocab) plus O(top log top).
pub fn token_logprob(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let lse = log_sum_exp(row);
    let lp = |v: f32| -> f32 {
        if v.is_nan() || !lse.is_finite() {
            f32::NEG_INFINITY
        } else {
            (f64::from(v) - lse) as f32
        }
    };
    let logprob = row
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&v| lp(v));
    let rank = match row.get(token as usize) {
        Some(&v) if !v.is_nan() => row.iter().filter(|&&x| x >= v).count(),
        Some(_) => row.iter().filter(|x| !x.is_nan()).count() + 1,
        None => row.len() + 1,
    };
    let top = top.min(MAX_TOP_LOGPROBS).min(row.len());
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        // One pass keeping the `top` best in order: `top` is at most 20.
        for (i, &v) in (0u32..).zip(row.iter()) {
            let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
            if best.len() == top && best[top - 1].1 >= v {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (i, v));
            best.truncate(top);
        }
    }
    TokenLogprob {
        logprob,
        rank: u32::try_from(rank).unwrap_or(u32::MAX),
        top: best.into_iter().map(|(i, v)| (i, lp(v))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_softmax_and_orders_the_alternatives() {
        let row = [1.0f32, 3.0, 3.0, -2.0, f32::NAN];
        let z: f64 = [1.0f64, 3.0, 3.0, -2.0].iter().map(|v| v.exp()).sum();
        let t = token_logprob(&row, 0, 3);
        assert!((f64::from(t.logprob) - (1.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, [1, 2, 0], "most likely first, lower id first on ties");
        assert_eq!(t.rank, 3, "token 0 is third");
        assert_eq!(
            token_logprob(&row, 1, 0).rank,
            2,
            "a tie counts the other token"
        );
        assert_eq!(token_logprob(&row, 3, 0).rank, 4);
        assert_eq!(token_logprob(&row, 4, 0).rank, 5, "NaN ranks last");
        assert_eq!(token_logprob(&row, 99, 0).rank, 6, "outside the row");
        let total: f64 = (0..4)
            .map(|i| f64::from(token_logprob(&row, i, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(token_logprob(&row, 4, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(token_logprob(&row, 99, 0).logprob, f32::NEG_INFINITY);
    }

    #[test]
    fn degenerate_rows_give_no_probability_and_no_panic() {
        let t = token_logprob(&[f32::NEG_INFINITY; 3], 1, 2);
        assert_eq!(t.logprob, f32::NEG_INFINITY);
        assert_eq!(t.top.len(), 2);
        assert!(token_logprob(&[], 0, 5).top.is_empty());
        let big = token_logprob(&[0.0; 50], 0, 100);
        assert_eq!(big.top.len(), MAX_TOP_LOGPROBS);
    }
}
