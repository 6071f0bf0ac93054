//! The dashboard's live view, laid out: the settings once, the operating point, aggregate and
//! per-request TPS side by side on their own axes, the trade-off view beside TTFT and
//! inter-token latency, batch and queue beside KV and memory, for a mixture of experts the
//! share of expert weights each step read beside the tokens each expert got, speculation's
//! acceptance and cost once it has been on, and the sweep's plot.

use crate::ui::load::SweepPoint;
use crate::ui::plot_tradeoff;
use egui_plot::{Bar, BarChart, Plot};
use tpslab_engine::device::ExpertLoad;

use crate::ui::plots::{
    History, Sample, SpecSample, Y_AXIS_WIDTH, outline, styled, sweep_plot_ui, time_plot,
};

/// The live view of `h`: the settings it was taken under (`label`, said once for the whole
/// view), the operating point now, each face of TPS on its own axis, the trade-off between them
/// beside TTFT and inter-token latency, batch and queue, KV and memory; and the sweep's plot when
/// it has points.
pub fn plots_ui(ui: &mut egui::Ui, h: &History, label: &str, sweep_points: &[SweepPoint]) {
    ui.label(egui::RichText::new(format!("Taken under: {label}")).small());
    if let Some(last) = h.marks.back() {
        ui.label(
            egui::RichText::new(format!("Last change: {}", last.text))
                .small()
                .weak(),
        );
    }
    ui.label(plot_tradeoff::operating_point_text(h));
    // Per-request TPS (a few tok/s at 64 streams here) and aggregate TPS (hundreds) each get
    // their own axis: on one axis the per-request line lay flat at the foot of the plot.
    ui.columns(2, |cols| {
        let series = series_for(&cols[0], h);
        cols[0].strong("Aggregate output TPS");
        let lines = vec![("aggregate output TPS", series(&|s| Some(s.output_tps)))];
        time_plot(&mut cols[0], "plot_tps", h, Some("tok/s"), lines, 150.0);
        cols[1].strong("Per-request TPS");
        let lines = vec![
            ("per-request TPS (mean)", series(&|s| s.per_req_mean)),
            ("per-request TPS (P10)", series(&|s| s.per_req_p10)),
        ];
        time_plot(&mut cols[1], "plot_tps_req", h, Some("tok/s"), lines, 150.0);
    });
    ui.columns(2, |cols| {
        plot_tradeoff::tradeoff_ui(&mut cols[0], h, 300.0);
        let series = series_for(&cols[1], h);
        cols[1].strong("Time to first token");
        let lines = vec![
            ("TTFT P50", series(&|s| s.ttft_p50)),
            ("TTFT P99", series(&|s| s.ttft_p99)),
        ];
        time_plot(&mut cols[1], "plot_ttft", h, Some("ms"), lines, 125.0);
        cols[1].strong("Inter-token latency");
        let lines = vec![
            ("ITL P50", series(&|s| s.itl_p50)),
            ("ITL P99", series(&|s| s.itl_p99)),
        ];
        time_plot(&mut cols[1], "plot_itl", h, Some("ms"), lines, 125.0);
    });
    ui.columns(2, |cols| {
        let series = series_for(&cols[0], h);
        cols[0].strong("Batch size and queue depth");
        let lines = vec![
            ("batch size", series(&|s| Some(s.batch as f64))),
            ("queue depth", series(&|s| Some(s.queue as f64))),
        ];
        time_plot(&mut cols[0], "plot_batch", h, None, lines, 150.0);
        kv_plot(&mut cols[1], h);
    });
    // The latest snapshot's load: no scan of the history in the frame.
    if let Some(load) = &h.experts {
        ui.columns(2, |cols| {
            let series = series_for(&cols[0], h);
            cols[0].strong("Expert weights read per step (%)");
            let lines = vec![("expert weights read (%)", series(&|s| s.expert_pct))];
            time_plot(
                &mut cols[0],
                "plot_expert_share",
                h,
                Some("%"),
                lines,
                150.0,
            );
            expert_load_plot(&mut cols[1], load);
        });
    }
    if h.spec_seen {
        spec_plots(ui, h);
    }
    if !sweep_points.is_empty() {
        sweep_plot_ui(ui, sweep_points, 260.0);
    }
}

