//! The real window measuring its own frame time, rendering included:
//! `TPSLAB_FRAME_BENCH=SECONDS,CONCURRENCY,OUT.json[,full|chat|sweep] tpslab` (under Xvfb here).
//! Once the model is loaded it sizes the window to 1280x800, opens the dashboard, starts the load
//! generator (prompt 32, output 512 tokens, CONCURRENCY requests), repaints continuously with
//! vsync off, records the time between frames (layout, tessellation and the renderer's work:
//! the whole frame) and eframe's CPU time per frame, writes the percentiles and the painter to
//! OUT.json and closes the window. With `full`, the plots' history is first filled to its
//! 10-minute capacity with noisy samples (the most the plots ever draw, as after a long session).
//! With `chat`, the chat tab is measured instead: a conversation of 20 earlier exchanges in
//! markdown, and a new message whose answer streams in the same batch as CONCURRENCY - 1 load
//! requests. With `sweep`, the dashboard's sweep runs instead of a steady load: concurrency 1, 2,
//! 4, ... up to CONCURRENCY (prompt 32, output 64), so the live trade-off view fills with one
//! point per batch size (what the README's screenshot shows).

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::command::{ChatCommand, Command};
use super::panels::chat::{Message, Role};
use super::{Tab, TpsApp};

/// Frames after the load starts that are not counted (first plots, font atlas, shader warm-up).
const WARMUP_S: f64 = 3.0;

pub struct FrameBench {
    secs: f64,
    concurrency: usize,
    out: PathBuf,
    started: Option<Instant>,
    last: Option<Instant>,
    intervals_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    done: bool,
    renderer: String,
    scenario: Scenario,
}

/// What the window shows while it is timed.
#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Scenario {
    Dashboard,
    /// The dashboard with the plots' history filled to capacity.
    DashboardFullHistory,
    /// The chat tab, an answer streaming among the load's requests.
    Chat,
    /// The dashboard during a sweep of concurrency levels.
    Sweep,
}

#[derive(Serialize)]
struct Report {
    frames: usize,
    seconds: f64,
    concurrency: usize,
    frame_ms_p50: f64,
    frame_ms_p90: f64,
    frame_ms_p99: f64,
    frame_ms_max: f64,
    cpu_ms_p50: f64,
    cpu_ms_p99: f64,
    aggregate_output_tps: f64,
    requests_in_flight: usize,
    device: String,
    renderer: String,
    scenario: Scenario,
    /// Samples in the plots' history when the report was written.
    history_samples: usize,
    /// Characters of the streamed chat answer when the report was written (chat scenario).
    chat_answer_chars: usize,
}

impl FrameBench {
    /// From `TPSLAB_FRAME_BENCH` ("20,64,/tmp/frames.json"); `None` when unset or malformed.
    pub fn from_env() -> Option<Self> {
        let v = std::env::var("TPSLAB_FRAME_BENCH").ok()?;
        let mut it = v.splitn(4, ',');
        let secs: f64 = it.next()?.trim().parse().ok()?;
        let concurrency: usize = it.next()?.trim().parse().ok()?;
        let out = PathBuf::from(it.next()?.trim());
        let scenario = match it.next().map(str::trim) {
            None => Scenario::Dashboard,
            Some("full") => Scenario::DashboardFullHistory,
            Some("chat") => Scenario::Chat,
            Some("sweep") => Scenario::Sweep,
            Some(_) => return None,
        };
        (secs > 0.0 && concurrency > 0).then_some(Self {
            secs,
            concurrency,
            out,
            started: None,
            last: None,
            intervals_ms: Vec::new(),
            cpu_ms: Vec::new(),
            done: false,
            renderer: String::new(),
            scenario,
        })
    }

    /// Records which painter draws the frames (and why) in the report.
    pub fn with_renderer(self, renderer: String) -> Self {
        Self { renderer, ..self }
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p / 100.0).round() as usize]
}

