//! Successive halving and the Pareto frontier, on plain data: many candidates on short runs,
//! the better half again on runs twice as long, until one is left; and the candidates no other
//! beats on both of two figures.

use serde::{Deserialize, Serialize};

/// One rung of a halving schedule: how many candidates run, and for how long each.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RungPlan {
    pub candidates: usize,
    pub seconds: f64,
}

/// A halving schedule for a time budget. Every rung gets the same share of the budget; each
/// rung keeps half of the last one's candidates (rounded up), so each run is about twice as
/// long as on the rung before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub rungs: Vec<RungPlan>,
}

impl Plan {
    /// The most candidates (at most `max_candidates`, at least 1) whose schedule over
    /// `budget_s` gives every run of the first rung at least `min_run_s`.
    pub fn for_budget(budget_s: f64, min_run_s: f64, max_candidates: usize) -> Self {
        let fits = |n: usize| {
            let p = Self::with(n, budget_s);
            p.rungs.first().is_some_and(|r| r.seconds >= min_run_s)
        };
        let mut n = 1;
        while n < max_candidates && fits(n + 1) {
            n += 1;
        }
        Self::with(n.max(1), budget_s)
    }

    /// The schedule for `n` candidates over `budget_s`.
    pub fn with(n: usize, budget_s: f64) -> Self {
        let mut counts = vec![n.max(1)];
        while let Some(&last) = counts.last()
            && last > 1
        {
            counts.push(last.div_ceil(2));
        }
        let per_rung = budget_s.max(0.0) / counts.len() as f64;
        Self {
            rungs: counts
                .into_iter()
                .map(|c| RungPlan {
                    candidates: c,
                    seconds: per_rung / c as f64,
                })
                .collect(),
        }
    }

    /// Runs the schedule asks for in all.
    pub fn runs(&self) -> usize {
        self.rungs.iter().map(|r| r.candidates).sum()
    }
}

/// What a halving measured: per rung, each candidate's index and score; and the winner.
#[derive(Debug, Clone, PartialEq)]
pub struct Halving<S> {
    pub rungs: Vec<Vec<(usize, S)>>,
    /// The best of the last rung measured (`None` when nothing was measured).
    pub winner: Option<usize>,
    /// Stopped early: `measure` returned `None`.
    pub stopped: bool,
}

/// Successive halving over candidates `0..n` (at most the plan's first rung): `measure(i,
/// rung, seconds)` runs candidate `i` and returns its score (greater is better), or `None` to
/// stop. Each rung keeps the better half by score; ties keep the earlier candidate. Scores
/// that do not compare (NaN) rank last.
pub fn successive_halving<S: PartialOrd + Copy>(
    n: usize,
    plan: &Plan,
    measure: &mut dyn FnMut(usize, usize, f64) -> Option<S>,
) -> Halving<S> {
    let mut alive: Vec<usize> =
        (0..n.min(plan.rungs.first().map_or(0, |r| r.candidates))).collect();
    let mut out = Halving {
        rungs: Vec::new(),
        winner: None,
        stopped: false,
    };
    for (k, rung) in plan.rungs.iter().enumerate() {
        if alive.is_empty() {
            break;
        }
        let mut scored = Vec::new();
        for &i in &alive {
            match measure(i, k, rung.seconds) {
                Some(s) => scored.push((i, s)),
                None => {
                    out.stopped = true;
                    break;
                }
            }
        }
        // Best first; a stable sort keeps the earlier of equals first.
        scored.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap_or_else(|| rank_nan(&a.1).cmp(&rank_nan(&b.1)))
        });
        out.winner = scored.first().map(|s| s.0).or(out.winner);
        let keep = plan.rungs.get(k + 1).map_or(1, |r| r.candidates);
        alive = scored.iter().take(keep).map(|s| s.0).collect();
        out.rungs.push(scored);
        if out.stopped {
            break;
        }
    }
    out
}

/// Orders a score that does not compare with itself (NaN) after one that does.
fn rank_nan<S: PartialOrd>(s: &S) -> bool {
    s.partial_cmp(s).is_none()
}

