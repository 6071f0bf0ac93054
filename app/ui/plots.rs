//! The dashboard's live plots: the UI's bounded history of engine snapshots and the time plots
//! drawn from it (aggregate and per-request TPS on their own axes, TTFT, inter-token latency,
//! batch and queue, KV and memory, speculation), knob-change marks, and the sweep's trade-off
//! plot. The
//! dashboard lays them out (`panels::dashboard_plots`); the live trade-off view is
//! `plot_tradeoff`.
//!
//! Drawing cost stays flat however long the history is: each line is reduced to at most two
//! points per pixel column (min and max, in time order, [`decimate`]), which draws the same
//! picture. Grid lines step 1-2-5 ([`nice_grid`]) and none is closer than [`GRID_MIN_PX`]: with
//! egui_plot's defaults (powers of ten, lines down to 8 px apart) most y axes here got no labels
//! between 0 and the top, and each plot drew ~100 near-invisible full-height lines per frame,
//! the largest part of the frame on a CPU rasterizer (BENCHMARKS.md, "UI frame time").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use egui_plot::{Corner, GridInput, GridMark, Legend, Line, Plot, PlotPoints, Points, Text, VLine};
use tpslab_engine::device::ExpertLoad;
use tpslab_engine::serving::engine::EngineSnapshot;
use tpslab_engine::spec::SpecMethod;

use super::load::SweepPoint;

/// One sample of the live figures, taken by the UI.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the history started.
    pub t: f64,
    pub output_tps: f64,
    pub per_req_mean: Option<f64>,
    pub per_req_p10: Option<f64>,
    pub ttft_p50: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub itl_p50: Option<f64>,
    pub itl_p99: Option<f64>,
    pub batch: usize,
    pub queue: usize,
    pub kv_used: usize,
    pub kv_total: usize,
    pub rss_mib: Option<f64>,
    /// Device memory in use (on a GPU).
    pub vram_mib: Option<f64>,
    /// The share of a mixture of experts' weights the latest step read (%; `None` for a dense
    /// model).
    pub expert_pct: Option<f64>,
    /// Speculative decoding over the engine's recent steps (`None` while it is off).
    pub spec: Option<SpecSample>,
}

/// Speculation's figures of one sample, over the engine's recent steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecSample {
    /// Accepted / proposed tokens (%).
    pub acceptance_pct: Option<f64>,
    /// Tokens a request gains per verified step (the bonus token included).
    pub tokens_per_step: Option<f64>,
    /// Mean proposal time, and mean time of a step that verified proposals (ms).
    pub propose_ms: Option<f64>,
    pub verify_ms: Option<f64>,
}

/// A knob change, drawn as a vertical line.
#[derive(Debug, Clone)]
pub struct Mark {
    pub t: f64,
    pub text: String,
}

/// The UI's own bounded history of engine snapshots (the engine keeps no plot history for us).
pub struct History {
    origin: Instant,
    last: Option<Instant>,
    pub samples: VecDeque<Sample>,
    pub marks: VecDeque<Mark>,
    /// The latest mixture-of-experts step's load (tokens per expert), for the expert view.
    pub experts: Option<ExpertLoad>,
    /// Whether any sample had speculation on (its plots stay once shown).
    pub spec_seen: bool,
}

/// 10 samples a second for 10 minutes.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const MAX_SAMPLES: usize = 6000;
const MAX_MARKS: usize = 200;

impl Default for History {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: None,
            samples: VecDeque::new(),
            marks: VecDeque::new(),
            experts: None,
            spec_seen: false,
        }
    }
}

impl History {
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// Records `snap` if ~100 ms have passed since the last sample.
    pub fn sample(&mut self, snap: &EngineSnapshot) {
        let now = Instant::now();
        if self.last.is_some_and(|l| now - l < SAMPLE_EVERY) {
            return;
        }
        self.last = Some(now);
        let live = &snap.live;
        let step = live.latest_step.as_ref();
        let rss = step
            .and_then(|s| s.rss_bytes)
            .or_else(|| crate::mem::rss_bytes().map(|(cur, _)| cur));
        self.samples.push_back(Sample {
            t: self.now(),
            output_tps: live.output_tps,
            per_req_mean: live.per_request_tps_mean,
            per_req_p10: live.per_request_tps_p10,
            ttft_p50: live.ttft_p50_ms,
            ttft_p99: live.ttft_p99_ms,
            itl_p50: live.itl_p50_ms,
            itl_p99: live.itl_p99_ms,
            batch: step.map_or(0, |s| s.batch_size),
            queue: snap.waiting,
            kv_used: snap.kv_used_blocks,
            kv_total: snap.kv_total_blocks,
            rss_mib: rss.map(|b| b as f64 / (1 << 20) as f64),
            vram_mib: snap.memory.device_used.map(|b| b as f64 / (1 << 20) as f64),
            expert_pct: step.and_then(|s| s.expert_share).map(|v| v * 100.0),
            spec: (snap.knobs.spec.method != SpecMethod::Off).then(|| SpecSample {
                acceptance_pct: live.spec.acceptance_rate.map(|r| r * 100.0),
                tokens_per_step: live.spec.mean_acceptance_length,
                propose_ms: live.spec.propose_ms,
                verify_ms: live.spec.verify_ms,
            }),
        });
        self.spec_seen |= self.samples.back().is_some_and(|s| s.spec.is_some());
        // Reuses the per-expert counts' allocation from sample to sample.
        self.experts.clone_from(&live.experts);
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
    }

