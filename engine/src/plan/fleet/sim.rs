//! A fleet configuration, the discrete-event loop that replays arrivals against it (routing to
//! the least outstanding replica, shedding at the queue limit, autoscaling with a scale-up
//! delay and a cold start, billing each replica from the end of its scale-up delay to its
//! stop), and configurations compared against an SLO.

use std::collections::BinaryHeap;

use serde::Serialize;
use tpslab_kernels::WType;

use super::arrivals::{Arrival, MAX_SPAN_S};
use super::replica::{Knobs, Phase, Replica, Seq};
use super::stats::{Latency, Recorder, Summary, WindowStats};
use super::{FleetError, check_num};
use crate::plan::devices::{DeviceTable, Sourced};
use crate::plan::roofline::{ModelShape, StepModel};
use crate::serving::metrics::cost_per_million_output_tokens;

/// One replica of a configuration: a device of the table, a weight precision, the scheduler's
/// knobs, and the price of an hour of the device.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSpec {
    pub device: String,
    pub precision: WType,
    pub max_seqs: usize,
    pub token_budget: usize,
    /// $ per device-hour with its source; `None`: the device table's.
    pub usd_per_hour: Option<Sourced>,
}

/// What the autoscaler steers by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "metric", content = "target", rename_all = "snake_case")]
pub enum ScaleMetric {
    /// Requests waiting per ready replica.
    QueueDepth(f64),
    /// Mean share of the ready replicas' KV capacity in use.
    KvUse(f64),
}

/// The autoscaler: every `interval_s` it wants `ceil(ready x metric / target)` replicas (the
/// Kubernetes HPA rule), within `min..=max`; a new replica takes requests after
/// `scale_up_delay_s` and its cold start; one ready replica is drained after the fleet has
/// wanted fewer for `scale_down_after_s` (under the queue metric, and while the other ready
/// replicas could run every outstanding request at once: an empty queue alone would drain a
/// fleet in the middle of a burst).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Autoscale {
    pub min: usize,
    pub max: usize,
    pub metric: ScaleMetric,
    pub interval_s: f64,
    pub scale_up_delay_s: f64,
    pub scale_down_after_s: f64,
}

/// How long a new replica takes to load its weights once its machine is there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ColdStart {
    /// A measured figure, s.
    Measured { seconds: f64 },
    /// The weights' bytes over the slower of the disk (`disk_gb_s`, the user's figure) and the
    /// device table's host-to-device bandwidth.
    Load { disk_gb_s: f64 },
}

/// One configuration of a fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub name: String,
    pub replica: ReplicaSpec,
    pub autoscale: Autoscale,
    /// A replica whose queue holds this many requests refuses more (they are shed).
    pub queue_limit: usize,
    pub cold_start: ColdStart,
}

/// The bounds of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Limits {
    /// Events handled (arrivals, steps, ticks), all replicas together.
    pub max_events: u64,
    /// How long after the last arrival the replay goes on at most (then what is left is
    /// counted unfinished).
    pub drain_s: f64,
    pub window_s: f64,
    pub max_windows: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_events: 50_000_000,
            drain_s: 3600.0,
            window_s: 60.0,
            max_windows: 10_000,
        }
    }
}

/// The replicas ready and booting from `t` on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReplicaPoint {
    pub t: f64,
    pub ready: usize,
    pub booting: usize,
}

/// Objectives over a whole replay (P99s, ms) and the share of requests that may be refused.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Slo {
    pub ttft_p99_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    pub max_shed_share: f64,
}

/// One configuration's replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetReport {
    pub config: String,
    pub device: String,
    pub precision: String,
    pub max_seqs: usize,
    pub token_budget: usize,
    pub queue_limit: usize,
    pub autoscale: Autoscale,
    pub kv_capacity_tokens: u64,
    pub weights_gib: f64,
    pub cold_start_s: f64,
    /// How the cold start was found.
    pub cold_start_source: String,
    pub usd_per_hour: Sourced,
    pub summary: Summary,
    pub windows: Vec<WindowStats>,
    pub timeline: Vec<ReplicaPoint>,
    /// What of the SLO it misses (empty: it meets it); set by [`compare`].
    pub slo_misses: Option<Vec<String>>,
}