impl TpsApp {
    /// One frame of the frame benchmark, before the app's frame.
    pub(super) fn frame_bench_tick(
        &mut self,
        fb: &mut FrameBench,
        ctx: &egui::Context,
        cpu_s: Option<f32>,
    ) {
        if !fb.done {
            ctx.request_repaint();
            let now = Instant::now();
            match fb.started {
                None if self.engine().is_some() => {
                    // The same frame size every run, whatever size the last session saved.
                    ctx.send_viewport_cmd(egui::ViewportCommand::InnerSize(egui::vec2(
                        1280.0, 800.0,
                    )));
                    self.state.tab = Tab::Dashboard;
                    let l = &mut self.state.dash.load;
                    // In the chat scenario the chat's answer is one of the CONCURRENCY streams.
                    let load = match fb.scenario {
                        Scenario::Chat => fb.concurrency.saturating_sub(1).max(1),
                        _ => fb.concurrency,
                    };
                    (l.concurrency, l.prompt_len, l.output_len) = (load, 32, 512);
                    l.remote.enabled = false;
                    if fb.scenario == Scenario::Sweep {
                        (l.sweep_max, l.output_len) = (fb.concurrency, 64);
                        self.apply(Command::StartSweep, ctx);
                    } else {
                        self.apply(Command::StartLoad, ctx);
                    }
                    if fb.scenario == Scenario::Chat {
                        self.start_bench_chat(ctx);
                    }
                    fb.started = Some(now);
                }
                None => {}
                Some(t0) => {
                    let t = (now - t0).as_secs_f64();
                    if fb.scenario == Scenario::DashboardFullHistory
                        && self.rt.history.samples.len() < 1000
                        && let Some(last) = self.rt.history.samples.back().cloned()
                    {
                        self.rt.history.fill_for_bench(&last);
                    }
                    if t > WARMUP_S {
                        if let Some(last) = fb.last {
                            fb.intervals_ms.push((now - last).as_secs_f64() * 1e3);
                        }
                        if let Some(c) = cpu_s {
                            fb.cpu_ms.push(f64::from(c) * 1e3);
                        }
                    }
                    if t > WARMUP_S + fb.secs {
                        self.finish_frame_bench(fb, ctx);
                    }
                }
            }
            fb.last = Some(now);
        }
    }

    /// The chat scenario: a conversation with earlier exchanges (markdown with code blocks, as
    /// answers come), then a real message whose answer streams while the frames are timed.
    fn start_bench_chat(&mut self, ctx: &egui::Context) {
        self.state.tab = Tab::Chat;
        let Some(conv) =
            (self.state.chat.conversations.iter_mut()).find(|c| c.id == self.state.chat.active)
        else {
            return;
        };
        conv.messages.clear();
        let body = "Here is a **short** answer with a list:\n\n- one item\n- another item\n\n\
                    ```rust\nfn fib(n: u64) -> u64 {\n    if n < 2 { n } else { fib(n - 1) + fib(n - 2) }\n}\n```\n\n\
                    And a closing paragraph that wraps over more than one line of the chat panel \
                    at this window size, as real answers do.";
        for i in 0..20 {
            conv.messages.push(Message {
                role: Role::User,
                text: format!("Earlier question {i}?"),
                ..Message::default()
            });
            conv.messages.push(Message {
                role: Role::Assistant,
                text: body.to_string(),
                ..Message::default()
            });
        }
        conv.max_tokens = 4096;
        let chat = conv.id;
        let text = "Write a long story about a lighthouse keeper, in many paragraphs.".to_string();
        self.apply(Command::Chat(ChatCommand::Send { chat, text }), ctx);
    }

    fn finish_frame_bench(&mut self, fb: &mut FrameBench, ctx: &egui::Context) {
        fb.done = true;
        let snap = self.rt.snapshot.clone().unwrap_or_default();
        let mut f = fb.intervals_ms.clone();
        let mut c = fb.cpu_ms.clone();
        let report = Report {
            frames: f.len(),
            seconds: fb.secs,
            concurrency: fb.concurrency,
            frame_ms_p50: pct(&mut f, 50.0),
            frame_ms_p90: pct(&mut f, 90.0),
            frame_ms_p99: pct(&mut f, 99.0),
            frame_ms_max: f.last().copied().unwrap_or(0.0),
            cpu_ms_p50: pct(&mut c, 50.0),
            cpu_ms_p99: pct(&mut c, 99.0),
            aggregate_output_tps: snap.live.output_tps,
            requests_in_flight: snap.live.requests_in_flight,
            device: snap.device,
            renderer: fb.renderer.clone(),
            scenario: fb.scenario,
            history_samples: self.rt.history.samples.len(),
            chat_answer_chars: (self.state.chat.conversations.iter())
                .find(|c| c.id == self.state.chat.active)
                .and_then(|c| c.messages.last())
                .filter(|m| m.role == Role::Assistant)
                .map_or(0, |m| m.text.len()),
        };
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        if let Err(e) = std::fs::write(&fb.out, text) {
            eprintln!("frame bench: cannot write {}: {e}", fb.out.display());
        }
        self.apply(Command::StopLoad, ctx);
        self.apply(Command::StopSweep, ctx);
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}