    /// For the frame benchmark: fills the history to its capacity (10 minutes) before the
    /// samples taken so far, each a copy of `like` with every figure moved by up to +-25% at
    /// random, so that every pixel column of every line has a distinct low and high: the most a
    /// plot ever draws.
    pub fn fill_for_bench(&mut self, like: &Sample) {
        let missing = MAX_SAMPLES.saturating_sub(self.samples.len());
        let t_end = self.samples.front().map_or_else(|| self.now(), |s| s.t);
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut jitter = |v: f64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            v * (0.75 + 0.5 * (seed >> 11) as f64 / (1u64 << 53) as f64)
        };
        for i in (1..=missing).rev() {
            let mut s = like.clone();
            s.t = t_end - i as f64 * SAMPLE_EVERY.as_secs_f64();
            s.output_tps = jitter(s.output_tps.max(1.0));
            for v in [
                &mut s.per_req_mean,
                &mut s.per_req_p10,
                &mut s.ttft_p50,
                &mut s.ttft_p99,
                &mut s.itl_p50,
                &mut s.itl_p99,
                &mut s.rss_mib,
            ] {
                *v = Some(jitter(v.unwrap_or(1.0).max(1.0)));
            }
            s.vram_mib = s.vram_mib.map(&mut jitter);
            s.expert_pct = s.expert_pct.map(&mut jitter);
            if let Some(sp) = &mut s.spec {
                for v in [
                    &mut sp.acceptance_pct,
                    &mut sp.tokens_per_step,
                    &mut sp.propose_ms,
                    &mut sp.verify_ms,
                ] {
                    *v = v.map(&mut jitter);
                }
            }
            s.batch = jitter(s.batch.max(1) as f64) as usize;
            s.queue = jitter(s.queue.max(1) as f64) as usize;
            s.kv_used = jitter(s.kv_used.max(1) as f64) as usize;
            self.samples.push_front(s);
        }
    }

    pub fn mark(&mut self, text: String) {
        self.marks.push_back(Mark {
            t: self.now(),
            text,
        });
        while self.marks.len() > MAX_MARKS {
            self.marks.pop_front();
        }
    }

    /// One figure over time, [`decimate`]d to `columns` pixel columns.
    pub fn series(&self, columns: usize, f: &dyn Fn(&Sample) -> Option<f64>) -> Vec<[f64; 2]> {
        let all: Vec<[f64; 2]> = (self.samples.iter())
            .filter_map(|s| f(s).map(|y| [s.t, y]))
            .collect();
        decimate(&all, columns)
    }
}

/// Knob changes as unnamed vertical lines (a named line would join the legend, one entry per
/// change), each with its text at the foot of the line.
fn marks(plot_ui: &mut egui_plot::PlotUi<'_>, history: &History) {
    for m in &history.marks {
        plot_ui.vline(VLine::new("", m.t).color(egui::Color32::GRAY));
        plot_ui.text(
            Text::new("", egui_plot::PlotPoint::new(m.t, 0.0), m.text.as_str())
                .color(egui::Color32::GRAY)
                .anchor(egui::Align2::LEFT_BOTTOM),
        );
    }
}

/// Height of one legend row and the legend's padding, in points (small text).
const LEGEND_ROW: f32 = 15.0;
const LEGEND_PAD: f32 = 12.0;

