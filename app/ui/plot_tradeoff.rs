//! The dashboard's live trade-off view: per-request TPS against aggregate TPS, one point per
//! batch size the engine has run at (from the plot history), the current operating point
//! highlighted, and the operating point's figures (TPS both ways, P99 TTFT and ITL) as one line.
//!
//! Each point is the mean of the history's samples taken at that batch size, so the curve fills
//! in as the batch size moves (a load's ramp, a change of batch cap or concurrency), and the
//! highlighted point moves along it as knobs change.

use egui_plot::{Legend, Line, Plot, PlotPoint, PlotPoints, Points, Text};

use super::plots::{History, Sample, nice_grid, outline, styled};

/// One batch size seen: the mean of the figures sampled at it.
#[derive(Debug, Clone, PartialEq)]
pub struct TradeoffPoint {
    pub batch: usize,
    pub per_request_tps: f64,
    pub aggregate_tps: f64,
    /// Samples averaged into this point.
    pub samples: usize,
}

/// The figures of the latest sample with a batch running and a per-request TPS.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatingPoint {
    pub batch: usize,
    pub per_request_tps: f64,
    pub aggregate_tps: f64,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
}

/// A sample that says where the trade-off stands: a batch ran and a request streamed.
fn measured(s: &Sample) -> Option<(usize, f64)> {
    (s.batch > 0).then_some(())?;
    let per_request = s.per_req_mean.filter(|v| v.is_finite())?;
    Some((s.batch, per_request))
}

/// One point per batch size in `h`, in batch order.
pub fn tradeoff_points(h: &History) -> Vec<TradeoffPoint> {
    // Batch sizes are at most the batch cap (<= 512), so a sorted Vec is small.
    let mut points: Vec<TradeoffPoint> = Vec::new();
    for s in &h.samples {
        let Some((batch, per_request)) = measured(s) else {
            continue;
        };
        let i = match points.binary_search_by_key(&batch, |p| p.batch) {
            Ok(i) => i,
            Err(i) => {
                let empty = TradeoffPoint {
                    batch,
                    per_request_tps: 0.0,
                    aggregate_tps: 0.0,
                    samples: 0,
                };
                points.insert(i, empty);
                i
            }
        };
        let p = &mut points[i];
        p.per_request_tps += per_request;
        p.aggregate_tps += s.output_tps;
        p.samples += 1;
    }
    for p in &mut points {
        let n = p.samples as f64;
        p.per_request_tps /= n;
        p.aggregate_tps /= n;
    }
    points
}

/// Where the engine runs now: the latest sample that measured a trade-off.
pub fn operating_point(h: &History) -> Option<OperatingPoint> {
    let s = h.samples.iter().rev().find(|s| measured(s).is_some())?;
    Some(OperatingPoint {
        batch: s.batch,
        per_request_tps: s.per_req_mean?,
        aggregate_tps: s.output_tps,
        ttft_p99_ms: s.ttft_p99,
        itl_p99_ms: s.itl_p99,
    })
}

/// "Operating point: batch 3 · 12.1 tok/s per request · 36.0 tok/s aggregate · TTFT P99 120 ms ·
/// ITL P99 85 ms".
pub fn operating_point_text(h: &History) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |v| format!("{v:.0} ms"));
    match operating_point(h) {
        Some(p) => format!(
            "Operating point: batch {} · {:.1} tok/s per request · {:.1} tok/s aggregate · \
             TTFT P99 {} · ITL P99 {}",
            p.batch,
            p.per_request_tps,
            p.aggregate_tps,
            ms(p.ttft_p99_ms),
            ms(p.itl_p99_ms)
        ),
        None => "Operating point: none yet (no request streaming)".into(),
    }
}

/// "Points (batch: per-request / aggregate tok/s): 1: 150.2 / 150.2 · 4: 58.0 / 165.1".
pub fn points_text(points: &[TradeoffPoint]) -> String {
    let each: Vec<String> = (points.iter())
        .map(|p| {
            format!(
                "{}: {:.1} / {:.1}",
                p.batch, p.per_request_tps, p.aggregate_tps
            )
        })
        .collect();
    format!(
        "Points (batch: per-request / aggregate tok/s): {}",
        if each.is_empty() {
            "none yet".to_string()
        } else {
            each.join(" · ")
        }
    )
}

