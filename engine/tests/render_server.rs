//! The chat-template render server (Linux): started first, as `main` does, every render goes
//! through it (a child of a small server, not a fork of this process) with the same answers and
//! the same limits as a render forked here.
#![cfg(target_os = "linux")]

use tpslab_engine::text::chat::{
    ChatError, ChatMessage, ChatTemplate, Overrun, start_render_server,
};

#[test]
fn renders_go_through_the_server_with_the_same_answers_and_limits() {
    assert!(start_render_server(), "the render server starts");
    assert!(start_render_server(), "a second start finds it running");
    let conv = [ChatMessage::system("Be brief."), ChatMessage::user("Hi!")];
    let chatml = ChatTemplate::chatml();
    let text = chatml.render(&conv, true).expect("renders");
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    // Many renders from many threads at once: each gets its own answer.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let msg = format!("message {i}");
                let t = ChatTemplate::chatml();
                let out = t
                    .render(&[ChatMessage::user(msg.clone())], false)
                    .expect("renders");
                assert!(out.contains(&msg), "{out}");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let runaway = |source: &str| {
        ChatTemplate::new(source, "", "")
            .expect("compiles")
            .named("Served")
            .render(&conv, true)
            .expect_err("runaway")
    };
    let e = runaway(include_str!("data/runaway/nested_loops.jinja"));
    assert!(
        matches!(
            e,
            ChatError::OverBudget {
                overrun: Overrun::Fuel(_),
                ..
            }
        ),
        "{e}"
    );
    // Through the server the child's signal is not known (its parent is the server, not us):
    // that it reads 0 shows the render did not fork from this process.
    let e = runaway(include_str!("data/runaway/string_doubling.jinja"));
    assert!(
        matches!(
            &e,
            ChatError::OverBudget {
                overrun: Overrun::Died { signal: 0, .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("memory limit"), "{e}");
    let raise =
        ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").expect("compiles");
    assert!(
        matches!(raise.render(&conv, true), Err(ChatError::Rejected(m)) if m == "no system role")
    );
}
