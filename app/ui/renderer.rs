//! Which painter draws the window: wgpu (Vulkan, Metal, DX12) or OpenGL through glow.
//!
//! `--renderer auto` (the default) asks wgpu for its best adapter before the window opens and
//! takes wgpu when that is a real GPU, OpenGL otherwise: on a machine without a usable GPU the
//! Vulkan fallback is lavapipe, whose 1280x800 dashboard frames take ~46 ms on two busy cores,
//! while Mesa's OpenGL rasterizer (llvmpipe) draws the same frames in ~11 ms (BENCHMARKS.md,
//! "UI frame time"). winit allows one event loop per process, so a painter that cannot start is not
//! retried with the other: the error names the flag that picks it.
//!
//! Panels paint no background of their own ([`central_panel`], [`panel`]): the window is cleared
//! to the panel colour ([`clear_color`]), so each background pixel is written once. egui's default
//! frames fill every panel, and this window nests them (tab panel, then the dashboard's controls
//! and plots), which wrote the 1280x800 background ~3 times per frame: on a CPU rasterizer that
//! overdraw was most of the frame.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// `--renderer`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RendererChoice {
    /// wgpu on a GPU, OpenGL when wgpu's best adapter is a CPU rasterizer or there is none.
    #[default]
    Auto,
    Wgpu,
    /// OpenGL (glow).
    Glow,
}

/// The painter the window starts with.
pub struct Painter {
    pub renderer: eframe::Renderer,
    /// Why this one, in one line (for the log and the frame benchmark).
    pub why: String,
    /// wgpu's best adapter is a CPU rasterizer (or there is none): every pixel is shaded on the
    /// cores the engine computes on.
    pub software: bool,
}

/// The painter to start with, and why.
pub fn resolve(choice: RendererChoice) -> Painter {
    let adapter = wgpu_adapter();
    let software = adapter
        .as_ref()
        .is_none_or(|a| a.device_type == eframe::wgpu::DeviceType::Cpu);
    let (renderer, why) = match choice {
        RendererChoice::Wgpu => (eframe::Renderer::Wgpu, "wgpu (--renderer wgpu)".into()),
        RendererChoice::Glow => (eframe::Renderer::Glow, "OpenGL (--renderer glow)".into()),
        RendererChoice::Auto => match adapter {
            Some(info) if !software => (
                eframe::Renderer::Wgpu,
                format!("wgpu on {} ({:?})", info.name, info.backend),
            ),
            Some(info) => (
                eframe::Renderer::Glow,
                format!(
                    "OpenGL: wgpu's best adapter is {}, a CPU rasterizer",
                    info.name
                ),
            ),
            None => (
                eframe::Renderer::Glow,
                "OpenGL: wgpu found no adapter".into(),
            ),
        },
    };
    Painter {
        renderer,
        why,
        software,
    }
}

/// The window's options for `painter`. For the frame benchmark (`continuous`) frames are not
/// held to the display's refresh. For any benchmark (`bench`) the window neither loads nor
/// overwrites the user's saved state: it starts from the defaults every run (a saved egui
/// option, such as tessellation settings, would otherwise change what is measured).
///
/// On a CPU rasterizer egui's dithering is off: it adds a noise term to every shaded pixel to
/// hide 8-bit banding in gradients, which this window hardly has (shadows), and it was ~20% of
/// the frame there (BENCHMARKS.md, "UI frame time").
pub fn native_options(painter: &Painter, bench: bool, continuous: bool) -> eframe::NativeOptions {
    eframe::NativeOptions {
        renderer: painter.renderer,
        dithering: !painter.software,
        glow_options: eframe::egui_glow::GlowConfiguration {
            vsync: !continuous,
            ..Default::default()
        },
        wgpu_options: eframe::WgpuConfiguration {
            surface: eframe::SurfaceConfig {
                present_mode: if continuous {
                    eframe::wgpu::PresentMode::AutoNoVsync
                } else {
                    eframe::wgpu::PresentMode::AutoVsync
                },
                ..eframe::SurfaceConfig::LOW_LATENCY
            },
            ..Default::default()
        },
        persist_window: !bench,
        persistence_path: bench.then(|| {
            let file = std::env::temp_dir().join("tpslab-frame-bench.ron");
            // Nothing saved by the last benchmark run carries over.
            let _ = std::fs::remove_file(&file);
            file
        }),
        viewport: egui::ViewportBuilder::default()
            .with_title("TPS Lab")
            .with_inner_size([1280.0, 800.0])
            .with_min_inner_size([640.0, 400.0]),
        ..Default::default()
    }
}

/// The adapter wgpu would pick for a window (high performance, no fallback forced).
fn wgpu_adapter() -> Option<eframe::wgpu::AdapterInfo> {
    use eframe::wgpu;
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))?
    .ok()?;
    Some(adapter.get_info())
}

/// Runs a future that native wgpu resolves without waiting on anything else; `None` if it is
/// still pending after a few seconds (the window then opens with OpenGL instead of hanging).
fn block_on<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}

/// The colour the window is cleared to before egui paints: the panels' colour, since the panels
/// themselves paint none.
pub fn clear_color(visuals: &egui::Visuals) -> [f32; 4] {
    visuals.panel_fill.to_normalized_gamma_f32()
}

/// A central panel with egui's margins and no background (the clear colour is its background).
pub fn central_panel(ui: &egui::Ui) -> egui::CentralPanel {
    egui::CentralPanel::default()
        .frame(egui::Frame::central_panel(ui.style()).fill(egui::Color32::TRANSPARENT))
}

/// `p` with egui's side/top panel margins and no background.
pub fn panel(p: egui::Panel, ui: &egui::Ui) -> egui::Panel {
    p.frame(egui::Frame::side_top_panel(ui.style()).fill(egui::Color32::TRANSPARENT))
}
