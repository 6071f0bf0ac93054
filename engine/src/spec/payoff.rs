//! Whether a proposal pays for its verification. Verifying `d` proposed tokens makes the step
//! that carries them longer for every running request; it pays when the tokens the request can
//! expect to keep outweigh that. With `R` rows in a plain step taking `T(R)`:
//!
//! ```text
//! (R + E[kept | d]) / T(R + d)  >  R / T(R)
//! ```
//!
//! - `T` is measured: the time of decode-only steps by their rows ([`DecodeCost`]), each size
//!   an average of its recent steps, sizes not yet seen read off the line through their
//!   nearest measured neighbours, never below the plain step's. Until a plain step is measured nothing is proposed; a
//!   proposal length whose step cannot be estimated yet is tried (that measures it).
//! - `E[kept | d]` comes from the request's own record ([`Acceptance`]): each proposed token is
//!   kept with probability `a` until the first one rejected, so `E = a (1 - a^d) / (1 - a)`,
//!   `a` estimated from the request's recent proposals with a prior of half a token kept and
//!   half rejected, a new request starting from every request's recent rate.
//! - While its proposals do not pay, a request's n-gram proposal is still made (it costs
//!   microseconds) but not verified: it is checked against the tokens the request goes on to
//!   emit, which for a proposal of single tokens is exactly what verification would have found
//!   (greedy: the same token; sampled: kept with the probability the sampler gives it). So the
//!   estimate keeps moving and proposals resume as soon as the text starts to repeat. A
//!   drafter's proposals cost a forward pass: those are probed once every [`PROBE_STEPS`]
//!   steps instead.

/// The most rows a step's time is kept for (larger steps are read off the line).
pub const MAX_ROWS: usize = 128;

/// The weight of the newest step in a size's average.
const STEP_WEIGHT: f64 = 0.2;

/// A proposal is verified only when it is expected to gain at least this much (a margin for
/// the noise in the measured times).
pub const MIN_GAIN: f64 = 1.03;

/// Steps between probes of a drafter whose proposals did not pay.
pub const PROBE_STEPS: u32 = 64;

/// How many proposed tokens of its own every request's recent acceptance counts as in a new
/// request's record (about a quarter of the window [`FORGET`] keeps).
const SEED_TOKENS: f64 = 8.0;

/// The weight older observations keep at each new one in a request's acceptance (about the
/// last 30 proposed tokens count).
const FORGET: f64 = 0.97;

/// The time of decode-only steps by their rows, plus the proposer's time per step.
#[derive(Debug, Clone)]
pub struct DecodeCost {
    ms: Vec<Option<f64>>,
    /// Proposing's time in steps that proposed (ms), averaged.
    propose_ms: f64,
}

impl Default for DecodeCost {
    fn default() -> Self {
        Self {
            ms: vec![None; MAX_ROWS + 1],
            propose_ms: 0.0,
        }
    }
}

impl DecodeCost {
    /// A decode-only step of `rows` rows (proposed tokens included) took `ms`.
    pub fn observe(&mut self, rows: usize, ms: f64) {
        if rows == 0 || rows > MAX_ROWS || !ms.is_finite() || ms <= 0.0 {
            return;
        }
        let slot = &mut self.ms[rows];
        *slot = Some(slot.map_or(ms, |old| old + STEP_WEIGHT * (ms - old)));
    }

    /// Proposing took `ms` before a step.
    pub fn observe_propose(&mut self, ms: f64) {
        if ms.is_finite() && ms >= 0.0 {
            self.propose_ms += STEP_WEIGHT * (ms - self.propose_ms);
        }
    }

    /// The expected time of a step of `rows` rows: measured, or on the line through the
    /// nearest measured sizes (both sides if there are, else the two nearest on one side);
    /// `None` while fewer than that are known.
    pub fn at(&self, rows: usize) -> Option<f64> {
        if let Some(ms) = self.ms.get(rows).copied().flatten() {
            return Some(ms);
        }
        let known = |r: usize| self.ms.get(r).copied().flatten().map(|ms| (r as f64, ms));
        let below: Vec<(f64, f64)> = (1..rows.min(MAX_ROWS + 1))
            .rev()
            .filter_map(known)
            .take(2)
            .collect();
        let above: Vec<(f64, f64)> = (rows + 1..=MAX_ROWS).filter_map(known).take(2).collect();
        let (p, q) = match (below.as_slice(), above.as_slice()) {
            ([b, ..], [a, ..]) => (*b, *a),
            ([b1, b2], []) => (*b2, *b1),
            ([], [a1, a2]) => (*a1, *a2),
            _ => return None,
        };
        let slope = (q.1 - p.1) / (q.0 - p.0);
        Some((p.1 + slope * (rows as f64 - p.0)).max(p.1.min(q.1)))
    }

    /// The proposal length (at most `max`) that gains most for a request expecting `acc`, in a
    /// step of `rows` plain rows, with its expected gain ([`StepTimes::best_len`]).
    pub fn best_len(&self, rows: usize, acc: &Acceptance, max: usize) -> (usize, f64) {
        self.for_step(rows, max).best_len(acc, max)
    }