/// Indices of the points no other point beats on both coordinates (greater is better): a
/// point is dropped when another is at least as good on both and better on one. Points with
/// a NaN coordinate are never on the frontier. Returned in ascending order of `x`.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let ok = |p: &(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let dominated = |i: usize| {
        let a = points[i];
        points
            .iter()
            .enumerate()
            .any(|(j, b)| j != i && ok(b) && b.0 >= a.0 && b.1 >= a.1 && (b.0 > a.0 || b.1 > a.1))
    };
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| ok(&points[i]) && !dominated(i))
        .collect();
    front.sort_by(|&i, &j| points[i].0.total_cmp(&points[j].0).then(i.cmp(&j)));
    front
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_halves_and_doubles_within_the_budget() {
        let p = Plan::with(8, 40.0);
        let counts: Vec<usize> = p.rungs.iter().map(|r| r.candidates).collect();
        assert_eq!(counts, vec![8, 4, 2, 1]);
        let secs: Vec<f64> = p.rungs.iter().map(|r| r.seconds).collect();
        assert_eq!(secs, vec![1.25, 2.5, 5.0, 10.0]);
        let total: f64 = p
            .rungs
            .iter()
            .map(|r| r.seconds * r.candidates as f64)
            .sum();
        assert!((total - 40.0).abs() < 1e-9);
        assert_eq!(p.runs(), 15);
        // Odd counts round up.
        let counts: Vec<usize> = (Plan::with(5, 1.0).rungs.iter())
            .map(|r| r.candidates)
            .collect();
        assert_eq!(counts, vec![5, 3, 2, 1]);
    }

    #[test]
    fn the_budget_sets_how_many_candidates_start() {
        // 40 s with runs of at least 1 s: 8 candidates (1.25 s each) fit, 9 do not (40/5/9).
        assert_eq!(Plan::for_budget(40.0, 1.0, 100).rungs[0].candidates, 8);
        assert_eq!(Plan::for_budget(40.0, 1.0, 3).rungs[0].candidates, 3);
        // Too little time for even two: one candidate gets all of it.
        let p = Plan::for_budget(0.5, 1.0, 10);
        assert_eq!(
            p.rungs,
            vec![RungPlan {
                candidates: 1,
                seconds: 0.5
            }]
        );
    }

    #[test]
    fn halving_keeps_the_better_half_and_finds_the_best() {
        let quality = [3.0, 9.0, 1.0, 7.0, 5.0, 8.0, 2.0, 6.0];
        let mut calls = Vec::new();
        let plan = Plan::with(8, 16.0);
        let h = successive_halving(8, &plan, &mut |i, rung, secs| {
            calls.push((i, rung, secs));
            Some(quality[i])
        });
        assert_eq!(h.winner, Some(1));
        assert!(!h.stopped);
        let ids = |k: usize| {
            let mut v: Vec<usize> = h.rungs[k].iter().map(|s| s.0).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(ids(0), (0..8).collect::<Vec<_>>());
        assert_eq!(ids(1), vec![1, 3, 5, 7]);
        assert_eq!(ids(2), vec![1, 5]);
        assert_eq!(ids(3), vec![1]);
        // Not a grid: 15 runs, longer each rung.
        assert_eq!(calls.len(), plan.runs());
        assert!(
            calls
                .windows(2)
                .all(|w| w[0].1 > w[1].1 || w[0].2 <= w[1].2)
        );
    }

    #[test]
    fn a_noisy_first_rung_is_corrected_later_and_stopping_keeps_the_best_so_far() {
        // Candidate 2 looks best on short runs only.
        let score = |i: usize, rung: usize| match (i, rung) {
            (2, 0) => 10.0,
            (2, _) => 1.0,
            (i, _) => i as f64,
        };
        let h = successive_halving(4, &Plan::with(4, 4.0), &mut |i, r, _| Some(score(i, r)));
        assert_eq!(h.winner, Some(3));

        let mut n = 0;
        let h = successive_halving(4, &Plan::with(4, 4.0), &mut |i, _, _| {
            n += 1;
            (n <= 5).then_some(i as f64)
        });
        assert!(h.stopped);
        assert_eq!(h.rungs.len(), 2);
        assert_eq!(h.winner, Some(3));
    }

    #[test]
    fn nan_scores_rank_last() {
        let h = successive_halving(3, &Plan::with(3, 3.0), &mut |i, _, _| {
            Some(if i == 0 { f64::NAN } else { i as f64 })
        });
        assert_eq!(h.winner, Some(2));
        assert_eq!(h.rungs[0].last().map(|s| s.0), Some(0));
    }

    #[test]
    fn the_frontier_drops_dominated_points() {
        let pts = [
            (1.0, 10.0), // front
            (2.0, 8.0),  // front
            (1.5, 7.0),  // beaten by (2, 8)
            (3.0, 3.0),  // front
            (3.0, 2.0),  // beaten by (3, 3)
            (f64::NAN, 100.0),
            (0.5, 10.0), // beaten by (1, 10)
        ];
        assert_eq!(pareto_front(&pts), vec![0, 1, 3]);
        // Equal points are both kept; none beats the other.
        assert_eq!(pareto_front(&[(1.0, 1.0), (1.0, 1.0)]), vec![0, 1]);
        assert!(pareto_front(&[]).is_empty());
    }
}
