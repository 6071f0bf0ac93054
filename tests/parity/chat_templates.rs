//! The real chat templates of the families TPS Lab runs (llama.cpp's models/templates/: Llama
//! 3.1 / 3.2 / 3.3, Qwen2.5, Qwen3, Gemma 2, Phi-3.5, Mistral Nemo, SmolLM3, DeepSeek-R1 distills,
//! gpt-oss)
//! render exactly as jinja2 renders them under transformers' setup, for conversations with and
//! without system messages, several turns, tools and tool calls, documents, reasoning history,
//! `add_generation_prompt` and `enable_thinking` on, off and absent, on a pinned date.
//!
//! The expected renders, the conversations and the template checksums are in
//! tests/data/chat_templates.json, written by tests/data/chat_templates.py (jinja2 with
//! transformers' `_compile_jinja_template` setup, and llama.cpp's folding of a system message
//! into the first user turn for a template that does not read one). A render the reference
//! refused with `raise_exception` must be refused with the same message; one that failed inside
//! jinja2 (a Python type error in the template) must fail here too.

use serde_json::Value;
use sha2::{Digest, Sha256};
use tpslab_engine::text::chat::{ChatError, ChatMessage, ChatTemplate, RenderOptions, RenderTime};

use crate::llamacpp;

const REFERENCE: &str = include_str!("../data/chat_templates.json");

fn options(case: &Value, now: RenderTime) -> RenderOptions {
    let o = &case["options"];
    let list = |k: &str| o.get(k).and_then(Value::as_array).cloned();
    RenderOptions {
        add_generation_prompt: o["add_generation_prompt"].as_bool().unwrap_or(false),
        tools: list("tools"),
        documents: list("documents"),
        enable_thinking: o.get("enable_thinking").and_then(Value::as_bool),
        now,
        // transformers passes no `date_string` (llama-server's, checked below).
        server_dates: false,
    }
}

/// What went differently in one render, or None when it matched.
fn compare(got: Result<String, ChatError>, want: &Value) -> Option<String> {
    match (got, want) {
        (Ok(text), w) if w.get("text").is_some() => (w["text"].as_str() != Some(text.as_str()))
            .then(|| {
                format!(
                    "rendered\n{text:?}\nexpected\n{:?}",
                    w["text"].as_str().unwrap_or_default()
                )
            }),
        (Err(ChatError::Rejected(m)), w) if w.get("rejected").is_some() => (w["rejected"].as_str()
            != Some(m.as_str()))
        .then(|| format!("rejected with {m:?}, expected {}", w["rejected"])),
        (Err(ChatError::Render(_)), w) if w.get("failed").is_some() => None,
        (got, w) => Some(format!("got {got:?}, expected {w}")),
    }
}