    /// The expected times of a step of `rows` plain rows and of it with 1..=`max` proposed
    /// tokens more: looked up once per step, then weighed for each request.
    pub fn for_step(&self, rows: usize, max: usize) -> StepTimes {
        let rows = rows.max(1);
        StepTimes {
            rows: rows as f64,
            base: self.at(rows),
            with: (1..=max).map(|d| self.at(rows + d)).collect(),
            propose_ms: self.propose_ms,
        }
    }
}

/// A step's expected times, plain and with `d` proposed tokens more ([`DecodeCost::for_step`]).
#[derive(Debug, Clone)]
pub struct StepTimes {
    rows: f64,
    base: Option<f64>,
    /// Entry `d - 1`: the step with `d` proposed tokens.
    with: Vec<Option<f64>>,
    propose_ms: f64,
}

impl StepTimes {
    /// The proposal length (at most `max`, at most the lengths looked up) that gains most for
    /// a request expecting `acc`, with its expected gain; `(0, 1.0)` when none gains
    /// [`MIN_GAIN`]. While a plain step's time is unknown nothing is proposed (the plain step
    /// measures it); while the longest proposal's cannot be estimated, it is tried (gain
    /// unknown: infinite), which measures it.
    pub fn best_len(&self, acc: &Acceptance, max: usize) -> (usize, f64) {
        let max = max.min(self.with.len());
        let Some(base) = self.base else {
            return (0, 1.0);
        };
        if max > 0 && self.with[max - 1].is_none() {
            return (max, f64::INFINITY);
        }
        let mut best = (0, 1.0);
        for (d, t) in (1..=max).zip(&self.with) {
            let Some(t) = *t else {
                continue;
            };
            // A longer step never takes less time (a plain step measured long ago, on a
            // colder cache, must not make proposals look free).
            let t = t.max(base);
            let with = (self.rows + acc.expected(d)) / (t + self.propose_ms);
            let gain = with / (self.rows / base);
            if gain > best.1 {
                best = (d, gain);
            }
        }
        if best.1 < MIN_GAIN { (0, 1.0) } else { best }
    }
}

/// How one request's proposals fare: kept and rejected proposed tokens (recent ones weigh
/// more), and a proposal held back, checked against the tokens the request emits.
#[derive(Debug, Clone, Default)]
pub struct Acceptance {
    kept: f64,
    rejected: f64,
    /// A proposal not verified, and how much of it the emitted tokens have matched so far.
    shadow: Vec<u32>,
    matched: usize,
    /// Steps since a drafter's proposal was last verified for it.
    pub idle_steps: u32,
}

impl Acceptance {
    /// The estimated chance that a proposed token is kept.
    pub fn rate(&self) -> f64 {
        (self.kept + 0.5) / (self.kept + self.rejected + 1.0)
    }

    /// Expected tokens kept of a proposal of `d`.
    pub fn expected(&self, d: usize) -> f64 {
        let a = self.rate();
        if a >= 1.0 - 1e-9 {
            return d as f64;
        }
        a * (1.0 - a.powi(d as i32)) / (1.0 - a)
    }

    /// A new request's record: the prior, plus the recent acceptance of every request (`all`)
    /// weighing as much as [`SEED_TOKENS`] proposed tokens of its own. On text whose proposals rarely land
    /// a new request does not spend its first steps finding that out again.
    pub fn seeded(all: &Acceptance) -> Self {
        let a = all.rate();
        Self {
            kept: SEED_TOKENS * a,
            rejected: SEED_TOKENS * (1.0 - a),
            ..Self::default()
        }
    }

    /// Adds `kept` proposed tokens kept and `rejected` rejected (the record of every request,
    /// fed with each request's outcomes).
    pub fn count(&mut self, kept: usize, rejected: usize) {
        for _ in 0..kept {
            self.kept = self.kept * FORGET + 1.0;
            self.rejected *= FORGET;
        }
        for _ in 0..rejected {
            self.kept *= FORGET;
            self.rejected = self.rejected * FORGET + 1.0;
        }
    }

    /// A verified proposal of `proposed` tokens kept `kept` of them (the first rejection ends
    /// a proposal: the ones after it say nothing). Returns the rejections counted (0 or 1).
    pub fn verified(&mut self, proposed: usize, kept: usize) -> usize {
        self.shadow.clear();
        self.idle_steps = 0;
        let rejected = usize::from(proposed > 0 && kept < proposed);
        if proposed > 0 {
            self.count(kept, rejected);
        }
        rejected
    }

    /// Whether a held-back proposal is still being checked.
    pub fn checking(&self) -> bool {
        !self.shadow.is_empty()
    }

    /// Holds `proposal` back, to check it against the next tokens emitted.
    pub fn hold(&mut self, proposal: Vec<u32>) {
        self.shadow = proposal;
        self.matched = 0;
    }

