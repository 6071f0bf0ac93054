//! The real window answering one chat message as a person sees it:
//! `TPSLAB_CHAT_BENCH=TOKENS,OUT.json[,PROMPT] tpslab` (under Xvfb here; tests/bench/chat-window-tps.sh).
//!
//! Unlike the frame benchmark ([`super::frame_bench`]) nothing is forced: the window keeps its
//! vsync and its own frame pacing, and draws only the frames the engine's news and its own
//! widgets ask for. Once the model is loaded it sizes the window to 1280x800, opens the Chat
//! page, sends PROMPT in a fresh conversation (greedy, at most TOKENS tokens, as
//! `tpslab generate --chat -n TOKENS` does), waits for the whole answer, writes its figures to
//! OUT.json and closes: the decode speed under the answer (tokens as the window drew them) and
//! the engine's own figure for the same request, the frames drawn meanwhile and the painter.
//! It starts from default settings and saves nothing.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use tpslab_engine::serving::sampler::SamplingParams;

use super::command::{ChatCommand, Command};
use super::panels::chat::Role;
use super::{Tab, TpsApp};

/// The prompt when none is given: one that the default model answers at length.
const PROMPT: &str = "Write a long story about a lighthouse keeper, in many paragraphs.";

pub struct ChatBench {
    tokens: usize,
    out: PathBuf,
    prompt: String,
    renderer: String,
    /// When the message was sent.
    sent: Option<Instant>,
    /// Frames drawn since then.
    frames: usize,
    done: bool,
}

#[derive(Serialize)]
struct Report {
    tokens: usize,
    finish: String,
    /// The figure under the answer: its tokens as the window drained them.
    window_decode_tps: Option<f64>,
    /// The engine's per-request decode speed for the same answer (its own token times).
    engine_decode_tps: Option<f64>,
    ttft_ms: Option<f64>,
    /// Frames drawn from the send to the answer's end, and over how long.
    frames: usize,
    seconds: f64,
    /// The frame rate the window held itself to while the engine ran.
    frame_cap_fps: u32,
    renderer: String,
    device: String,
    threads: usize,
}

impl ChatBench {
    /// From `TPSLAB_CHAT_BENCH` ("256,/tmp/chat.json"): `None` when unset, an error when
    /// malformed.
    pub fn from_env() -> Option<Result<Self, String>> {
        let v = std::env::var("TPSLAB_CHAT_BENCH").ok()?;
        let mut it = v.splitn(3, ',');
        let tokens = it.next().and_then(|t| t.trim().parse::<usize>().ok());
        let out = it.next().map(str::trim).filter(|o| !o.is_empty());
        let prompt = it.next().map_or(PROMPT, str::trim).to_string();
        Some(match (tokens, out) {
            (Some(tokens), Some(out)) if tokens > 0 && !prompt.is_empty() => Ok(Self {
                tokens,
                out: PathBuf::from(out),
                prompt,
                renderer: String::new(),
                sent: None,
                frames: 0,
                done: false,
            }),
            _ => Err(format!(
                "TPSLAB_CHAT_BENCH={v:?}: expected TOKENS,OUT.json[,PROMPT] with TOKENS > 0"
            )),
        })
    }

    /// Records which painter draws the frames (and why) in the report.
    pub fn with_renderer(self, renderer: String) -> Self {
        Self { renderer, ..self }
    }
}

impl TpsApp {
    /// One frame of the chat benchmark, before the app's frame. Asks for no frame itself.
    pub(super) fn chat_bench_tick(&mut self, b: &mut ChatBench, ctx: &egui::Context) {
        if b.done {
            return;
        }
        let Some(sent) = b.sent else {
            if self.engine().is_some() {
                ctx.send_viewport_cmd(egui::ViewportCommand::InnerSize(egui::vec2(1280.0, 800.0)));
                self.state.tab = Tab::Chat;
                let chat = self.state.chat.new_conversation();
                if let Some(conv) = self.state.chat.get_mut(chat) {
                    conv.sampling = SamplingParams::greedy();
                    conv.max_tokens = b.tokens;
                }
                let text = b.prompt.clone();
                self.apply(Command::Chat(ChatCommand::Send { chat, text }), ctx);
                b.sent = Some(Instant::now());
            }
            return;
        };
        b.frames += 1;
        let chat = self.state.chat.active;
        if self.rt.chat.busy(chat) {
            return;
        }
        b.done = true;
        let answer = (self.state.chat.conversations.iter())
            .find(|c| c.id == chat)
            .and_then(|c| c.messages.last())
            .filter(|m| m.role == Role::Assistant);
        let stats = answer.and_then(|m| m.stats.clone()).unwrap_or_default();
        let snap = self.engine().map(|e| e.stats()).unwrap_or_default();
        let report = Report {
            tokens: stats.tokens,
            finish: stats.finish,
            window_decode_tps: stats.decode_tps,
            // The only request this engine ran, finished within the metrics' window.
            engine_decode_tps: snap.live.per_request_tps_mean,
            ttft_ms: stats.ttft_ms,
            frames: b.frames,
            seconds: sent.elapsed().as_secs_f64(),
            frame_cap_fps: self.rt.pacing.fps(true),
            renderer: b.renderer.clone(),
            device: snap.device,
            threads: snap.threads,
        };
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        if let Err(e) = std::fs::write(&b.out, text) {
            eprintln!("chat bench: cannot write {}: {e}", b.out.display());
        }
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}