#[test]
fn real_templates_render_as_transformers_does() {
    let reference: Value = serde_json::from_str(REFERENCE).expect("reference JSON");
    let now = RenderTime::utc(reference["now_unix"].as_i64().expect("now_unix"));
    let cases = reference["cases"].as_object().expect("cases");
    let templates = reference["templates"].as_object().expect("templates");
    assert_eq!(templates.len(), 12, "the families of issues 16 and 19");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (name, t) in templates {
        let source = llamacpp::template(name);
        let sha = format!("{:x}", Sha256::digest(source.as_bytes()));
        assert_eq!(
            Some(sha.as_str()),
            t["sha256"].as_str(),
            "{name}: not the template the reference was made from"
        );
        let template = ChatTemplate::new(
            &source,
            t["bos_token"].as_str().unwrap_or_default(),
            t["eos_token"].as_str().unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (case, want) in t["renders"].as_object().expect("renders") {
            let c = &cases[case];
            let messages: Vec<ChatMessage> =
                serde_json::from_value(c["messages"].clone()).expect("messages");
            let got = template.render_with(&messages, &options(c, now));
            if let Some(why) = compare(got, want) {
                wrong.push(format!("{name} / {case}: {why}"));
            }
            checked += 1;
        }
    }
    assert!(checked >= 150, "only {checked} renders checked");
    assert!(
        wrong.is_empty(),
        "{} of {checked} renders differ from jinja2:\n\n{}",
        wrong.len(),
        wrong.join("\n\n")
    );
}

/// The Llama 3.2 template dates its system prompt with `strftime_now`, from the clock the caller
/// gives (not a fixed 2024 date); Llama 3.1's and 3.3's read llama-server's `date_string` (else
/// their fixed "26 Jul 2024", as transformers renders them); and Gemma 2 takes a system message
/// folded into the first user turn instead of refusing it.
#[test]
fn dates_follow_the_clock_and_gemma_takes_a_system_message() {
    let llama = ChatTemplate::new(
        &llamacpp::template("meta-llama-Llama-3.2-3B-Instruct"),
        "<|begin_of_text|>",
        "<|eot_id|>",
    )
    .expect("compile");
    let conv = [ChatMessage::user("Hi")];
    for (unix, date) in [(0, "01 Jan 1970"), (1_782_864_000, "01 Jul 2026")] {
        let opts = RenderOptions {
            now: RenderTime::utc(unix),
            ..RenderOptions::new(true)
        };
        let text = llama.render_with(&conv, &opts).expect("render");
        assert!(text.contains(&format!("Today Date: {date}\n")), "{text}");
    }
    for name in [
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.3-70B-Instruct",
    ] {
        let t = ChatTemplate::new(&llamacpp::template(name), "<|begin_of_text|>", "<|eot_id|>")
            .expect("compile");
        for (server_dates, date) in [(true, "01 Jul 2026"), (false, "26 Jul 2024")] {
            let opts = RenderOptions {
                now: RenderTime::utc(1_782_864_000),
                server_dates,
                ..RenderOptions::new(true)
            };
            let text = t.render_with(&conv, &opts).expect("render");
            assert!(
                text.contains(&format!("Today Date: {date}\n")),
                "{name}: {text}"
            );
        }
    }
    let gemma = ChatTemplate::new(
        &llamacpp::template("google-gemma-2-2b-it"),
        "<bos>",
        "<eos>",
    )
    .expect("compile");
    let text = gemma
        .render(
            &[ChatMessage::system("Be brief."), ChatMessage::user("Hi")],
            true,
        )
        .expect("a system message is folded, not refused");
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // Roles that do not alternate are still the template's to refuse.
    let bad = gemma.render(&[ChatMessage::user("a"), ChatMessage::user("b")], true);
    assert!(matches!(bad, Err(ChatError::Rejected(_))), "{bad:?}");
}

/// gpt-oss's real template writes harmony: its generation prompt opens an assistant message
/// without a channel, so the answer names its channels itself; the reasoning pair read from
/// the template is harmony's, and an answer in that format splits into its analysis and its
/// final message. Its tool format is harmony's too: a call written the way the template writes
/// one in the history (recipient first, commentary channel) reads back as that call.
#[test]
fn gpt_oss_writes_harmony_and_its_channels_split() {
    use tpslab_engine::text::reasoning::{HARMONY, ReasoningParser, ReasoningTags};
    use tpslab_engine::text::tool_calls::{ToolCall, ToolCallParser, ToolFormat};
    let source = llamacpp::template("openai-gpt-oss-120b");
    let template = ChatTemplate::new(&source, "<|startoftext|>", "<|return|>").expect("compile");
    let prompt = template
        .render_with(
            &[
                ChatMessage::system("Be brief."),
                ChatMessage::user("What is 2+2?"),
            ],
            &RenderOptions {
                now: RenderTime::utc(1_782_864_000),
                ..RenderOptions::new(true)
            },
        )
        .expect("render");
    assert!(prompt.starts_with("<|start|>system<|message|>"), "{prompt}");
    assert!(
        prompt.contains("<|start|>user<|message|>What is 2+2?<|end|>"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");
    let tags = ReasoningTags::for_template(template.source());
    assert_eq!(tags, HARMONY);
    assert!(tags.keeps_control_tokens());
    let mut p = ReasoningParser::for_prompt(tags, &prompt);
    let mut got = p.push("<|channel|>analysis<|message|>Simple sum.<|end|>");
    got.extend(p.push("<|start|>assistant<|channel|>final<|message|>4"));
    got.extend(p.finish());
    assert_eq!(
        (got.reasoning.as_str(), got.content.as_str()),
        ("Simple sum.", "4")
    );
    // Its calls: what the template writes for an assistant's call in the history reads back as
    // that call, and so does an answer that thinks, says a preamble, then calls.
    assert_eq!(
        ToolFormat::for_template(template.source()),
        ToolFormat::Harmony
    );
    let call = ToolCall {
        name: "get_weather".into(),
        arguments: r#"{"location":"Paris"}"#.into(),
    };
    let history = template
        .render_with(
            &serde_json::from_value::<Vec<ChatMessage>>(serde_json::json!([
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18"},
            ]))
            .expect("messages"),
            &RenderOptions::new(false),
        )
        .expect("render");
    let written = history
        .split("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")
        .nth(1)
        .and_then(|rest| rest.split("<|start|>functions.get_weather").next())
        .expect("the assistant's call in the history");
    assert!(written.contains("to=functions.get_weather"), "{written}");
    let answer = format!(
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant\
         <|channel|>commentary<|message|>Checking.<|end|><|start|>assistant{written}"
    );
    for text in [written, answer.as_str()] {
        let split = ReasoningParser::for_prompt(tags, &prompt).split_all(text);
        let (content, calls) = ToolCallParser::parse_all(ToolFormat::Harmony, &split.content);
        assert_eq!(calls, std::slice::from_ref(&call), "{text}");
        assert!(["", "Checking."].contains(&content.trim()), "{content:?}");
    }
}
