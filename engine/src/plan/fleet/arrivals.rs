//! The requests a fleet replay sends: arrival times with prompt and output lengths, generated
//! from lengths (a tuner preset's, or a trace's) at a rate whose shape over time is steady, a
//! burst or a daily curve, or taken from a recorded trace with its own times, rescaled to a
//! target mean rate.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::{FleetError, check_num};
use crate::serving::loadgen::LenDist;
use crate::tune::workload::{MAX_TRACE_LEN, TraceEntry};

/// The most requests one replay sends.
pub const MAX_REQUESTS: usize = 1 << 22;
/// The longest span of arrivals, s (30 days).
pub const MAX_SPAN_S: f64 = 30.0 * 86_400.0;

/// One request of a replay: when it arrives (s from the start) and its lengths in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Arrival {
    pub t: f64,
    pub prompt: u32,
    pub output: u32,
}

/// How the arrival rate moves over time around the base rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "shape", rename_all = "snake_case")]
pub enum RateShape {
    /// The base rate throughout.
    Steady,
    /// `factor` times the base rate from `at_s` for `for_s` seconds.
    Burst { at_s: f64, for_s: f64, factor: f64 },
    /// `rate (1 - swing cos(2 pi t / period_s))`: a trough at the start, a peak half a period
    /// later, the base rate as the mean over a period.
    Daily { period_s: f64, swing: f64 },
}

impl RateShape {
    /// The rate's multiple of the base rate at `t`.
    fn factor(&self, t: f64) -> f64 {
        match *self {
            RateShape::Steady => 1.0,
            RateShape::Burst {
                at_s,
                for_s,
                factor,
            } if t >= at_s && t < at_s + for_s => factor,
            RateShape::Burst { .. } => 1.0,
            RateShape::Daily { period_s, swing } => {
                1.0 - swing * (2.0 * std::f64::consts::PI * t / period_s).cos()
            }
        }
    }

    /// The largest multiple over the whole span.
    fn peak(&self) -> f64 {
        match *self {
            RateShape::Steady => 1.0,
            RateShape::Burst { factor, .. } => factor.max(1.0),
            RateShape::Daily { swing, .. } => 1.0 + swing,
        }
    }

    /// What is wrong with it, if anything (each field bounded, so the peak bounds the count).
    fn check(&self) -> Result<(), FleetError> {
        match *self {
            RateShape::Steady => Ok(()),
            RateShape::Burst {
                at_s,
                for_s,
                factor,
            } => {
                check_num("burst start", at_s, 0.0, Some(MAX_SPAN_S))?;
                check_num("burst length", for_s, 0.0, Some(MAX_SPAN_S))?;
                check_num("burst factor", factor, 0.0, Some(1e4))
            }
            RateShape::Daily { period_s, swing } => {
                check_num("daily period", period_s, 1.0, Some(MAX_SPAN_S))?;
                check_num("daily swing", swing, 0.0, Some(1.0))
            }
        }
    }
}

/// A generated workload: lengths drawn from distributions, arrivals a Poisson process whose rate
/// is `rate` times `shape`'s factor, for `duration_s` seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub prompt_len: LenDist,
    pub output_len: LenDist,
    /// Base rate, requests per second.
    pub rate: f64,
    pub duration_s: f64,
    pub shape: RateShape,
    pub seed: u64,
}

fn check_len(field: &str, d: &LenDist) -> Result<(), FleetError> {
    if d.min() == 0 || d.max() > MAX_TRACE_LEN {
        return Err(FleetError::invalid(
            field,
            format!("lengths must be within 1..={MAX_TRACE_LEN}, not {d}"),
        ));
    }
    Ok(())
}

