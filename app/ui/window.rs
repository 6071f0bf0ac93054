//! The native window (`tpslab` with no subcommand): opened with the painter `--renderer` picks,
//! the app driven by eframe's frame, save and exit hooks, and timed by the frame benchmark when
//! `TPSLAB_FRAME_BENCH` asks.

use super::frame_bench::FrameBench;
use super::{AppOptions, STATE_KEY, TpsApp, renderer, state_file};

/// The app in the native window, with the frame benchmark when one runs.
struct Window {
    app: TpsApp,
    bench: Option<FrameBench>,
}

impl eframe::App for Window {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        if let Some(fb) = &mut self.bench {
            self.app.frame_bench_tick(fb, &ctx, frame.info().cpu_usage);
        }
        self.app.app_ui(ui);
    }

    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        renderer::clear_color(visuals)
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        if let Some(path) = state_file::default_path()
            && let Err(e) = state_file::save(&path, &self.app.state)
        {
            eprintln!("cannot save the window's state to {}: {e}", path.display());
        }
        eframe::set_value(storage, STATE_KEY, &self.app.state);
    }

    fn on_exit(&mut self, _gl: Option<&eframe::glow::Context>) {
        if let Some(l) = &self.app.rt.load {
            l.stop();
        }
        if let Some(s) = &self.app.rt.sweep {
            s.stop();
        }
    }
}

/// Opens the window with the painter `renderer` picks (blocks until it is closed).
pub fn run(
    options: AppOptions,
    renderer: renderer::RendererChoice,
    devices: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let bench = FrameBench::from_env();
    let painter = renderer::resolve(renderer);
    eprintln!("window: {}", painter.why);
    let native = renderer::native_options(&painter, bench.is_some());
    let (renderer, why) = (painter.renderer, painter.why);
    eframe::run_native(
        "TPS Lab",
        native,
        Box::new(move |cc| {
            let mut app = TpsApp::from_creation_context(cc, options);
            if let Some(path) = &devices {
                app.set_device_table(path);
            }
            let bench = bench.map(|b| b.with_renderer(why));
            Ok(Box::new(Window { app, bench }))
        }),
    )
    .map_err(|e| {
        anyhow::anyhow!("cannot open the window ({renderer:?}): {e}; --renderer wgpu|glow picks the other painter")
    })
}