/// The trade-off plot of `h`, `height` points tall, with its points as text under it.
pub fn tradeoff_ui(ui: &mut egui::Ui, h: &History, height: f32) {
    let points = tradeoff_points(h);
    let now = operating_point(h);
    ui.strong("Trade-off: per-request vs aggregate TPS, one point per batch size");
    let xy: Vec<[f64; 2]> = (points.iter())
        .map(|p| [p.per_request_tps, p.aggregate_tps])
        .collect();
    let shown = styled(Plot::new("plot_tradeoff"))
        .height(height - 40.0)
        .y_grid_spacer(nice_grid)
        .x_axis_label("per-request TPS, mean (tok/s)")
        .y_axis_label("aggregate TPS (tok/s)")
        .include_x(0.0)
        .include_y(0.0)
        .legend(Legend::default().position(egui_plot::Corner::RightTop))
        .show(ui, |p| {
            p.line(Line::new("batch sizes seen", PlotPoints::from(xy.clone())));
            p.points(Points::new("batch sizes seen", PlotPoints::from(xy)).radius(3.0));
            for pt in &points {
                p.text(
                    Text::new(
                        "",
                        PlotPoint::new(pt.per_request_tps, pt.aggregate_tps),
                        format!(" b={}", pt.batch),
                    )
                    .anchor(egui::Align2::LEFT_TOP),
                );
            }
            if let Some(now) = &now {
                let at = [now.per_request_tps, now.aggregate_tps];
                p.points(
                    Points::new("now", PlotPoints::from(vec![at]))
                        .radius(7.0)
                        .color(egui::Color32::from_rgb(230, 80, 40)),
                );
                p.text(
                    Text::new(
                        "",
                        PlotPoint::new(at[0], at[1]),
                        format!("  now: b={}", now.batch),
                    )
                    .anchor(egui::Align2::LEFT_BOTTOM),
                );
            }
        });
    outline(ui, shown.response.rect);
    ui.label(egui::RichText::new(points_text(&points)).small());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, batch: usize, per_req: Option<f64>, agg: f64) -> Sample {
        Sample {
            t,
            output_tps: agg,
            per_req_mean: per_req,
            per_req_p10: None,
            ttft_p50: None,
            ttft_p99: Some(120.0),
            itl_p50: None,
            itl_p99: Some(85.0),
            batch,
            queue: 0,
            kv_used: 0,
            kv_total: 0,
            rss_mib: None,
            vram_mib: None,
            expert_pct: None,
            spec: None,
        }
    }

    #[test]
    fn one_point_per_batch_size_and_the_latest_is_now() {
        let mut h = History::default();
        for s in [
            sample(0.0, 0, None, 0.0),
            sample(0.1, 4, Some(50.0), 190.0),
            sample(0.2, 1, Some(150.0), 150.0),
            sample(0.3, 4, Some(60.0), 210.0),
            // No per-request figure yet: not a point.
            sample(0.4, 8, None, 220.0),
            sample(0.5, 1, Some(140.0), 140.0),
        ] {
            h.samples.push_back(s);
        }
        let pts = tradeoff_points(&h);
        assert_eq!(pts.len(), 2);
        assert_eq!((pts[0].batch, pts[0].samples), (1, 2));
        assert!((pts[0].per_request_tps - 145.0).abs() < 1e-9);
        assert_eq!((pts[1].batch, pts[1].samples), (4, 2));
        assert!((pts[1].aggregate_tps - 200.0).abs() < 1e-9);
        let now = operating_point(&h).expect("a point");
        assert_eq!(now.batch, 1);
        assert_eq!(
            operating_point_text(&h),
            "Operating point: batch 1 · 140.0 tok/s per request · 140.0 tok/s aggregate · \
             TTFT P99 120 ms · ITL P99 85 ms"
        );
        assert_eq!(
            points_text(&pts),
            "Points (batch: per-request / aggregate tok/s): 1: 145.0 / 145.0 · 4: 55.0 / 200.0"
        );
        assert!(operating_point(&History::default()).is_none());
    }
}
