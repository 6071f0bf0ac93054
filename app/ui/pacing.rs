//! Frame pacing: how often news from a worker (the engine's per-step callback above all) makes
//! the window draw a frame.
//!
//! egui's `request_repaint` asks for an immediate frame (two, in fact), so an engine waking the
//! window at every step drew a whole frame per token: on a CPU rasterizer (llvmpipe, which
//! `--renderer auto` picks where there is no GPU) each frame shades the window on the same cores
//! the engine computes on, and a single chat answer streamed at a fraction of the engine's speed
//! (BENCHMARKS.md, "A chat answer in the window"). [`wake`] asks for a frame *within* the current
//! interval instead: egui keeps the earliest pending request, so however many steps end in one
//! interval they cost one frame, drawn with all their tokens.
//!
//! The interval is the display's (60 Hz; eframe does not pass the monitor's rate to the app) and,
//! when the painter is a CPU rasterizer and the engine is busy, [`CPU_PAINTER_BUSY_FPS`] frames a
//! second, which the status bar says. Input (typing, the pointer) still draws at once.

use std::time::Duration;

/// Frames a second on a display: the most the window draws for news.
pub const DISPLAY_FPS: u32 = 60;

/// Frames a second for news while the engine computes and a CPU rasterizer paints.
pub const CPU_PAINTER_BUSY_FPS: u32 = 10;

/// Where the current interval lives (egui's context, which the engine's callback holds).
fn interval_id() -> egui::Id {
    egui::Id::unique("tpslab_frame_interval")
}

/// How the window paces its frames: what the painter is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pacing {
    /// The painter rasterizes on the CPU (the cores the engine computes on).
    pub software_painter: bool,
}

impl Pacing {
    /// Frames a second for news now, with the engine `busy` or not.
    pub fn fps(self, busy: bool) -> u32 {
        if self.software_painter && busy {
            CPU_PAINTER_BUSY_FPS
        } else {
            DISPLAY_FPS
        }
    }

    /// The status bar's note while frames are capped below the display's rate, else `None`.
    pub fn note(self, busy: bool) -> Option<String> {
        let fps = self.fps(busy);
        (fps < DISPLAY_FPS).then(|| {
            format!("Frames: {fps}/s while the engine runs (the window is painted on the CPU)")
        })
    }

    /// Sets the interval [`wake`] uses from now on (called once per frame).
    pub fn apply(self, ctx: &egui::Context, busy: bool) {
        let interval = Duration::from_secs(1) / self.fps(busy);
        ctx.data_mut(|d| d.insert_temp(interval_id(), interval));
    }
}

/// Wakes the window for news: one frame within the current interval, however often it is
/// called (from any thread).
pub fn wake(ctx: &egui::Context) {
    let interval = ctx.data(|d| d.get_temp::<Duration>(interval_id()));
    ctx.request_repaint_after(interval.unwrap_or(Duration::from_secs(1) / DISPLAY_FPS));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_applies_only_to_a_cpu_painter_while_the_engine_is_busy() {
        let cpu = Pacing {
            software_painter: true,
        };
        let gpu = Pacing::default();
        assert_eq!(cpu.fps(true), CPU_PAINTER_BUSY_FPS);
        assert_eq!(cpu.fps(false), DISPLAY_FPS);
        assert_eq!(gpu.fps(true), DISPLAY_FPS);
        assert!(cpu.note(true).is_some_and(|n| n.contains("10/s")));
        assert_eq!(cpu.note(false), None);
        assert_eq!(gpu.note(true), None);
    }

    #[test]
    fn wake_asks_for_a_frame_within_the_interval_not_at_once() {
        let ctx = egui::Context::default();
        Pacing {
            software_painter: true,
        }
        .apply(&ctx, true);
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&asked);
        ctx.set_request_repaint_callback(move |info| {
            if let Ok(mut l) = log.lock() {
                l.push(info.delay);
            }
        });
        for _ in 0..100 {
            wake(&ctx);
        }
        let asked = asked.lock().map(|l| l.clone()).unwrap_or_default();
        // One request reaches the integration for 100 wakes, and it is for 100 ms, not now.
        assert_eq!(asked, [Duration::from_millis(100)]);
    }
}
