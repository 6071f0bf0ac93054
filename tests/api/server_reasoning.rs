//! Reasoning over HTTP: the default model with DeepSeek-R1's real chat template (whose generation
//! prompt opens `<think>`), behind the real server over loopback. A chat answer's reasoning comes
//! back as `message.reasoning_content` (whole) and `delta.reasoning_content` (streamed), apart
//! from `content`, as llama-server and vLLM return it; `chat_template_kwargs.enable_thinking:
//! false` closes the block in the prompt and the answer is all content.
//!
//! The model does not think, so what it writes after `<think>\n` is what the split is checked
//! on: the same prompt's tokens sent to `/v1/completions` (greedy) give the raw text, and the
//! chat answer must be exactly that text split by the engine's reasoning parser. `/v1/responses`
//! returns the same split as a `reasoning` item and a message, whole and streamed.

use std::sync::Arc;

use serde_json::{Value, json};
use tpslab::serve::chat_input::ChatBody;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};
use tpslab_engine::text::reasoning::{ReasoningParser, Split, THINK};

use crate::http_client;
use crate::llamacpp;
use crate::runaway;
use http_client::{post, serve_model};

const QUESTION: &str = "What is the capital of France?";
const MAX_TOKENS: u32 = 16;

/// What the model writes after this prompt, greedy, from the completions endpoint (no template).
fn raw_answer(
    addr: std::net::SocketAddr,
    lm: &LoadedModel,
    enable_thinking: bool,
) -> (String, String) {
    let opts = RenderOptions {
        enable_thinking: Some(enable_thinking),
        ..RenderOptions::new(true)
    };
    let prompt = lm
        .template
        .render_with(&[ChatMessage::user(QUESTION)], &opts)
        .expect("render");
    let ids = lm.tokenizer.encode(&prompt, true).expect("encode");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let text = r.json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    (prompt, text)
}