/// Several configurations' replays of one workload, and the cheapest that meets the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub slo: Slo,
    pub reports: Vec<FleetReport>,
    /// The name of the configuration with the lowest $ per million output tokens among those
    /// that meet the SLO.
    pub cheapest_meeting_slo: Option<String>,
}

fn check_config(c: &FleetConfig) -> Result<(), FleetError> {
    let f = |what: &str| format!("{}: {what}", c.name);
    let a = &c.autoscale;
    check_num(&f("min replicas"), a.min as f64, 1.0, Some(1000.0))?;
    check_num(&f("max replicas"), a.max as f64, a.min as f64, Some(1000.0))?;
    match a.metric {
        ScaleMetric::QueueDepth(t) => check_num(&f("target queue depth"), t, 0.01, Some(1e6))?,
        ScaleMetric::KvUse(t) => check_num(&f("target KV use"), t, 0.01, Some(1.0))?,
    }
    check_num(&f("autoscale interval"), a.interval_s, 0.1, Some(3600.0))?;
    check_num(
        &f("scale-up delay"),
        a.scale_up_delay_s,
        0.0,
        Some(86_400.0),
    )?;
    check_num(
        &f("scale-down wait"),
        a.scale_down_after_s,
        0.0,
        Some(MAX_SPAN_S),
    )?;
    check_num(&f("queue limit"), c.queue_limit as f64, 1.0, Some(1e7))?;
    check_num(
        &f("max sequences"),
        c.replica.max_seqs as f64,
        1.0,
        Some(65_536.0),
    )?;
    check_num(
        &f("token budget"),
        c.replica.token_budget as f64,
        1.0,
        Some(f64::from(1u32 << 24)),
    )?;
    match c.cold_start {
        ColdStart::Measured { seconds } => {
            check_num(&f("cold start"), seconds, 0.0, Some(86_400.0))?
        }
        ColdStart::Load { disk_gb_s } => {
            check_num(&f("disk bandwidth (GB/s)"), disk_gb_s, 1e-6, Some(1e6))?;
        }
    }
    if let Some(p) = &c.replica.usd_per_hour {
        check_num(&f("$ per device-hour"), p.value, 0.0, Some(1e6))?;
    }
    Ok(())
}

/// An event: a replica's step ends, a replica becomes ready, or the autoscaler looks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    StepEnd(usize),
    Ready(usize),
    Tick,
}

/// An event at its time; `seq` orders events of one instant as they were scheduled.
#[derive(Debug, Clone, Copy)]
struct Timed {
    t: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    /// Reversed, so the heap's top is the earliest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

/// The replay's state.
struct Sim<'a> {
    cfg: &'a FleetConfig,
    model: StepModel<'a>,
    knobs: Knobs,
    kv_cap: u64,
    cold_s: f64,
    replicas: Vec<Replica>,
    heap: BinaryHeap<Timed>,
    seq: u64,
    rec: Recorder,
    timeline: Vec<ReplicaPoint>,
    /// Since when the replica counts have been what they are (for their integral).
    counted_from: f64,
    wants_fewer_since: Option<f64>,
}

