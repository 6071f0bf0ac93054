//! The window killed (SIGKILL) while an answer streams, then started again: every earlier
//! message of every conversation is there. The window runs in a child process (this test
//! binary again, with `TPSLAB_KILL_CHILD` naming its folder): it chats in two conversations
//! through its labels, saving after each frame as the native window does
//! ([`TpsApp::autosave`]), says when the second answer streams, and is killed then. The
//! parent reads what it left and opens a window on it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::panels::chat::{Conversation, Role};
use tpslab::ui::{AppState, TpsApp, state_file};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::serving::sampler::SamplingParams;

use crate::gui_wait::wait_until;
use crate::gui_window::{has, window};
use crate::temp_dir::TempDir;

const CHILD: &str = "TPSLAB_KILL_CHILD";
const STREAMING: &str = "KILL-ME: the second answer streams";
const FIRST: &str = "Tell me the capital of France.";
const SECOND: &str = "Write a very long story about a dragon who learns to bake bread.";

fn conversation(id: u64, max_tokens: usize) -> Conversation {
    Conversation {
        id,
        title: format!("Chat {id}"),
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..Conversation::default()
    }
}

fn send(h: &mut Harness<'static, TpsApp>, text: &str) {
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message").type_text(text);
    h.step();
    h.get_by_label("Send").click();
}

/// The child: two conversations, the first answered whole, the second killed mid-answer.
fn child(dir: &Path) {
    let mut state = AppState::default();
    state.chat.conversations = vec![conversation(1, 48), conversation(2, 4096)];
    state.chat.active = 1;
    let mut saver = state_file::Saver::new(dir.join("window-state.json"));
    let mut h = window(state, "default", DeviceChoice::Cpu, [1200.0, 900.0], |_| {});
    let mut frame = move |h: &mut Harness<'static, TpsApp>| {
        h.state_mut().autosave(&mut saver).expect("autosave");
    };
    wait_until(&mut h, "the model to load", 600, |h| {
        frame(h);
        h.state().engine().is_some()
    });
    send(&mut h, FIRST);
    wait_until(&mut h, "the first answer", 120, |h| {
        frame(h);
        let m = h.state().state.chat.conversations[0]
            .messages
            .last()
            .cloned();
        m.is_some_and(|m| {
            m.role == Role::Assistant
                && m.stats
                    .is_some_and(|s| s.finish == "stop" || s.finish == "length")
        })
    });
    h.state_mut().state.chat.active = 2;
    h.step();
    send(&mut h, SECOND);
    wait_until(&mut h, "the second answer to stream", 120, |h| {
        frame(h);
        let m = h.state().state.chat.conversations[1]
            .messages
            .last()
            .cloned();
        m.is_some_and(|m| m.role == Role::Assistant && m.text.len() > 20)
    });
    println!("{STREAMING}");
    // Frames go on (and save) until the parent kills the process.
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        h.step();
        frame(&mut h);
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("never killed");
}

#[test]
fn a_window_killed_mid_answer_keeps_every_earlier_message() {
    if let Some(dir) = std::env::var_os(CHILD) {
        return child(Path::new(&dir));
    }
    let dir = TempDir::new("gui-kill");
    let mut kid = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "gui_kill::a_window_killed_mid_answer_keeps_every_earlier_message",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &dir.0)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the child window");
    let out = BufReader::new(kid.stdout.take().expect("stdout"));
    let mut streaming = false;
    for line in out.lines().map_while(Result::ok) {
        if line.contains(STREAMING) {
            streaming = true;
            break;
        }
    }
    // SIGKILL: no exit hook, no last save.
    kid.kill().expect("kill");
    let status = kid.wait().expect("wait");
    assert!(
        streaming,
        "the child ended before the answer streamed: {status}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status}");

    let state: AppState =
        state_file::load(&dir.join("window-state.json")).expect("a state file that loads");
    let convs = &state.chat.conversations;
    assert_eq!(convs.len(), 2, "{convs:#?}");
    let first = &convs[0].messages;
    assert_eq!(first.len(), 2, "{first:#?}");
    assert_eq!((first[0].role, first[0].text.as_str()), (Role::User, FIRST));
    assert!(first[1].text.contains("Paris"), "{:?}", first[1].text);
    // The message sent before the kill is kept; the answer being written may be lost.
    let second = &convs[1].messages;
    assert_eq!(
        (second[0].role, second[0].text.as_str()),
        (Role::User, SECOND)
    );

    // Started again on that state, the window shows both conversations' messages.
    let mut h = window(state, "default", DeviceChoice::Cpu, [1200.0, 900.0], |_| {});
    h.state_mut().state.chat.active = 1;
    wait_until(&mut h, "the first conversation on screen", 30, |h| {
        has(h, FIRST) && has(h, "Paris")
    });
    h.state_mut().state.chat.active = 2;
    wait_until(&mut h, "the second conversation on screen", 30, |h| {
        has(h, SECOND)
    });
}
