//! The native window (`tpslab` with no subcommand): opened with the painter `--renderer` picks,
//! its frames paced for that painter ([`super::pacing`]), the app driven by eframe's frame, save
//! and exit hooks, and timed by the frame benchmark (`TPSLAB_FRAME_BENCH`) or the chat
//! benchmark (`TPSLAB_CHAT_BENCH`) when asked.

use super::chat_bench::ChatBench;
use super::frame_bench::FrameBench;
use super::pacing::Pacing;
use super::{AppOptions, AppState, STATE_KEY, TpsApp, renderer, state_file};

/// The app in the native window, with the benchmark when one runs.
struct Window {
    app: TpsApp,
    bench: Option<FrameBench>,
    chat_bench: Option<ChatBench>,
    /// Writes the state file (none for a benchmark's window, which leaves the user's state).
    saver: Option<state_file::Saver>,
}

impl eframe::App for Window {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        if let Some(fb) = &mut self.bench {
            self.app.frame_bench_tick(fb, &ctx, frame.info().cpu_usage);
        }
        self.app.app_ui(ui);
        if let Some(saver) = &mut self.saver
            && let Err(e) = self.app.autosave(saver)
        {
            eprintln!("cannot save the window's state: {e}");
        }
        // After the frame: it has drained the answer's events by then.
        if let Some(cb) = &mut self.chat_bench {
            self.app.chat_bench_tick(cb, &ctx);
        }
    }

    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        renderer::clear_color(visuals)
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        // A benchmark's window started from defaults and leaves the user's state as it was.
        if self.bench.is_some() || self.chat_bench.is_some() {
            return;
        }
        if let Some(saver) = &mut self.saver
            && let Err(e) = saver.save_now(&self.app.state)
        {
            let path = saver.path().display();
            eprintln!("cannot save the window's state to {path}: {e}");
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
    let chat_bench = ChatBench::from_env()
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let benchmark = bench.is_some() || chat_bench.is_some();
    let painter = renderer::resolve(renderer);
    eprintln!("window: {}", painter.why);
    let native = renderer::native_options(&painter, benchmark, bench.is_some());
    let pacing = Pacing {
        software_painter: painter.software,
    };
    let (renderer, why) = (painter.renderer, painter.why);
    eframe::run_native(
        "TPS Lab",
        native,
        Box::new(move |cc| {
            let mut app = match benchmark {
                true => TpsApp::new(AppState::default(), options),
                false => TpsApp::from_creation_context(cc, options),
            };
            app.rt.pacing = pacing;
            if let Some(path) = &devices {
                app.set_device_table(path);
            }
            let bench = bench.map(|b| b.with_renderer(why.clone()));
            let chat_bench = chat_bench.map(|b| b.with_renderer(why));
            let saver = (!benchmark)
                .then(state_file::default_path)
                .flatten()
                .map(state_file::Saver::new);
            Ok(Box::new(Window {
                app,
                bench,
                chat_bench,
                saver,
            }))
        }),
    )
    .map_err(|e| {
        anyhow::anyhow!("cannot open the window ({renderer:?}): {e}; --renderer wgpu|glow picks the other painter")
    })
}
