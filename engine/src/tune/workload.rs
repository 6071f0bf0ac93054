//! What a tuning session loads the engine with ([`Workload`]): prompt and output length
//! distributions and the arrival process, given as fixed lengths, as a named preset
//! ([`PRESETS`]), or read from a recorded trace of a server's requests ([`Trace`]: one JSON
//! line per finished request, [`TraceEntry`], as `tpslab serve --record-trace FILE` writes
//! them). A trace is hostile input like any file: its size, its line count and each line are
//! bounded, and a line that does not parse is an error naming it.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::serving::loadgen::{LenDist, LoadSpec};

/// The load a tuning session measures under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub prompt_len: LenDist,
    pub output_len: LenDist,
    /// Closed loop at this many requests in flight (with `rate`: the most in flight).
    pub concurrency: Option<usize>,
    /// Poisson arrivals at this many requests per second.
    pub rate: Option<f64>,
}

/// Named workload shapes (prompt and output lengths drawn uniformly from these ranges): what
/// a user picks when there is no trace of their own traffic yet. Shapes, not statistics of a
/// dataset.
pub const PRESETS: [Preset; 4] = [
    Preset::new("chat", (64, 512), (32, 256)),
    Preset::new("summarize", (1024, 2048), (64, 192)),
    Preset::new("code-completion", (256, 1024), (8, 64)),
    Preset::new("long-context", (3072, 4096), (64, 256)),
];

/// A named workload shape: prompt and output length ranges (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    pub prompt: (usize, usize),
    pub output: (usize, usize),
}

impl Preset {
    const fn new(name: &'static str, prompt: (usize, usize), output: (usize, usize)) -> Self {
        Self {
            name,
            prompt,
            output,
        }
    }
}

/// Why a workload or a trace cannot make a run.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("no workload preset {name:.40?}; the presets are {known}")]
    Preset { name: String, known: String },
    /// Lengths, concurrency or rate that cannot make a run.
    #[error("{0}")]
    Invalid(&'static str),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {len} bytes, more than a trace's {MAX_TRACE_BYTES}")]
    TooLarge { path: PathBuf, len: u64 },
    /// A trace that is not requests the engine would take (which line, and why).
    #[error("{0}")]
    Trace(String),
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        source: Box<WorkloadError>,
    },
}

/// The prompt and output lengths of preset `name`.
pub fn preset(name: &str) -> Result<(LenDist, LenDist), WorkloadError> {
    let p = PRESETS
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| WorkloadError::Preset {
            name: name.to_string(),
            known: PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let u = |(min, max): (usize, usize)| LenDist::Uniform { min, max };
    Ok((u(p.prompt), u(p.output)))
}

impl Workload {
    /// Fixed lengths.
    pub fn fixed(
        prompt_len: usize,
        output_len: usize,
        concurrency: Option<usize>,
        rate: Option<f64>,
    ) -> Self {
        Self {
            prompt_len: LenDist::Fixed(prompt_len),
            output_len: LenDist::Fixed(output_len),
            concurrency,
            rate,
        }
    }

    /// The load generator's spec for a run of `seconds` (requests are sent during that time,
    /// then the run waits for them, at most `drain_s` more: what is still running then is cut):
    /// `seed` gives each run its own prompts, so no run finds another's in the prefix cache.
    pub fn load_spec(&self, seconds: f64, drain_s: f64, seed: u64) -> LoadSpec {
        let num_requests = match self.rate {
            Some(r) => ((r * seconds).ceil() as usize).max(1),
            None => 1 << 30,
        };
        LoadSpec {
            concurrency: self.concurrency,
            rate: self.rate,
            num_requests,
            prompt_len: self.prompt_len.clone(),
            output_len: self.output_len.clone(),
            seed,
            priority: 0,
            submit_for_s: Some(seconds),
            cut_after_s: Some(seconds + drain_s),
            temperature: 0.0,
        }
    }

    /// What is wrong with it, if anything.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let bad = |why| Err(WorkloadError::Invalid(why));
        if self.prompt_len.min() == 0 || self.output_len.min() == 0 {
            return bad("prompt and output lengths must be at least 1");
        }
        match (self.concurrency, self.rate) {
            (None, None) => bad("give a concurrency or an arrival rate"),
            (Some(0), _) => bad("concurrency must be at least 1"),
            (_, Some(r)) if !(r.is_finite() && r > 0.0) => {
                bad("the arrival rate must be a positive number of requests per second")
            }
            _ => Ok(()),
        }
    }

    /// "prompt 128 -> output 64 tokens, 8 in flight".
    pub fn label(&self) -> String {
        let load = match (self.concurrency, self.rate) {
            (c, Some(r)) => format!(
                "{r:.3} req/s{}",
                c.map_or(String::new(), |c| format!(", at most {c} in flight"))
            ),
            (c, None) => format!("{} in flight", c.unwrap_or(1)),
        };
        format!(
            "prompt {} -> output {} tokens, {load}",
            self.prompt_len, self.output_len
        )
    }
}