/// Speculative decoding over time: its acceptance rate and the tokens a request gains per
/// verified step beside what proposing and verifying cost a step. The policy's pauses are the
/// marks on every plot.
fn spec_plots(ui: &mut egui::Ui, h: &History) {
    let pick = |f: fn(&SpecSample) -> Option<f64>| move |s: &Sample| s.spec.as_ref().and_then(f);
    ui.columns(2, |cols| {
        let series = series_for(&cols[0], h);
        cols[0].strong("Speculation: acceptance rate (%)");
        let lines = vec![(
            "accepted / proposed (%)",
            series(&pick(|s| s.acceptance_pct)),
        )];
        time_plot(&mut cols[0], "plot_spec_accept", h, Some("%"), lines, 70.0);
        cols[0].strong("Speculation: tokens per verified step");
        let lines = vec![("mean accepted length", series(&pick(|s| s.tokens_per_step)))];
        time_plot(&mut cols[0], "plot_spec_len", h, None, lines, 70.0);
        let series = series_for(&cols[1], h);
        cols[1].strong("Speculation: time per step (ms)");
        let lines = vec![
            ("propose", series(&pick(|s| s.propose_ms))),
            (
                "verify (forward + sampling)",
                series(&pick(|s| s.verify_ms)),
            ),
        ];
        time_plot(&mut cols[1], "plot_spec_time", h, Some("ms"), lines, 160.0);
    });
}

/// Which figure of a sample a series plots.
type Pick<'f> = &'f dyn Fn(&Sample) -> Option<f64>;

/// A figure of `h` over time, decimated to the pixel columns of a plot as wide as `ui`.
fn series_for<'a>(ui: &egui::Ui, h: &'a History) -> impl Fn(Pick<'_>) -> Vec<[f64; 2]> + use<'a> {
    let columns = ((ui.available_width() - Y_AXIS_WIDTH) * ui.ctx().pixels_per_point()) as usize;
    move |f| h.series(columns, f)
}

/// Tokens per expert in the latest step, averaged over its MoE layers: how evenly the router
/// spread the batch, and how many experts a step had to read.
fn expert_load_plot(ui: &mut egui::Ui, load: &ExpertLoad) {
    let bars: Vec<Bar> = (load.mean_tokens_per_expert().enumerate())
        .map(|(e, n)| Bar::new(e as f64, n).width(1.0))
        .collect();
    let touched = bars.iter().filter(|b| b.value > 0.0).count();
    ui.strong(format!(
        "Tokens per expert, latest step (mean of {} layers; {touched} of {} experts chosen)",
        load.layers,
        bars.len()
    ));
    let shown = styled(Plot::new("plot_expert_load"))
        .height(150.0)
        .include_y(0.0)
        .include_y(1.0)
        .x_axis_label("expert")
        .y_axis_label("tokens")
        .y_axis_min_width(Y_AXIS_WIDTH)
        .show(ui, |p| {
            p.bar_chart(BarChart::new("tokens per expert", bars))
        });
    outline(ui, shown.response.rect);
}

/// KV blocks and memory: process RSS, and on a GPU the device's memory in use (the title says
/// which memory is drawn).
fn kv_plot(ui: &mut egui::Ui, h: &History) {
    let series = series_for(ui, h);
    let vram = series(&|s| s.vram_mib);
    let memory = if vram.is_empty() {
        "process RSS (MiB)"
    } else {
        "process RSS and VRAM used (MiB)"
    };
    ui.strong(format!("KV blocks and memory: {memory}"));
    let mut lines = vec![
        ("KV blocks used", series(&|s| Some(s.kv_used as f64))),
        ("KV blocks total", series(&|s| Some(s.kv_total as f64))),
        ("process RSS (MiB)", series(&|s| s.rss_mib)),
    ];
    if !vram.is_empty() {
        lines.push(("VRAM used (MiB)", vram));
    }
    time_plot(ui, "plot_kv", h, Some("blocks / MiB"), lines, 150.0);
}
