//! The adaptive token budget: a step-time model fitted online (step time = fixed cost + cost
//! per token, least squares with exponential forgetting) that sizes each step's token budget so
//! the running decodes keep their inter-token latency under a target. A step's tokens are its
//! decodes plus the prefill chunk beside them, so a smaller budget means a smaller chunk.
//!
//! Plain computation on the step times the engine reports; nothing here reads a clock.

/// Weight kept by older observations at each new one (about the last 50 steps count).
const FORGET: f64 = 0.98;

/// Observations needed before the model is trusted.
const MIN_OBSERVATIONS: u32 = 4;

/// `step_ms ≈ fixed_ms + per_token_ms * tokens`, fitted online.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepCost {
    // Exponentially weighted sums for the least-squares fit.
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    seen: u32,
}

impl StepCost {
    /// One step that ran `tokens` tokens in `step_ms`; nonsense (zero tokens, NaN, negative
    /// times) is ignored.
    pub fn observe(&mut self, tokens: usize, step_ms: f64) {
        if tokens == 0 || !step_ms.is_finite() || step_ms < 0.0 {
            return;
        }
        let x = tokens as f64;
        self.w = self.w * FORGET + 1.0;
        self.sx = self.sx * FORGET + x;
        self.sy = self.sy * FORGET + step_ms;
        self.sxx = self.sxx * FORGET + x * x;
        self.sxy = self.sxy * FORGET + x * step_ms;
        self.seen = self.seen.saturating_add(1);
    }

    /// The fitted `(fixed_ms, per_token_ms)`, once enough steps of different sizes were seen.
    /// The cost per token is never below a small positive floor and the fixed cost never below
    /// zero, so the budget it gives is finite and grows with the target.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.seen < MIN_OBSERVATIONS || self.w <= 0.0 {
            return None;
        }
        let (mx, my) = (self.sx / self.w, self.sy / self.w);
        let var = self.sxx / self.w - mx * mx;
        let per_token = if var > 1e-9 {
            (self.sxy / self.w - mx * my) / var
        } else {
            // Every step had the same size: all of its time is put on its tokens.
            my / mx.max(1.0)
        };
        let per_token = per_token.max(1e-6);
        let fixed = (my - per_token * mx).max(0.0);
        Some((fixed, per_token))
    }

    /// The most tokens a step may run to take at most `target_ms` (`None` before the model is
    /// fitted).
    pub fn tokens_within(&self, target_ms: f64) -> Option<usize> {
        let (fixed, per_token) = self.fit()?;
        // The small slack keeps a fit that is exact up to rounding from losing a token.
        let n = ((target_ms - fixed) / per_token + 1e-6).floor();
        Some(if n.is_finite() && n > 0.0 {
            n.min(usize::MAX as f64 / 2.0) as usize
        } else {
            0
        })
    }
}

/// The step's token budget under the adaptive policy: with requests decoding, what the model
/// says fits in `target_ms`, but never below `floor` (each decode's token and a minimal chunk,
/// so nothing starves) nor above `max`. Without decodes (no inter-token latency to protect) or
/// before the model is fitted, `max`.
pub fn budget(cost: &StepCost, target_ms: f64, decodes: usize, floor: usize, max: usize) -> usize {
    if decodes == 0 {
        return max;
    }
    match cost.tokens_within(target_ms) {
        Some(n) => n.max(floor).min(max),
        None => max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_linear_step_cost() {
        let mut c = StepCost::default();
        assert_eq!(c.fit(), None);
        for n in [1, 64, 8, 256, 32, 128, 16] {
            c.observe(n, 5.0 + 0.5 * n as f64);
        }
        let (fixed, per) = c.fit().expect("fitted");
        assert!((fixed - 5.0).abs() < 1e-6, "{fixed}");
        assert!((per - 0.5).abs() < 1e-9, "{per}");
        // 5 + 0.5 n <= 30  =>  n <= 50.
        assert_eq!(c.tokens_within(30.0), Some(50));
        assert_eq!(c.tokens_within(1.0), Some(0));
    }

    #[test]
    fn the_budget_follows_the_target_within_floor_and_max() {
        let mut c = StepCost::default();
        for n in [10, 20, 40, 80] {
            c.observe(n, 2.0 + n as f64);
        }
        assert_eq!(budget(&c, 50.0, 4, 8, 2048), 48);
        assert_eq!(budget(&c, 1.0, 4, 8, 2048), 8, "never below the floor");
        assert_eq!(budget(&c, 1e9, 4, 8, 2048), 2048, "never above the cap");
        assert_eq!(
            budget(&c, 50.0, 0, 8, 2048),
            2048,
            "no decodes: the full cap"
        );
        assert_eq!(budget(&StepCost::default(), 50.0, 4, 8, 2048), 2048);
    }

    #[test]
    fn nonsense_observations_are_ignored() {
        let mut c = StepCost::default();
        for _ in 0..10 {
            c.observe(0, 5.0);
            c.observe(5, f64::NAN);
            c.observe(5, -1.0);
        }
        assert_eq!(c.fit(), None);
        // Steps of one size: the time is put on the tokens, a finite budget.
        for _ in 0..10 {
            c.observe(10, 20.0);
        }
        assert_eq!(c.tokens_within(40.0), Some(20));
    }
}
