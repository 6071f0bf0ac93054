//! Which painter draws the window: wgpu (Vulkan, Metal, DX12) or OpenGL through glow.
//!
//! `--renderer auto` (the default) asks wgpu for its best adapter before the window opens and
//! takes wgpu when that is a real GPU, OpenGL otherwise: on a machine without a usable GPU the
//! Vulkan fallback is lavapipe, whose 1280x800 frames of this window took ~170 ms on two busy
//! cores, while Mesa's OpenGL rasterizer (llvmpipe) drew the same frames in ~32 ms (BENCHMARKS.md,
//! "UI frame time"). winit allows one event loop per process, so a painter that cannot start is not
//! retried with the other: the error names the flag that picks it.

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

/// The painter to start with, and why (one line for the log and the frame benchmark).
pub fn resolve(choice: RendererChoice) -> (eframe::Renderer, String) {
    match choice {
        RendererChoice::Wgpu => (eframe::Renderer::Wgpu, "wgpu (--renderer wgpu)".into()),
        RendererChoice::Glow => (eframe::Renderer::Glow, "OpenGL (--renderer glow)".into()),
        RendererChoice::Auto => match wgpu_adapter() {
            Some(info) if info.device_type != eframe::wgpu::DeviceType::Cpu => (
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
    }
}

/// The window's options with `renderer`; for the frame benchmark (`bench`) frames are not held
/// to the display's refresh and the window size of the last session is not saved over.
pub fn native_options(renderer: eframe::Renderer, bench: bool) -> eframe::NativeOptions {
    eframe::NativeOptions {
        renderer,
        glow_options: eframe::egui_glow::GlowConfiguration {
            vsync: !bench,
            ..Default::default()
        },
        wgpu_options: eframe::WgpuConfiguration {
            surface: eframe::SurfaceConfig {
                present_mode: if bench {
                    eframe::wgpu::PresentMode::AutoNoVsync
                } else {
                    eframe::wgpu::PresentMode::AutoVsync
                },
                ..eframe::SurfaceConfig::LOW_LATENCY
            },
            ..Default::default()
        },
        persist_window: !bench,
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