/// A time plot of named `lines` with the knob-change marks.
///
/// Its legend sits in the top-left corner above the curves: the y range is stretched so the
/// highest point stays below the band the legend's rows take. Every time plot spans the whole
/// history (a figure that starts late still lines up with the others) and has the same y-axis
/// width, so one x position is one moment in all of them. The plot area is outlined, not filled:
/// the panel colour is its background (a filled area was 0.5 MPixel per frame on a CPU
/// rasterizer for no information).
pub fn time_plot(
    ui: &mut egui::Ui,
    id: &str,
    h: &History,
    y_label: Option<&str>,
    lines: Vec<(&str, Vec<[f64; 2]>)>,
    height: f32,
) {
    let band = ((lines.len() as f32 * LEGEND_ROW + LEGEND_PAD) / height).clamp(0.0, 0.6);
    let top = (lines.iter())
        .flat_map(|(_, l)| l.iter().map(|p| p[1]))
        .fold(0.0, f64::max);
    let mut plot = Plot::new(id)
        .height(height)
        .legend(
            Legend::default()
                .position(Corner::LeftTop)
                .text_style(egui::TextStyle::Small)
                .follow_insertion_order(true),
        )
        .include_y(0.0)
        .y_axis_min_width(Y_AXIS_WIDTH);
    plot = styled(plot);
    // Counts (batch size, queue depth, blocks) get no 0.2 or 0.5 steps.
    if lines
        .iter()
        .all(|(_, l)| l.iter().all(|p| p[1].fract() == 0.0))
    {
        plot = plot.y_grid_spacer(|input: GridInput| {
            nice_grid(GridInput {
                base_step_size: input.base_step_size.max(1.0),
                ..input
            })
        });
    } else {
        plot = plot.y_grid_spacer(nice_grid);
    }
    if let Some(label) = y_label {
        plot = plot.y_axis_label(label);
    }
    if let (Some(first), Some(last)) = (h.samples.front(), h.samples.back()) {
        plot = plot.include_x(first.t).include_x(last.t);
    }
    // An idle engine's zeros (or no data yet) get 0..1, not egui_plot's -15..15 around zero.
    plot = plot.include_y(top.max(1.0) / f64::from(1.0 - band));
    let shown = plot.show(ui, |p| {
        for (name, points) in lines {
            p.line(Line::new(name, PlotPoints::from(points)));
        }
        marks(p, h);
    });
    outline(ui, shown.response.rect);
}