/// One finished request of a recorded trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// When it arrived, in seconds since the Unix epoch.
    pub t: f64,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// The most bytes of a trace file read, lines of one, and bytes of one line.
pub const MAX_TRACE_BYTES: u64 = 64 << 20;
pub const MAX_TRACE_LINES: usize = 1 << 20;
const MAX_LINE_BYTES: usize = 1024;
/// The longest length a trace line may give when the model's context is not known yet (the
/// engine then refuses longer requests itself).
pub const MAX_TRACE_LEN: usize = 1 << 20;

/// A recorded trace as the tuner uses it: the lengths seen (drawn from as they came) and the
/// mean arrival rate over the trace's span.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub prompt_len: LenDist,
    pub output_len: LenDist,
    /// Requests per second over the span (`None` for a trace of one request or one instant).
    pub rate: Option<f64>,
    pub requests: usize,
}

impl Trace {
    /// Reads a trace file: JSON lines of [`TraceEntry`], blank lines skipped. Lengths past
    /// `max_len` (the model's context) are refused, as the engine would refuse the request.
    pub fn read(path: &Path, max_len: usize) -> Result<Self, WorkloadError> {
        Ok(Self::of_entries(&Self::read_entries(path, max_len)?))
    }

    /// Replays the trace into `w`: its lengths, and its mean arrival rate when `take_rate`.
    pub fn apply(self, w: &mut Workload, take_rate: bool) {
        (w.prompt_len, w.output_len) = (self.prompt_len, self.output_len);
        if take_rate {
            w.rate = self.rate;
        }
    }

    /// "12 requests, 0.250 req/s".
    pub fn summary(&self) -> String {
        let rate = self
            .rate
            .map_or("no arrival rate (one instant)".into(), |r| {
                format!("{r:.3} req/s")
            });
        format!("{} requests, {rate}", self.requests)
    }

    /// [`Self::read`] over any reader.
    pub fn parse(r: impl BufRead, max_len: usize) -> Result<Self, WorkloadError> {
        Ok(Self::of_entries(&Self::parse_entries(r, max_len)?))
    }

    /// The lengths and mean rate of checked entries.
    fn of_entries(entries: &[TraceEntry]) -> Self {
        let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
        for e in entries {
            first = first.min(e.t);
            last = last.max(e.t);
        }
        let requests = entries.len();
        let span = last - first;
        Self {
            prompt_len: LenDist::Samples(entries.iter().map(|e| e.prompt_tokens).collect()),
            output_len: LenDist::Samples(entries.iter().map(|e| e.completion_tokens).collect()),
            rate: (requests > 1 && span > 0.0).then(|| (requests - 1) as f64 / span),
            requests,
        }
    }

    /// A trace file's entries, in file order, checked as [`Self::read`] checks them (what the
    /// fleet simulator replays with their arrival times).
    pub fn read_entries(path: &Path, max_len: usize) -> Result<Vec<TraceEntry>, WorkloadError> {
        let err = |source| WorkloadError::Io {
            path: path.into(),
            source,
        };
        let len = std::fs::metadata(path).map_err(err)?.len();
        if len > MAX_TRACE_BYTES {
            return Err(WorkloadError::TooLarge {
                path: path.into(),
                len,
            });
        }
        let file = std::fs::File::open(path).map_err(err)?;
        Self::parse_entries(BufReader::new(file.take(MAX_TRACE_BYTES)), max_len).map_err(|e| {
            WorkloadError::InFile {
                path: path.into(),
                source: Box::new(e),
            }
        })
    }

