//! Runaway chat templates (a template is a program inside a model file) stop within a few
//! seconds with one clear error naming the model and the limit, and leave the process whole:
//! nested loops run out of fuel, a doubling string runs out of memory in the isolated render,
//! deep recursion hits the recursion limit, an output bomb hits the output cap. Real templates
//! render as before under the same default budget.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tpslab_engine::formats::gguf::Value;
use tpslab_engine::formats::gguf_write::copy_with_metadata;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::generate::GenerateError;
use tpslab_engine::text::chat::{ChatError, ChatMessage, ChatTemplate, Overrun, RenderBudget};

/// Templates that never end on their own (also used by the CLI, server and window tests).
const NESTED_LOOPS: &str = include_str!("../data/runaway/nested_loops.jinja");
const STRING_DOUBLING: &str = include_str!("../data/runaway/string_doubling.jinja");
const MACRO_DOUBLING: &str = include_str!("../data/runaway/macro_doubling.jinja");
const DEEP_RECURSION: &str = include_str!("../data/runaway/deep_recursion.jinja");
const WIDE_RECURSION: &str = include_str!("../data/runaway/wide_recursion.jinja");
const OUTPUT_BOMB: &str = include_str!("../data/runaway/output_bomb.jinja");

fn conversation() -> Vec<ChatMessage> {
    vec![ChatMessage::system("Be brief."), ChatMessage::user("Hi!")]
}

/// Renders `source` under the default budget; returns the error and how long it took.
fn runaway(source: &str) -> (ChatError, Duration) {
    let t = ChatTemplate::new(source, "", "")
        .expect("compiles")
        .named("Runaway-Test");
    let start = Instant::now();
    let err = t
        .render(&conversation(), true)
        .expect_err("a runaway template must not render");
    eprintln!("{:?}: {err}", start.elapsed());
    (err, start.elapsed())
}

/// Within "a few seconds": the time limit of the default budget, plus slack for a loaded machine.
fn few_seconds() -> Duration {
    RenderBudget::default().time_limit + Duration::from_secs(5)
}

#[test]
fn nested_loops_run_out_of_fuel() {
    let (err, took) = runaway(NESTED_LOOPS);
    let fuel = RenderBudget::default().fuel;
    assert!(
        matches!(&err, ChatError::OverBudget { overrun: Overrun::Fuel(n), .. } if *n == fuel),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("Runaway-Test") && msg.contains(&fuel.to_string()),
        "{msg}"
    );
    assert!(took < few_seconds(), "took {took:?}");
}

/// Only Linux renders in a child with a memory limit; elsewhere this would take the test's memory.
#[cfg(target_os = "linux")]
#[test]
fn doubling_strings_run_out_of_memory_alone() {
    for source in [STRING_DOUBLING, MACRO_DOUBLING] {
        let (err, took) = runaway(source);
        let limit = RenderBudget::default().max_memory;
        assert!(
            matches!(&err, ChatError::OverBudget { overrun: Overrun::Died { memory, .. }, .. } if *memory == limit)
                || matches!(
                    &err,
                    ChatError::OverBudget {
                        overrun: Overrun::Time(_),
                        ..
                    }
                ),
            "{source}: {err}"
        );
        assert!(err.to_string().contains("Runaway-Test"), "{err}");
        assert!(took < few_seconds(), "{source}: took {took:?}");
    }
    // This process still allocates and renders.
    let ok = ChatTemplate::chatml()
        .render(&conversation(), true)
        .expect("renders");
    assert!(ok.ends_with("<|im_start|>assistant\n"));
}

#[test]
fn deep_and_wide_recursion_stop() {
    let (err, took) = runaway(DEEP_RECURSION);
    assert!(
        matches!(
            &err,
            ChatError::OverBudget {
                overrun: Overrun::Depth(500),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("Runaway-Test"), "{err}");
    assert!(took < few_seconds(), "took {took:?}");
    let (err, took) = runaway(WIDE_RECURSION);
    assert!(
        matches!(
            &err,
            ChatError::OverBudget {
                overrun: Overrun::Fuel(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(took < few_seconds(), "took {took:?}");
}

#[test]
fn output_bombs_hit_the_output_cap() {
    let (err, took) = runaway(OUTPUT_BOMB);
    let cap = RenderBudget::default().max_output;
    assert!(
        matches!(&err, ChatError::OverBudget { overrun: Overrun::Output(n), .. } if *n == cap),
        "{err}"
    );
    assert!(err.to_string().contains("16 MiB"), "{err}");
    assert!(took < few_seconds(), "took {took:?}");
}

#[test]
fn a_tight_budget_stops_what_the_default_lets_through() {
    let t = ChatTemplate::chatml();
    let long: Vec<ChatMessage> = (0..200)
        .map(|i| ChatMessage::user(format!("message {i}")))
        .collect();
    let text = t
        .render(&long, true)
        .expect("the default budget renders 200 messages");
    assert!(text.contains("message 199"));
    let tight = t.clone().with_budget(RenderBudget {
        fuel: 100,
        ..RenderBudget::default()
    });
    let err = tight
        .render(&long, true)
        .expect_err("100 steps are too few");
    assert!(
        matches!(
            err,
            ChatError::OverBudget {
                overrun: Overrun::Fuel(100),
                ..
            }
        ),
        "{err}"
    );
    let small = t.with_budget(RenderBudget {
        max_output: 1000,
        ..RenderBudget::default()
    });
    let err = small.render(&long, true).expect_err("over 1000 bytes");
    assert!(
        matches!(
            err,
            ChatError::OverBudget {
                overrun: Overrun::Output(1000),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn template_errors_are_still_told_apart() {
    let raise = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "")
        .expect("compiles");
    match raise.render(&conversation(), true) {
        Err(ChatError::Rejected(m)) => assert_eq!(m, "roles must alternate"),
        other => panic!("{other:?}"),
    }
    let broken = ChatTemplate::new("{{ messages[0].content.nope() }}", "", "").expect("compiles");
    assert!(matches!(
        broken.render(&conversation(), true),
        Err(ChatError::Render(_))
    ));
}

fn default_model() -> PathBuf {
    tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model")
}

/// A model file whose template loops: the error from the model's own chat prompt names the
/// model (its `general.name`) and the limit.
#[test]
fn a_model_file_with_a_runaway_template_refuses_its_chat_prompt() {
    let dir = std::env::temp_dir().join(format!("tpslab-tmpl-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("runaway.gguf");
    copy_with_metadata(
        &default_model(),
        &path,
        &[
            (
                "tokenizer.chat_template".into(),
                Value::String(NESTED_LOOPS.into()),
            ),
            ("general.name".into(), Value::String("Runaway Model".into())),
        ],
    )
    .expect("copy");
    let lm = LoadedModel::load(&path).expect("loads: the template is only run when used");
    let start = Instant::now();
    // The bundle's own error (`LoadError`), as a generation reports it.
    let err = GenerateError::from(lm.chat_prompt(&conversation()).expect_err("runaway"));
    assert!(start.elapsed() < few_seconds());
    assert!(
        matches!(err, GenerateError::Chat(ChatError::OverBudget { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("Runaway Model"), "{err}");
    // Plain prompts still work on the same model.
    assert!(!lm.raw_prompt("Hello").expect("raw").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