impl Sim<'_> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Timed {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn counts(&self) -> (usize, usize) {
        let ready = self
            .replicas
            .iter()
            .filter(|r| r.phase == Phase::Ready)
            .count();
        let booting = (self.replicas.iter())
            .filter(|r| matches!(r.phase, Phase::Booting { .. }))
            .count();
        (ready, booting)
    }

    /// Call before the replica counts change at `t`: integrates the counts up to `t`.
    fn account(&mut self, t: f64) {
        let (ready, booting) = self.counts();
        self.rec.replicas(self.counted_from, t, ready, booting);
        self.counted_from = t;
    }

    /// Call after the replica counts changed at `t`: a point of the timeline.
    fn mark(&mut self, t: f64) {
        let (ready, booting) = self.counts();
        if self
            .timeline
            .last()
            .is_none_or(|p| (p.ready, p.booting) != (ready, booting))
        {
            self.timeline.push(ReplicaPoint { t, ready, booting });
        }
    }

    /// Starts replica `i`'s next step at `t` if it has work; stops it if it is draining and
    /// empty.
    fn kick(&mut self, i: usize, t: f64) {
        let r = &mut self.replicas[i];
        if r.busy {
            return;
        }
        match r.start_step(&self.model, self.knobs) {
            Some(d) => {
                r.busy = true;
                self.push(t + d, Ev::StepEnd(i));
            }
            None if r.phase == Phase::Draining => {
                self.account(t);
                let r = &mut self.replicas[i];
                r.phase = Phase::Stopped;
                r.stopped_at = Some(t);
                self.mark(t);
            }
            None => {}
        }
    }

    fn arrive(&mut self, a: &Arrival) {
        self.rec.arrival(a.t);
        if u64::from(a.prompt) + u64::from(a.output) > self.kv_cap {
            self.rec.too_long(a.t);
            return;
        }
        let pick = (self.replicas.iter().enumerate())
            .filter(|(_, r)| r.phase == Phase::Ready)
            .min_by_key(|(i, r)| (r.outstanding(), *i))
            .map(|(i, _)| i);
        match pick {
            Some(i) if self.replicas[i].queued() < self.cfg.queue_limit => {
                self.replicas[i].enqueue(Seq::new(a.t, a.prompt, a.output));
                self.kick(i, a.t);
            }
            _ => self.rec.shed(a.t),
        }
    }

    fn launch(&mut self, t: f64) {
        let a = &self.cfg.autoscale;
        let billed_from = t + a.scale_up_delay_s;
        let ready_at = billed_from + self.cold_s;
        self.replicas.push(Replica::new(
            Phase::Booting { ready_at },
            billed_from,
            self.kv_cap,
        ));
        let i = self.replicas.len() - 1;
        self.push(ready_at, Ev::Ready(i));
    }

    /// Handles events in time order until none is left or the next is past `horizon`; returns
    /// the time of the last one handled.
    fn run(
        &mut self,
        arrivals: &[Arrival],
        horizon: f64,
        max_events: u64,
        overhead_s: f64,
    ) -> Result<f64, FleetError> {
        let (mut next, mut events, mut now) = (0usize, 0u64, 0.0f64);
        loop {
            let from_heap = self.heap.peek().map(|e| e.t);
            let arrival_t = arrivals.get(next).map(|a| a.t);
            let t = match (arrival_t, from_heap) {
                (None, None) => break,
                (Some(a), Some(h)) => a.min(h),
                (Some(a), None) => a,
                (None, Some(h)) => h,
            };
            if t > horizon {
                break;
            }
            events += 1;
            if events > max_events {
                return Err(FleetError::Bound {
                    what: "events",
                    limit: max_events.to_string(),
                    hint: "replay fewer requests or a shorter span",
                });
            }
            now = t;
            // Arrivals go before other events of the same instant.
            if arrival_t.is_some_and(|a| a <= from_heap.unwrap_or(f64::INFINITY)) {
                self.arrive(&arrivals[next]);
                next += 1;
                continue;
            }
            let Some(e) = self.heap.pop() else { break };
            match e.ev {
                Ev::StepEnd(i) => {
                    self.replicas[i].finish_step(t, overhead_s, &mut self.rec);
                    self.replicas[i].busy = false;
                    self.kick(i, t);
                }
                Ev::Ready(i) => {
                    self.account(t);
                    self.replicas[i].phase = Phase::Ready;
                    self.mark(t);
                }
                Ev::Tick => {
                    self.autoscale(t);
                    let work = next < arrivals.len()
                        || (self.replicas.iter()).any(|r| {
                            r.outstanding() > 0 || matches!(r.phase, Phase::Booting { .. })
                        });
                    if work {
                        self.push(t + self.cfg.autoscale.interval_s, Ev::Tick);
                    }
                }
            }
        }
        Ok(now)
    }

    /// The windows and the whole replay's figures, the replay having ended at `end`.
    fn summary(&mut self, end: f64, usd_per_hour: f64) -> (Vec<WindowStats>, Summary) {
        self.account(end);
        let unfinished: usize = self.replicas.iter().map(Replica::outstanding).sum();
        let (windows, all) = self.rec.finish(end);
        let gpu_s: f64 = (self.replicas.iter())
            .map(|r| (r.stopped_at.unwrap_or(end) - r.billed_from).max(0.0))
            .sum();
        let usd = gpu_s / 3600.0 * usd_per_hour;
        let span = end.max(1e-9);
        let summary = Summary {
            requests: all.requests,
            finished: all.finished,
            shed: self.rec.shed,
            too_long: self.rec.too_long,
            unfinished: unfinished as u64,
            output_tokens: all.output_tokens,
            preemptions: self.replicas.iter().map(|r| r.preemptions).sum(),
            latency: Latency::of(&all.ttft, &all.itl, &all.e2e),
            span_s: end,
            gpu_hours: gpu_s / 3600.0,
            usd,
            usd_per_million_output_tokens: cost_per_million_output_tokens(
                usd / (span / 3600.0),
                all.output_tokens as f64 / span,
            ),
            max_replicas: self.timeline.iter().map(|p| p.ready).max().unwrap_or(0),
        };
        (windows, summary)
    }

    fn autoscale(&mut self, t: f64) {
        let a = self.cfg.autoscale;
        let ready: Vec<&Replica> = (self.replicas.iter())
            .filter(|r| r.phase == Phase::Ready)
            .collect();
        let n = ready.len().max(1) as f64;
        let (value, target) = match a.metric {
            ScaleMetric::QueueDepth(target) => (
                ready.iter().map(|r| r.queued()).sum::<usize>() as f64 / n,
                target,
            ),
            ScaleMetric::KvUse(target) => {
                (ready.iter().map(|r| r.kv_use()).sum::<f64>() / n, target)
            }
        };
        // An empty queue says nothing about how many replicas keep it empty: under the queue
        // metric one is drained only if the others could run every request here at once.
        let outstanding: usize = ready.iter().map(|r| r.outstanding()).sum();
        let fewer_hold_it = match a.metric {
            ScaleMetric::QueueDepth(_) => {
                outstanding <= (ready.len().saturating_sub(1)) * self.knobs.max_seqs
            }
            ScaleMetric::KvUse(_) => true,
        };
        let (n_ready, n_booting) = self.counts();
        let desired = ((n_ready as f64 * value / target).ceil() as usize).clamp(a.min, a.max);
        if desired > n_ready + n_booting {
            self.account(t);
            for _ in n_ready + n_booting..desired {
                self.launch(t);
            }
            self.mark(t);
            self.wants_fewer_since = None;
        } else if desired < n_ready && fewer_hold_it && n_ready + n_booting > a.min {
            let since = *self.wants_fewer_since.get_or_insert(t);
            if t - since >= a.scale_down_after_s {
                // The ready replica with the least work, the newest of those.
                let victim = (self.replicas.iter().enumerate())
                    .filter(|(_, r)| r.phase == Phase::Ready)
                    .min_by_key(|(i, r)| (r.outstanding(), usize::MAX - i))
                    .map(|(i, _)| i);
                if let Some(i) = victim {
                    self.account(t);
                    self.replicas[i].phase = Phase::Draining;
                    self.mark(t);
                    self.kick(i, t);
                }
                self.wants_fewer_since = Some(t);
            }
        } else {
            self.wants_fewer_since = None;
        }
    }
}