/// The arrivals of `g`, sorted by time: a non-homogeneous Poisson process drawn by thinning
/// (candidates at the peak rate, each kept with the share of the peak the rate is at then).
pub fn generate(g: &Generated) -> Result<Vec<Arrival>, FleetError> {
    check_num("rate", g.rate, 0.0, Some(1e7))?;
    if g.rate == 0.0 {
        return Err(FleetError::invalid(
            "rate",
            "must be more than 0 requests per second",
        ));
    }
    check_num("duration", g.duration_s, 0.0, Some(MAX_SPAN_S))?;
    g.shape.check()?;
    check_len("prompt length", &g.prompt_len)?;
    check_len("output length", &g.output_len)?;
    let peak = g.rate * g.shape.peak();
    // Candidates are drawn at the peak rate: bound their count before drawing any.
    let candidates = peak * g.duration_s;
    if candidates > MAX_REQUESTS as f64 {
        return Err(FleetError::Bound {
            what: "requests",
            limit: format!("{MAX_REQUESTS}; this workload would send about {candidates:.0}"),
            hint: "lower the rate or the duration",
        });
    }
    let mut rng = StdRng::seed_from_u64(g.seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        t += -u.ln() / peak;
        if t >= g.duration_s {
            break;
        }
        let keep: f64 = rng.random_range(0.0..1.0);
        if keep * g.shape.peak() < g.shape.factor(t) {
            out.push(Arrival {
                t,
                prompt: g.prompt_len.draw(&mut rng) as u32,
                output: g.output_len.draw(&mut rng) as u32,
            });
        }
    }
    Ok(out)
}

/// A recorded trace's requests at their own times from the first one, sorted; with
/// `target_rate`, its times are stretched or compressed so that its mean rate is that.
pub fn from_trace(
    entries: &[TraceEntry],
    target_rate: Option<f64>,
) -> Result<Vec<Arrival>, FleetError> {
    if entries.len() > MAX_REQUESTS {
        return Err(FleetError::Bound {
            what: "requests",
            limit: format!("{MAX_REQUESTS}; the trace holds {}", entries.len()),
            hint: "replay part of the trace",
        });
    }
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let line = format!("trace entry {}", i + 1);
        check_num(&format!("{line}: t"), e.t, 0.0, None)?;
        for (what, v) in [
            ("prompt_tokens", e.prompt_tokens),
            ("completion_tokens", e.completion_tokens),
        ] {
            if v == 0 || v > MAX_TRACE_LEN {
                return Err(FleetError::invalid(
                    format!("{line}: {what}"),
                    format!("must be within 1..={MAX_TRACE_LEN}, not {v}"),
                ));
            }
        }
        out.push(Arrival {
            t: e.t,
            prompt: e.prompt_tokens as u32,
            output: e.completion_tokens as u32,
        });
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    let first = out.first().map_or(0.0, |a| a.t);
    let span = out.last().map_or(0.0, |a| a.t) - first;
    let scale = match target_rate {
        None => 1.0,
        Some(r) => {
            check_num("rate", r, 0.0, Some(1e7))?;
            if r == 0.0 || out.len() < 2 || span <= 0.0 {
                return Err(FleetError::invalid(
                    "rate",
                    "a trace can be scaled to a rate only when it spans some time and the rate is more than 0",
                ));
            }
            let own = (out.len() - 1) as f64 / span;
            own / r
        }
    };
    if span * scale > MAX_SPAN_S {
        return Err(FleetError::invalid(
            "trace span",
            format!("{:.0} s after scaling, past {MAX_SPAN_S} s", span * scale),
        ));
    }
    for a in &mut out {
        a.t = (a.t - first) * scale;
    }
    Ok(out)
}

/// The arrivals as a trace file's JSON lines (what `serve --record-trace` writes), so a
/// generated workload can be replayed or edited.
pub fn to_trace_lines(arrivals: &[Arrival]) -> String {
    let mut s = String::new();
    for a in arrivals {
        let e = TraceEntry {
            t: a.t,
            prompt_tokens: a.prompt as usize,
            completion_tokens: a.output as usize,
        };
        if let Ok(line) = serde_json::to_string(&e) {
            s.push_str(&line);
            s.push('\n');
        }
    }
    s
}