    /// The entries of a trace over any reader: JSON lines of [`TraceEntry`], blank lines
    /// skipped, each line, its length and their count bounded; at least one entry.
    pub fn parse_entries(
        mut r: impl BufRead,
        max_len: usize,
    ) -> Result<Vec<TraceEntry>, WorkloadError> {
        let bad = WorkloadError::Trace;
        let mut entries = Vec::new();
        let mut line = Vec::new();
        for n in 1.. {
            line.clear();
            // At most one byte past the cap per line: a longer line is refused, never held.
            let got = (&mut r)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| bad(e.to_string()))?;
            if got == 0 {
                break;
            }
            if line.len() > MAX_LINE_BYTES {
                return Err(bad(format!(
                    "line {n} is longer than {MAX_LINE_BYTES} bytes"
                )));
            }
            let text = String::from_utf8_lossy(&line);
            if text.trim().is_empty() {
                continue;
            }
            if entries.len() == MAX_TRACE_LINES {
                return Err(bad(format!("more than {MAX_TRACE_LINES} requests")));
            }
            let e: TraceEntry = serde_json::from_str(text.trim())
                .map_err(|e| bad(format!("line {n}: not a trace entry ({e})")))?;
            if !e.t.is_finite() || e.t < 0.0 {
                return Err(bad(format!(
                    "line {n}: t must be a time in seconds, not {}",
                    e.t
                )));
            }
            for (what, v) in [
                ("prompt_tokens", e.prompt_tokens),
                ("completion_tokens", e.completion_tokens),
            ] {
                if v == 0 || v > max_len {
                    return Err(bad(format!(
                        "line {n}: {what} = {v}, not within 1..={max_len}"
                    )));
                }
            }
            entries.push(e);
        }
        if entries.is_empty() {
            return Err(bad("the trace holds no request".into()));
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_gives_its_lengths_and_its_rate() {
        let text = "{\"t\": 100.0, \"prompt_tokens\": 10, \"completion_tokens\": 5}\n\n\
                    {\"t\": 102.0, \"prompt_tokens\": 30, \"completion_tokens\": 7}\n\
                    {\"t\": 104.0, \"prompt_tokens\": 20, \"completion_tokens\": 9}\n";
        let t = Trace::parse(text.as_bytes(), 100).expect("trace");
        assert_eq!(t.requests, 3);
        assert_eq!(t.prompt_len, LenDist::Samples(vec![10, 30, 20]));
        assert_eq!(t.output_len.mean(), 7.0);
        assert_eq!(t.rate, Some(0.5));
        assert_eq!(t.prompt_len.to_string(), "10-30, mean 20, of 3 recorded");
        let one = Trace::parse(
            &b"{\"t\":1,\"prompt_tokens\":1,\"completion_tokens\":1}"[..],
            9,
        );
        assert_eq!(one.expect("one").rate, None);
    }

    #[test]
    fn a_hostile_trace_is_refused_by_line_without_holding_it() {
        let bad = |text: &[u8]| Trace::parse(text, 100).expect_err("refused").to_string();
        assert!(bad(b"").contains("no request"));
        assert!(bad(b"{\"t\":1}\n").starts_with("line 1: not a trace entry"));
        assert!(bad(b"{\"t\":-1,\"prompt_tokens\":1,\"completion_tokens\":1}").contains("t must"));
        let huge = b"{\"t\":1,\"prompt_tokens\":101,\"completion_tokens\":1}\n";
        assert!(bad(huge).contains("prompt_tokens = 101"));
        let zero = b"{\"t\":1,\"prompt_tokens\":5,\"completion_tokens\":0}\n";
        assert!(bad(zero).contains("completion_tokens = 0"));
        // One endless line: refused at the cap, not read to its end.
        let endless = std::io::repeat(b'x').take(1 << 30);
        let e = Trace::parse(BufReader::new(endless), 100)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("longer than"), "{e}");
    }

    #[test]
    fn presets_are_named_ranges() {
        let (p, o) = preset("chat").expect("chat");
        assert_eq!((p.min(), p.max(), o.min(), o.max()), (64, 512, 32, 256));
        assert!(
            preset("nope")
                .expect_err("unknown")
                .to_string()
                .contains("chat, summarize")
        );
        for Preset { name, .. } in PRESETS {
            let (p, o) = preset(name).expect("preset");
            let w = Workload {
                prompt_len: p,
                output_len: o,
                concurrency: Some(1),
                rate: None,
            };
            assert!(w.check().is_ok(), "{name}");
        }
    }
}