/// The cold start of `cfg` on `device` in seconds, and how it was found.
fn cold_start(
    cfg: &FleetConfig,
    device: &crate::plan::DeviceSpec,
    weight_bytes: f64,
) -> (f64, String) {
    match cfg.cold_start {
        ColdStart::Measured { seconds } => (seconds, format!("measured: {seconds} s")),
        ColdStart::Load { disk_gb_s } => {
            let (bw, via) = match &device.host_to_device_gb_s {
                Some(h) if h.value < disk_gb_s => (
                    h.value,
                    format!(
                        "host link {} GB/s ({}); disk {disk_gb_s} GB/s (given)",
                        h.value, h.source
                    ),
                ),
                Some(h) => (
                    disk_gb_s,
                    format!(
                        "disk {disk_gb_s} GB/s (given); host link {} GB/s ({})",
                        h.value, h.source
                    ),
                ),
                None => (
                    disk_gb_s,
                    format!(
                        "disk {disk_gb_s} GB/s (given); {} shares host memory",
                        device.id
                    ),
                ),
            };
            let s = weight_bytes / (bw * 1e9);
            (
                s,
                format!(
                    "{:.1} GB of weights at {bw} GB/s: {via}",
                    weight_bytes / 1e9
                ),
            )
        }
    }
}