fn chat(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// The streamed answer's reasoning and content, concatenated, and whether the first chunk named
/// the role.
fn streamed(addr: std::net::SocketAddr, body: &Value) -> (Split, bool) {
    let r = post(addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut out = Split::default();
    let mut role_first = false;
    for (i, e) in events.iter().filter(|e| *e != "[DONE]").enumerate() {
        let v: Value = serde_json::from_str(e).expect("chunk JSON");
        let delta = &v["choices"][0]["delta"];
        if i == 0 {
            role_first = delta["role"] == "assistant";
        }
        out.reasoning
            .push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        out.content
            .push_str(delta["content"].as_str().unwrap_or_default());
    }
    (out, role_first)
}

#[test]
fn reasoning_content_whole_and_streamed() {
    let dir = std::env::temp_dir().join(format!("tpslab-serve-reasoning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let template = llamacpp::template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B");
    let path = runaway::model_with_template(&dir, &template, "Thinking Served");
    let lm = Arc::new(LoadedModel::load(&path).expect("load"));
    let (server, _) = serve_model(Arc::clone(&lm));
    let addr = server.addr;

    // Thinking on (the default, as llama-server): the prompt ends inside `<think>`.
    let (prompt, raw) = raw_answer(addr, &lm, true);
    assert!(prompt.ends_with("<think>\n"), "{prompt:?}");
    let want = ReasoningParser::for_prompt(THINK, &prompt).split_all(&raw);
    assert!(
        !want.reasoning.is_empty(),
        "the model wrote nothing: {raw:?}"
    );
    let r = post(addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let message = r.json()["choices"][0]["message"].clone();
    assert_eq!(
        message["reasoning_content"],
        json!(want.reasoning),
        "{message}"
    );
    assert_eq!(message["content"], json!(want.content), "{message}");
    let (got, role_first) = streamed(addr, &chat(json!({"stream": true})));
    assert_eq!(got, want);
    assert!(role_first);
    responses_carry_the_reasoning(addr, &lm, &want);

    // Thinking off: the template closes the block in the prompt; all of the answer is content,
    // exactly as the model wrote it, and no reasoning field is sent.
    let (prompt, raw) = raw_answer(addr, &lm, false);
    assert!(prompt.ends_with("<think>\n</think>"), "{prompt:?}");
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let r = post(addr, "/v1/chat/completions", &chat(off.clone()));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let message = r.json()["choices"][0]["message"].clone();
    assert_eq!(message["content"], json!(raw), "{message}");
    assert!(message.get("reasoning_content").is_none(), "{message}");
    let mut stream_off = off;
    stream_off["stream"] = json!(true);
    let (got, _) = streamed(addr, &chat(stream_off));
    assert_eq!(
        got,
        Split {
            reasoning: String::new(),
            content: raw
        }
    );

    // A thinking switch that is not a boolean is the request's error.
    let bad = json!({"chat_template_kwargs": {"enable_thinking": "no"}});
    let r = post(addr, "/v1/chat/completions", &chat(bad));
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.error()["param"], "chat_template_kwargs");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/v1/responses` gives the same answer's reasoning as a `reasoning` item ahead of the message,
/// whole and streamed (`response.reasoning_text.delta` events joining to it), and counts its
/// tokens in `usage.output_tokens_details.reasoning_tokens`.
fn responses_carry_the_reasoning(addr: std::net::SocketAddr, lm: &LoadedModel, want: &Split) {
    let body = json!({"input": QUESTION, "max_output_tokens": MAX_TOKENS, "temperature": 0});
    let r = post(addr, "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let output = v["output"].as_array().expect("output");
    assert_eq!(output[0]["type"], "reasoning", "{v}");
    assert!(
        output[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("rs_")),
        "{v}"
    );
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text", "{v}");
    assert_eq!(
        output[0]["content"][0]["text"],
        json!(want.reasoning),
        "{v}"
    );
    let message = output
        .iter()
        .find(|o| o["type"] == "message")
        .expect("message");
    assert_eq!(message["content"][0]["text"], json!(want.content), "{v}");
    let counted = lm
        .tokenizer
        .encode(&want.reasoning, false)
        .expect("encode")
        .len();
    let details = &v["usage"]["output_tokens_details"];
    assert_eq!(details["reasoning_tokens"], json!(counted), "{v}");
    assert!(counted > 0 && counted as u64 <= v["usage"]["output_tokens"].as_u64().expect("out"));

    let mut sbody = body;
    sbody["stream"] = json!(true);
    let r = post(addr, "/v1/responses", &sbody);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let data: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).expect("event JSON"))
        .collect();
    let joined = |kind: &str| -> String {
        data.iter()
            .filter(|d| d["type"] == kind)
            .map(|d| d["delta"].as_str().expect("delta").to_string())
            .collect()
    };
    assert_eq!(joined("response.reasoning_text.delta"), want.reasoning);
    assert_eq!(joined("response.output_text.delta"), want.content);
    let done = data
        .iter()
        .find(|d| d["type"] == "response.reasoning_text.done")
        .expect("reasoning_text.done");
    assert_eq!(done["text"], json!(want.reasoning));
    let last = data.last().expect("events");
    assert_eq!(last["response"]["output"][0]["type"], "reasoning", "{last}");
    assert_eq!(
        last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
        json!(counted)
    );
}

/// OpenAI's tool round trip reaches the template: tools offered, an assistant turn with a call
/// (null content, arguments as a JSON string) and the tool's answer render without error and the
/// server answers.
#[test]
fn tool_calls_and_results_are_accepted() {
    let dir = std::env::temp_dir().join(format!("tpslab-serve-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let template = llamacpp::template("Qwen-Qwen2.5-7B-Instruct");
    let path = runaway::model_with_template(&dir, &template, "Tools Served");
    let lm = Arc::new(LoadedModel::load(&path).expect("load"));
    let (server, _) = serve_model(Arc::clone(&lm));
    let body = json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call12345", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call12345", "content": "18 C"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}],
        "max_tokens": 4,
        "temperature": 0,
    });
    let r = post(server.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["choices"][0]["message"]["content"].is_string());
    // The server's prompt is the template's render of the request as translated: the tool list,
    // the call with its arguments as the object they encode, the tool's answer.
    let chat: ChatBody = serde_json::from_value(body).expect("chat body");
    let (messages, options) = chat.into_chat().expect("translate");
    let prompt = lm
        .template
        .render_with(&messages, &options)
        .expect("render");
    assert!(
        prompt.contains(r#"{"name": "get_weather", "arguments": {"location": "Paris"}}"#)
            && prompt.contains("<tool_response>\n18 C\n</tool_response>")
            && prompt.contains(r#""name": "get_weather", "description": "Weather""#),
        "{prompt}"
    );
    let ids = lm.tokenizer.encode(&prompt, true).expect("encode");
    assert_eq!(r.json()["usage"]["prompt_tokens"], json!(ids.len()));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