    /// The request emitted `token`: a held-back proposal's next token is kept (`Some(true)`)
    /// or rejected (`Some(false)`); `None` when none is being checked.
    pub fn emitted(&mut self, token: u32) -> Option<bool> {
        let &want = self.shadow.get(self.matched)?;
        if want == token {
            self.matched += 1;
            self.count(1, 0);
            if self.matched == self.shadow.len() {
                self.shadow.clear();
            }
            Some(true)
        } else {
            self.count(0, 1);
            self.shadow.clear();
            Some(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step cost of `fixed + per_row * rows` measured at `sizes`.
    fn cost(fixed: f64, per_row: f64, sizes: &[usize]) -> DecodeCost {
        let mut c = DecodeCost::default();
        for &r in sizes {
            c.observe(r, fixed + per_row * r as f64);
        }
        c
    }

    #[test]
    fn step_times_not_yet_known_are_measured_first() {
        let a = Acceptance::default();
        // No plain step yet: none proposed, so the next (plain) step measures it.
        assert_eq!(DecodeCost::default().best_len(1, &a, 4).0, 0);
        // A plain step only: the longest proposal is tried, which measures its step.
        assert_eq!(cost(10.0, 1.0, &[1]).best_len(1, &a, 4).0, 4);
        // Both known: the prior's best (keeping each with chance 1/2, two tokens gain most).
        assert_eq!(cost(10.0, 1.0, &[1, 5]).best_len(1, &a, 4).0, 2);
    }

    #[test]
    fn unseen_sizes_are_read_off_the_line_through_their_neighbours() {
        let c = cost(10.0, 1.0, &[1, 5, 9]);
        assert_eq!(c.at(5), Some(15.0));
        assert!((c.at(3).expect("3 rows") - 13.0).abs() < 1e-9);
        assert!((c.at(12).expect("12 rows") - 22.0).abs() < 1e-9);
        assert_eq!(cost(10.0, 1.0, &[1]).at(3), None);
    }

    #[test]
    fn a_request_whose_proposals_are_never_kept_stops_verifying() {
        // Verifying 4 tokens makes a one-row step 40% longer.
        let c = cost(10.0, 1.0, &[1, 5]);
        let mut a = Acceptance::default();
        assert!(c.best_len(1, &a, 4).0 > 0, "the prior tries proposals");
        let mut verified = 0;
        for _ in 0..50 {
            let (d, _) = c.best_len(1, &a, 4);
            if d == 0 {
                break;
            }
            a.verified(d, 0);
            verified += 1;
        }
        assert_eq!(c.best_len(1, &a, 4).0, 0);
        assert!(
            verified < 10,
            "{verified} rejected proposals before stopping"
        );
        // Held back, its proposals match what it emits again: verification resumes.
        for _ in 0..20 {
            a.hold(vec![7, 8]);
            a.emitted(7);
            a.emitted(8);
        }
        assert!(c.best_len(1, &a, 4).0 > 0, "rate {}", a.rate());
    }

    #[test]
    fn a_longer_step_measured_faster_does_not_make_proposals_free() {
        // The plain step was last measured slow (a cold first step): verification still
        // costs at least a plain step, so proposals that are never kept stop.
        let mut c = cost(10.0, 1.0, &[2, 5]);
        c.observe(1, 30.0);
        let mut a = Acceptance::default();
        for _ in 0..40 {
            a.verified(1, 0);
        }
        assert_eq!(c.best_len(1, &a, 4).0, 0);
    }

    #[test]
    fn proposals_pay_less_as_the_batch_grows() {
        // A step of 64 rows is compute-bound: each extra row costs as much as it adds.
        let c = cost(10.0, 1.0, &[1, 5, 64, 68]);
        let mut a = Acceptance::default();
        for _ in 0..10 {
            a.verified(4, 2);
        }
        assert!(c.best_len(1, &a, 4).0 > 0);
        assert_eq!(c.best_len(64, &a, 4).0, 0);
    }

    #[test]
    fn a_new_request_starts_from_every_requests_recent_acceptance() {
        let mut all = Acceptance::default();
        all.count(0, 40);
        let c = cost(10.0, 1.0, &[1, 5]);
        assert_eq!(c.best_len(1, &Acceptance::seeded(&all), 4).0, 0);
        let mut all = Acceptance::default();
        all.count(40, 5);
        assert!(c.best_len(1, &Acceptance::seeded(&all), 4).0 > 0);
    }

    #[test]
    fn a_held_back_proposal_counts_until_its_first_miss() {
        let mut a = Acceptance::default();
        a.hold(vec![1, 2, 3]);
        assert!(a.checking());
        assert_eq!(a.emitted(1), Some(true));
        assert_eq!(a.emitted(9), Some(false));
        assert!(!a.checking());
        assert_eq!(a.emitted(3), None); // after the miss: nothing
        assert!((a.kept - 0.97).abs() < 1e-9 && (a.rejected - 1.0).abs() < 1e-9);
    }
}