/// What every plot here shares: no filled background (see [`outline`]), 1-2-5 grid steps on the
/// x axis (the y axis may take its own), no grid lines closer than [`GRID_MIN_PX`].
pub fn styled(plot: Plot<'_>) -> Plot<'_> {
    plot.show_background(false)
        .x_grid_spacer(nice_grid)
        .grid_spacing(egui::Rangef::new(GRID_MIN_PX, 300.0))
}

/// The border of a plot area drawn without a background.
pub fn outline(ui: &egui::Ui, rect: egui::Rect) {
    let stroke = ui.visuals().widgets.noninteractive.bg_stroke;
    (ui.painter()).rect_stroke(rect, 2.0, stroke, egui::StrokeKind::Inside);
}

/// "batch cap 64 · prompt 128 -> output 64 tok · Q4_1 · CPU, 2 threads": the settings a sweep ran
/// under (its first level's; they don't change during a sweep).
pub fn sweep_settings(points: &[SweepPoint]) -> String {
    points.first().map_or_else(String::new, point_settings)
}

/// The settings label of one sweep point.
fn point_settings(p: &SweepPoint) -> String {
    let mut s = String::new();
    if p.max_batch > 0 {
        s.push_str(&format!("batch cap {} · ", p.max_batch));
    }
    s.push_str(&format!(
        "prompt {} -> output {} tok · {}",
        p.prompt_len,
        p.output_len,
        p.precision_label()
    ));
    if !p.device.is_empty() {
        s.push_str(&format!(" · {}", p.device));
    }
    s
}

/// The sweep's points by target (the engine's device, or a remote server), in first-seen order.
fn by_target(points: &[SweepPoint]) -> Vec<(&str, Vec<&SweepPoint>)> {
    let mut groups: Vec<(&str, Vec<&SweepPoint>)> = Vec::new();
    for p in points {
        match groups.iter_mut().find(|(d, _)| *d == p.device) {
            Some((_, g)) => g.push(p),
            None => groups.push((&p.device, vec![p])),
        }
    }
    groups
}

/// The trade-off plot (also drawn into the saved PNG, see [`super::plot_png`]): one curve per
/// target, so this engine and a remote server compare side by side.
pub fn sweep_plot_ui(ui: &mut egui::Ui, points: &[SweepPoint], height: f32) {
    let groups = by_target(points);
    ui.strong(format!(
        "Sweep: aggregate vs per-request TPS, one point per concurrency level — {}",
        groups
            .iter()
            .map(|(_, g)| point_settings(g[0]))
            .collect::<Vec<_>>()
            .join("  vs  ")
    ));
    let shown = styled(Plot::new("plot_sweep"))
        .height(height)
        .y_grid_spacer(nice_grid)
        .x_axis_label("per-request TPS, mean (tok/s)")
        .y_axis_label("aggregate TPS (tok/s)")
        .include_y(0.0)
        .include_x(0.0)
        .legend(Legend::default().position(Corner::RightTop))
        .show(ui, |p| {
            for (device, g) in &groups {
                let xy: Vec<[f64; 2]> = g
                    .iter()
                    .filter_map(|p| p.mean_per_request_tps.map(|x| [x, p.output_throughput]))
                    .collect();
                let name = if device.is_empty() {
                    "trade-off"
                } else {
                    device
                };
                p.line(Line::new(name, PlotPoints::from(xy.clone())));
                p.points(Points::new(name, PlotPoints::from(xy)).radius(4.0));
            }
            for pt in points {
                if let Some(x) = pt.mean_per_request_tps {
                    p.text(
                        Text::new(
                            format!("c={}", pt.concurrency),
                            egui_plot::PlotPoint::new(x, pt.output_throughput),
                            format!("  c={}", pt.concurrency),
                        )
                        .anchor(egui::Align2::LEFT_BOTTOM),
                    );
                }
            }
        });
    outline(ui, shown.response.rect);
}

/// Grid lines closer than this (points) are not drawn.
pub const GRID_MIN_PX: f32 = 16.0;

/// Width of the y axis of every time plot (points), so their time axes line up.
pub const Y_AXIS_WIDTH: f32 = 60.0;

/// Grid marks for egui_plot at steps of 1, 2 or 5 times a power of ten: the finest step is the
/// smallest such that is at least `input.base_step_size` (the value [`GRID_MIN_PX`] spans), and
/// two coarser steps that are multiples of it (1 -> 5, 10; 2 -> 10, 20; 5 -> 10, 50).
pub fn nice_grid(input: GridInput) -> Vec<GridMark> {
    let base = input.base_step_size.abs();
    let (lo, hi) = input.bounds;
    if !(base.is_finite() && base > 0.0 && lo.is_finite() && hi.is_finite() && hi > lo) {
        return Vec::new();
    }
    let decade = 10f64.powf(base.log10().floor());
    let m = base / decade;
    let steps = if m <= 1.0 {
        [decade, 5.0 * decade, 10.0 * decade]
    } else if m <= 2.0 {
        [2.0 * decade, 10.0 * decade, 20.0 * decade]
    } else if m <= 5.0 {
        [5.0 * decade, 10.0 * decade, 50.0 * decade]
    } else {
        [10.0 * decade, 50.0 * decade, 100.0 * decade]
    };
    // A degenerate input (a range of 1e300 at a step of 1e-300) must not allocate without bound.
    if (hi - lo) / steps[0] > 10_000.0 {
        return Vec::new();
    }
    let first = (lo / steps[0]).ceil() as i64;
    let last = (hi / steps[0]).floor() as i64;
    (first..=last)
        .map(|i| {
            let value = i as f64 * steps[0];
            // The coarsest step this mark lies on (within rounding).
            let on = |s: f64| {
                let r = value / s;
                (r - r.round()).abs() < 1e-6
            };
            let step_size = steps.into_iter().rev().find(|&s| on(s)).unwrap_or(steps[0]);
            GridMark { value, step_size }
        })
        .collect()
}

/// `points` (in x order) reduced for a plot `columns` pixels wide: when there are more than two
/// points per column, each column keeps its lowest and highest point, in x order, and the first
/// and last points stay. A line through those draws what the full line draws at that width.
pub fn decimate(points: &[[f64; 2]], columns: usize) -> Vec<[f64; 2]> {
    let columns = columns.max(1);
    if points.len() <= 2 * columns + 2 {
        return points.to_vec();
    }
    let (x0, x1) = (points[0][0], points[points.len() - 1][0]);
    let width = (x1 - x0).max(f64::MIN_POSITIVE);
    let column = |x: f64| (((x - x0) / width * columns as f64) as usize).min(columns - 1);
    let mut out = Vec::with_capacity(2 * columns + 2);
    out.push(points[0]);
    let mut i = 1;
    while i < points.len() - 1 {
        let c = column(points[i][0]);
        let (mut lo, mut hi) = (i, i);
        let mut j = i + 1;
        while j < points.len() - 1 && column(points[j][0]) == c {
            if points[j][1] < points[lo][1] {
                lo = j;
            }
            if points[j][1] > points[hi][1] {
                hi = j;
            }
            j += 1;
        }
        out.push(points[lo.min(hi)]);
        if lo != hi {
            out.push(points[lo.max(hi)]);
        }
        i = j;
    }
    out.push(points[points.len() - 1]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A noisy series: a slow wave plus a deterministic pseudo-random term.
    fn noisy(n: usize) -> Vec<[f64; 2]> {
        let mut seed = 12345u64;
        (0..n)
            .map(|i| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let noise = (seed >> 33) as f64 / (1u64 << 31) as f64;
                [
                    i as f64 * 0.1,
                    (i as f64 / 300.0).sin() * 50.0 + noise * 20.0,
                ]
            })
            .collect()
    }

    #[test]
    fn decimate_keeps_short_series_whole() {
        let pts = noisy(100);
        assert_eq!(decimate(&pts, 900), pts);
        assert_eq!(decimate(&[], 900), Vec::<[f64; 2]>::new());
        assert_eq!(decimate(&pts[..1], 0), pts[..1].to_vec());
    }

    #[test]
    fn decimate_keeps_every_columns_extremes_in_order() {
        let pts = noisy(6000);
        let columns = 500;
        let out = decimate(&pts, columns);
        assert!(out.len() <= 2 * columns + 2, "{} points", out.len());
        assert!(out.len() > columns, "{} points", out.len());
        assert_eq!(out.first(), pts.first());
        assert_eq!(out.last(), pts.last());
        assert!(out.windows(2).all(|w| w[0][0] < w[1][0]), "x order");
        assert!(out.iter().all(|p| pts.contains(p)), "only input points");
        // Every pixel column's lowest and highest input point is drawn.
        let (x0, x1) = (pts[0][0], pts[pts.len() - 1][0]);
        let col = |x: f64| (((x - x0) / (x1 - x0) * columns as f64) as usize).min(columns - 1);
        for c in 0..columns {
            let in_col: Vec<&[f64; 2]> = pts.iter().filter(|p| col(p[0]) == c).collect();
            let lo = in_col.iter().map(|p| p[1]).fold(f64::INFINITY, f64::min);
            let hi = in_col
                .iter()
                .map(|p| p[1])
                .fold(f64::NEG_INFINITY, f64::max);
            let drawn: Vec<f64> = out
                .iter()
                .filter(|p| col(p[0]) == c)
                .map(|p| p[1])
                .collect();
            assert!(drawn.contains(&lo) && drawn.contains(&hi), "column {c}");
        }
    }

    #[test]
    fn nice_grid_steps_are_1_2_5() {
        // 13 units per minimum spacing -> finest step 20, then 100 and 200.
        let marks = nice_grid(GridInput {
            bounds: (-35.0, 410.0),
            base_step_size: 13.0,
        });
        let values: Vec<f64> = marks.iter().map(|m| m.value).collect();
        assert_eq!(values.first(), Some(&-20.0));
        assert_eq!(values.last(), Some(&400.0));
        assert!(values.windows(2).all(|w| (w[1] - w[0] - 20.0).abs() < 1e-9));
        let step = |v: f64| marks.iter().find(|m| m.value == v).map(|m| m.step_size);
        assert_eq!(step(40.0), Some(20.0));
        assert_eq!(step(100.0), Some(100.0));
        assert_eq!(step(200.0), Some(200.0));
        assert_eq!(step(0.0), Some(200.0));
        for (base, finest) in [
            (0.7, 1.0),
            (1.0, 1.0),
            (1.5, 2.0),
            (3.0, 5.0),
            (0.004, 0.005),
        ] {
            let m = nice_grid(GridInput {
                bounds: (0.0, 100.0 * base),
                base_step_size: base,
            });
            let min_step = m.iter().map(|m| m.step_size).fold(f64::INFINITY, f64::min);
            assert!((min_step - finest).abs() < 1e-12, "base {base}: {min_step}");
        }
    }

    #[test]
    fn nice_grid_refuses_degenerate_input() {
        for (bounds, base) in [
            ((0.0, 1.0), 0.0),
            ((0.0, 1.0), f64::NAN),
            ((1.0, 0.0), 1.0),
            ((0.0, f64::INFINITY), 1.0),
            ((-1e300, 1e300), 1e-300),
        ] {
            let marks = nice_grid(GridInput {
                bounds,
                base_step_size: base,
            });
            assert!(marks.len() <= 10_001, "{bounds:?} {base}: {}", marks.len());
        }
    }
}