/// Replays `arrivals` (sorted by time, from t = 0) against `cfg` for model `shape`: the fleet
/// starts with its minimum of replicas ready.
pub fn simulate(
    table: &DeviceTable,
    shape: &ModelShape,
    cfg: &FleetConfig,
    arrivals: &[Arrival],
    limits: &Limits,
) -> Result<FleetReport, FleetError> {
    check_config(cfg)?;
    check_num("window", limits.window_s, 0.001, None)?;
    check_num("drain time", limits.drain_s, 0.0, Some(MAX_SPAN_S))?;
    if let Some(a) = arrivals.iter().position(|a| !a.t.is_finite() || a.t < 0.0) {
        return Err(FleetError::invalid(
            format!("arrival {}: t", a + 1),
            "must be a time of 0 s or more",
        ));
    }
    if let Some(w) = arrivals.windows(2).position(|w| w[0].t > w[1].t) {
        return Err(FleetError::invalid(
            format!("arrival {}", w + 2),
            "arrivals must be sorted by time",
        ));
    }
    let last_arrival = arrivals.last().map_or(0.0, |a| a.t);
    let horizon = last_arrival + limits.drain_s;
    let n_windows = (horizon / limits.window_s).ceil() + 1.0;
    if n_windows > limits.max_windows as f64 {
        return Err(FleetError::Bound {
            what: "time windows",
            limit: format!("{}; this replay needs {n_windows:.0}", limits.max_windows),
            hint: "make the window longer",
        });
    }
    let device = table.device(&cfg.replica.device)?;
    let model = StepModel::new(table, device, shape, cfg.replica.precision)?;
    let kv_cap = model.kv_capacity_tokens();
    if kv_cap == 0 {
        return Err(FleetError::DoesNotFit {
            config: cfg.name.clone(),
            device: device.id.clone(),
            weights_gib: model.weight_bytes() / (1u64 << 30) as f64,
        });
    }
    let (cold_s, cold_how) = cold_start(cfg, device, model.weight_bytes());
    let usd_per_hour =
        (cfg.replica.usd_per_hour.clone()).unwrap_or_else(|| device.usd_per_hour.clone());
    let weights_gib = model.weight_bytes() / (1u64 << 30) as f64;
    let overhead_s = model.ttft_overhead_s();
    let mut sim = Sim {
        cfg,
        model,
        knobs: Knobs {
            max_seqs: cfg.replica.max_seqs,
            token_budget: cfg.replica.token_budget as u32,
        },
        kv_cap,
        cold_s,
        replicas: (0..cfg.autoscale.min)
            .map(|_| Replica::new(Phase::Ready, 0.0, kv_cap))
            .collect(),
        heap: BinaryHeap::new(),
        seq: 0,
        rec: Recorder::new(limits.window_s, n_windows as usize),
        timeline: Vec::new(),
        counted_from: 0.0,
        wants_fewer_since: None,
    };
    sim.mark(0.0);
    sim.push(cfg.autoscale.interval_s, Ev::Tick);
    let now = sim.run(arrivals, horizon, limits.max_events, overhead_s)?;
    let end = now.max(last_arrival);
    let (windows, summary) = sim.summary(end, usd_per_hour.value);
    Ok(FleetReport {
        config: cfg.name.clone(),
        device: device.id.clone(),
        precision: cfg.replica.precision.name().to_string(),
        max_seqs: cfg.replica.max_seqs,
        token_budget: cfg.replica.token_budget,
        queue_limit: cfg.queue_limit,
        autoscale: cfg.autoscale,
        kv_capacity_tokens: kv_cap,
        weights_gib,
        cold_start_s: cold_s,
        cold_start_source: cold_how,
        usd_per_hour,
        summary,
        windows,
        timeline: sim.timeline,
        slo_misses: None,
    })
}

