//! UI frame time while the engine streams 64 concurrent requests: the window's own work per
//! frame (draining events, chat and dashboard layout, plots) measured through egui_kittest, with
//! no GPU, and the pixels the last frame paints (what a CPU rasterizer shades). Run with
//! `cargo bench --bench ui_frame_time`; prints figures, asserts nothing.

use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::{AppOptions, AppState, TpsApp};
use tpslab_engine::device::DeviceChoice;

/// The window size of the measurement (the real-window benchmark's too).
const SIZE: [f32; 2] = [1280.0, 800.0];

fn main() {
    let mut state = AppState::default();
    state.dash.load.concurrency = 64;
    state.dash.load.prompt_len = 32;
    state.dash.load.output_len = 512;
    let app = TpsApp::new(
        state,
        AppOptions {
            model: "default".into(),
            threads: 2,
            // The figures in BENCHMARKS.md are CPU ones.
            device: Some(DeviceChoice::Cpu),
        },
    );
    let mut h: Harness<'static, TpsApp> = Harness::builder()
        .with_size(SIZE)
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut TpsApp| app.app_ui(ui), app);
    let deadline = Instant::now() + Duration::from_secs(600);
    while h.state().engine().is_none() {
        assert!(
            Instant::now() < deadline,
            "model did not load: {:?}",
            h.state().errors()
        );
        h.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    h.get_by_label("Dashboard").click();
    h.step();
    h.get_by_label("Start load").click();
    // Wait until all 64 are past their prompts and streaming.
    loop {
        h.step();
        let s = h.state().engine().map(|e| e.stats());
        if s.as_ref().is_some_and(|s| {
            s.running == 64
                && s.live
                    .latest_step
                    .as_ref()
                    .is_some_and(|st| st.prefill_tokens == 0)
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "load did not reach 64 streams");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut frames = Vec::new();
    let t_end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < t_end {
        let t = Instant::now();
        h.step();
        frames.push(t.elapsed().as_secs_f64() * 1e3);
        // ~60 frames per second, as a window would request them while tokens stream.
        std::thread::sleep(Duration::from_millis(16));
    }
    let s = h.state().engine().map(|e| e.stats());
    frames.sort_by(f64::total_cmp);
    let p = |q: f64| frames[((frames.len() - 1) as f64 * q) as usize];
    println!(
        "UI frame time with {} streams running ({} frames, dashboard tab): p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; aggregate {:.1} tok/s",
        s.as_ref().map_or(0, |s| s.running),
        frames.len(),
        p(0.5),
        p(0.9),
        p(0.99),
        frames.last().copied().unwrap_or(0.0),
        s.map_or(0.0, |s| s.live.output_tps)
    );
    let (area, triangles) = painted(&h);
    println!(
        "Painted per frame: {triangles} triangles covering {:.2} MPixel ({:.2}x the window; the harness adds one full-window background of its own)",
        area / 1e6,
        area / f64::from(SIZE[0] * SIZE[1])
    );
    h.get_by_label("Stop load").click();
    h.step();
}

/// The last frame's triangles and the pixels they cover (each triangle's area within its clip
/// rectangle's bounds, overlaps counted as often as they are drawn): what a CPU rasterizer shades
/// per frame.
fn painted(h: &Harness<'static, TpsApp>) -> (f64, usize) {
    let prims = h.ctx.tessellate(h.output().shapes.clone(), 1.0);
    let (mut area, mut triangles) = (0.0, 0);
    for p in &prims {
        let egui::epaint::Primitive::Mesh(m) = &p.primitive else {
            continue;
        };
        for t in m.indices.chunks_exact(3) {
            let [a, b, c] = [0, 1, 2].map(|i| m.vertices[t[i] as usize].pos);
            let bb = egui::Rect::from_points(&[a, b, c]);
            let whole = bb.area();
            let kept = bb.intersect(p.clip_rect).area().max(0.0);
            let tri = f64::from(((b - a).x * (c - a).y - (b - a).y * (c - a).x).abs() * 0.5);
            if whole > 0.0 {
                area += tri * f64::from((kept / whole).min(1.0));
            }
            triangles += 1;
        }
    }
    (area, triangles)
}