impl Slo {
    /// What of the objectives `s` misses (empty: it meets them all). Requests shed, refused as
    /// too long or left unfinished count against the shed share.
    pub fn misses(&self, s: &Summary) -> Vec<String> {
        let mut out = Vec::new();
        for (what, goal, got) in [
            ("TTFT", self.ttft_p99_ms, s.latency.ttft_p99_ms),
            ("ITL", self.itl_p99_ms, s.latency.itl_p99_ms),
            ("E2E", self.e2e_p99_ms, s.latency.e2e_p99_ms),
        ] {
            if let Some(goal) = goal {
                match got {
                    Some(v) if v <= goal => {}
                    Some(v) => out.push(format!("{what} P99 {v:.0} ms > {goal:.0} ms")),
                    None => out.push(format!("{what}: no request measured")),
                }
            }
        }
        let refused = s.shed + s.too_long + s.unfinished;
        let share = refused as f64 / s.requests.max(1) as f64;
        if share > self.max_shed_share {
            out.push(format!(
                "{refused} of {} requests shed, refused or unfinished ({:.2}% > {:.2}%)",
                s.requests,
                share * 100.0,
                self.max_shed_share * 100.0
            ));
        }
        out
    }
}

/// Each configuration's replay of the same arrivals, judged against `slo`, and the cheapest
/// that meets it.
pub fn compare(
    table: &DeviceTable,
    shape: &ModelShape,
    configs: &[FleetConfig],
    arrivals: &[Arrival],
    limits: &Limits,
    slo: Slo,
) -> Result<Comparison, FleetError> {
    check_num("SLO shed share", slo.max_shed_share, 0.0, Some(1.0))?;
    for (what, v) in [
        ("SLO TTFT", slo.ttft_p99_ms),
        ("SLO ITL", slo.itl_p99_ms),
        ("SLO E2E", slo.e2e_p99_ms),
    ] {
        if let Some(v) = v {
            check_num(what, v, 0.0, None)?;
        }
    }
    let mut reports = Vec::with_capacity(configs.len());
    for c in configs {
        let mut r = simulate(table, shape, c, arrivals, limits)?;
        r.slo_misses = Some(slo.misses(&r.summary));
        reports.push(r);
    }
    let cheapest = (reports.iter())
        .filter(|r| r.slo_misses.as_ref().is_some_and(Vec::is_empty))
        .filter_map(|r| r.summary.usd_per_million_output_tokens.map(|c| (c, r)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, r)| r.config.clone());
    Ok(Comparison {
        slo,
        reports,
        cheapest_meeting_slo: cheapest,
    })
}
