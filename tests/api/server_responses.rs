//! `/v1/responses` through real HTTP to `tpslab serve` on the real default model: a whole
//! response has OpenAI's shape and the same text the chat endpoint gives for the same
//! conversation (greedy); a streamed one sends its events in order (`event:` names matching
//! `data.type`, `sequence_number` counting from 0) and its text deltas join to the final text,
//! the same as whole; `instructions` go into the prompt (more input tokens); a named function
//! tool comes back as a `function_call` item whose arguments validate against its schema,
//! whole and streamed; `text.format` with a JSON schema gives JSON that keeps to it; a
//! conversation carrying a function call and its output is accepted as input; asked-for token
//! log-probabilities come on the message's text, whole and streamed; what cannot be
//! honoured (`previous_response_id`, `background`, built-in tools, image input) is a 400 naming
//! the field.

use std::net::SocketAddr;

use serde_json::{Value, json};
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};

use crate::http_client;
use http_client::{model, post, shared};

const QUESTION: &str = "What is the capital of France?";

fn responses(addr: SocketAddr, body: &Value) -> Value {
    let r = post(addr, "/v1/responses", body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// The SSE events of a streamed response, as (event name, data).
fn events(addr: SocketAddr, body: &Value) -> Vec<(String, Value)> {
    let mut b = body.clone();
    b["stream"] = json!(true);
    let r = post(addr, "/v1/responses", &b);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let mut out = Vec::new();
    for (i, block) in text
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .enumerate()
    {
        let name = block
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_else(|| panic!("no event line in {block:?}"));
        let data = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no data line in {block:?}"));
        let v: Value = serde_json::from_str(data).expect("event JSON");
        assert_eq!(v["type"], name, "{block}");
        assert_eq!(v["sequence_number"], json!(i), "{block}");
        out.push((name.to_string(), v));
    }
    out
}

fn text_of(response: &Value) -> String {
    response["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|o| o["type"] == "message")
        .flat_map(|o| o["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "output_text")
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect()
}

fn check_shape(v: &Value) {
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("resp_")),
        "{v}"
    );
    assert_eq!(v["object"], "response", "{v}");
    assert!(v["created_at"].is_u64(), "{v}");
    let u = &v["usage"];
    let (i, o) = (
        u["input_tokens"].as_u64().expect("in"),
        u["output_tokens"].as_u64().expect("out"),
    );
    assert_eq!(u["total_tokens"].as_u64(), Some(i + o), "{v}");
    match v["status"].as_str() {
        Some("completed") => assert!(v["incomplete_details"].is_null(), "{v}"),
        Some("incomplete") => assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens"),
        other => panic!("status {other:?}: {v}"),
    }
    for item in v["output"].as_array().expect("output") {
        assert!(
            item["id"].is_string() && item["status"].is_string(),
            "{item}"
        );
        if item["type"] == "message" {
            assert_eq!(item["role"], "assistant");
            assert_eq!(item["content"][0]["annotations"], json!([]));
        }
    }
}

#[test]
fn whole_response_matches_chat() {
    let addr = shared();
    let v = responses(
        addr,
        &json!({"input": QUESTION, "max_output_tokens": 16, "temperature": 0, "store": true}),
    );
    check_shape(&v);
    assert_eq!(v["output"][0]["type"], "message", "{v}");
    let text = text_of(&v);
    assert!(!text.is_empty(), "{v}");
    let chat = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(chat.status, 200);
    let c = chat.json();
    assert_eq!(json!(text), c["choices"][0]["message"]["content"]);
    assert_eq!(v["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    // A list of messages with input_text parts is the same conversation.
    let parts = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
                       "max_output_tokens": 16, "temperature": 0});
    assert_eq!(text_of(&responses(addr, &parts)), text);
}

#[test]
fn streamed_events_in_order_join_to_the_text() {
    let addr = shared();
    let body = json!({"input": QUESTION, "max_output_tokens": 16, "temperature": 0});
    let whole = text_of(&responses(addr, &body));
    let ev = events(addr, &body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(deltas >= 1, "{names:?}");
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    let last = *names.last().expect("events");
    assert!(
        last == "response.completed" || last == "response.incomplete",
        "{names:?}"
    );
    want.push(last);
    assert_eq!(names, want);
    let joined: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().expect("delta").to_string())
        .collect();
    let done = ev
        .iter()
        .find(|(n, _)| n == "response.output_text.done")
        .expect("done");
    assert_eq!(done.1["text"], json!(joined));
    let final_response = &ev.last().expect("last").1["response"];
    check_shape(final_response);
    assert_eq!(text_of(final_response), joined);
    assert_eq!(joined, whole, "greedy: streamed as whole");
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
}

/// `instructions` are the system message: the prompt is the template's render of them and
/// the input (SmolLM2's template puts its own system line in when there is none).
#[test]
fn instructions_go_into_the_prompt() {
    let addr = shared();
    let instructions = "Answer in French, in one word, and nothing else.";
    let plain = responses(addr, &json!({"input": QUESTION, "max_output_tokens": 4}));
    let told = responses(
        addr,
        &json!({"input": QUESTION, "max_output_tokens": 4, "instructions": instructions}),
    );
    let n = |v: &Value| v["usage"]["input_tokens"].as_u64().expect("input tokens");
    let lm = model();
    let rendered = |messages: &[ChatMessage]| {
        let text = lm
            .template
            .render_with(messages, &RenderOptions::conversation())
            .expect("render");
        lm.tokenizer.encode(&text, true).expect("encode").len() as u64
    };
    let with = [
        ChatMessage::system(instructions),
        ChatMessage::user(QUESTION),
    ];
    assert_eq!(n(&told), rendered(&with));
    assert_eq!(n(&plain), rendered(&[ChatMessage::user(QUESTION)]));
    assert_ne!(n(&told), n(&plain));
}

fn add_tool() -> Value {
    let int = json!({"type": "integer", "minimum": -1000, "maximum": 1000});
    json!({"type": "function", "name": "add", "description": "Add two numbers",
           "parameters": {"type": "object", "properties": {"a": int, "b": int},
                          "required": ["a", "b"], "additionalProperties": false}})
}

fn check_args(arguments: &str) {
    let args: Value = serde_json::from_str(arguments).expect("arguments are JSON");
    let validator = jsonschema::validator_for(&add_tool()["parameters"]).expect("schema");
    assert!(validator.is_valid(&args), "{arguments}");
}

#[test]
fn named_function_tool_gives_a_function_call() {
    let addr = shared();
    let body = json!({"input": "Add 2 and 3.", "tools": [add_tool()],
                      "tool_choice": {"type": "function", "name": "add"},
                      "max_output_tokens": 64, "temperature": 0});
    let v = responses(addr, &body);
    check_shape(&v);
    let call = v["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|o| o["type"] == "function_call")
        .unwrap_or_else(|| panic!("no function_call: {v}"))
        .clone();
    assert_eq!(call["name"], "add");
    assert!(
        call["call_id"]
            .as_str()
            .is_some_and(|c| c.starts_with("call_")),
        "{call}"
    );
    check_args(call["arguments"].as_str().expect("arguments"));

    let ev = events(addr, &body);
    let added = ev
        .iter()
        .find(|(n, v)| n == "response.output_item.added" && v["item"]["type"] == "function_call")
        .expect("a function_call item");
    assert_eq!(added.1["item"]["name"], "add");
    let joined: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, v)| v["delta"].as_str().expect("delta").to_string())
        .collect();
    assert_eq!(
        json!(joined),
        call["arguments"],
        "greedy: streamed as whole"
    );
    let done = ev
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done.1["arguments"], json!(joined));
    assert_eq!(ev.last().expect("last").0, "response.completed");
}

#[test]
fn text_format_json_schema_keeps_to_the_schema() {
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"], "additionalProperties": false});
    let v = responses(
        shared(),
        &json!({"input": QUESTION, "max_output_tokens": 48, "temperature": 0,
                "text": {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": true}}}),
    );
    check_shape(&v);
    assert_eq!(v["status"], "completed", "{v}");
    let out: Value = serde_json::from_str(&text_of(&v)).expect("the text is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema");
    assert!(validator.is_valid(&out), "{out}");
}

/// A conversation in Responses' items: the assistant's function call and its output go in as
/// the chat's assistant tool call and tool message (more input than the question alone).
#[test]
fn function_call_items_are_taken_as_input() {
    let addr = shared();
    let question = json!([{"role": "user", "content": "Add 2 and 3."}]);
    let mut items = question.clone();
    let items_list = items.as_array_mut().expect("list");
    items_list.push(
        json!({"type": "function_call", "call_id": "call_9", "name": "add",
                           "arguments": "{\"a\":2,\"b\":3}"}),
    );
    items_list.push(json!({"type": "function_call_output", "call_id": "call_9", "output": "5"}));
    let n = |input: &Value| {
        let v = responses(
            addr,
            &json!({"input": input, "tools": [add_tool()], "max_output_tokens": 2}),
        );
        v["usage"]["input_tokens"].as_u64().expect("input tokens")
    };
    assert!(
        n(&items) > n(&question),
        "the call and its output reach the prompt"
    );
    let r = post(
        addr,
        "/v1/responses",
        &json!({"input": [{"type": "function_call", "name": "add"}]}),
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.error()["param"], "input");
}

/// Chat's log-probability entries of a greedy answer, as (token, logprob, alternatives' tokens).
fn entries(list: &[Value]) -> Vec<(String, f64, Vec<String>)> {
    list.iter()
        .map(|e| {
            let top = e["top_logprobs"]
                .as_array()
                .expect("top_logprobs")
                .iter()
                .map(|t| t["token"].as_str().expect("token").to_string())
                .collect();
            (
                e["token"].as_str().expect("token").to_string(),
                e["logprob"].as_f64().expect("logprob"),
                top,
            )
        })
        .collect()
}

fn same_entries(a: &[Value], b: &[Value]) {
    let (a, b) = (entries(a), entries(b));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((&x.0, &x.2), (&y.0, &y.2));
        assert!((x.1 - y.1).abs() < 1e-6, "{x:?} vs {y:?}");
    }
}

/// `include: ["message.output_text.logprobs"]` with `top_logprobs`: the message's text carries
/// one entry per generated token, the same as chat's for the same greedy conversation (which
/// `tests/api/server_sampling.rs` holds to the model's log-softmax); streamed, the deltas' entries
/// join to the same list, and the done event and final response carry it whole.
#[test]
fn logprobs_come_with_the_text_whole_and_streamed() {
    let addr = shared();
    let body = json!({"input": QUESTION, "max_output_tokens": 10, "temperature": 0,
                      "include": ["message.output_text.logprobs"], "top_logprobs": 3});
    let v = responses(addr, &body);
    check_shape(&v);
    let part = &v["output"][0]["content"][0];
    let whole = part["logprobs"].as_array().expect("logprobs").clone();
    assert_eq!(
        whole.len() as u64,
        v["usage"]["output_tokens"].as_u64().expect("out"),
        "one entry per generated token: {v}"
    );
    assert!(entries(&whole).iter().all(|e| e.2.len() == 3), "{v}");
    let chat = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 10,
                "temperature": 0, "logprobs": true, "top_logprobs": 3}),
    );
    assert_eq!(chat.status, 200);
    let c = chat.json();
    let want = c["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("chat logprobs")
        .clone();
    same_entries(&whole, &want);

    let evs = events(addr, &body);
    let streamed: Vec<Value> = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .flat_map(|(_, d)| d["logprobs"].as_array().expect("delta logprobs").clone())
        .collect();
    same_entries(&streamed, &whole);
    let (_, done) = evs
        .iter()
        .find(|(n, _)| n == "response.output_text.done")
        .expect("done");
    same_entries(done["logprobs"].as_array().expect("done logprobs"), &whole);
    let (_, last) = evs.last().expect("events");
    let final_lp = &last["response"]["output"][0]["content"][0]["logprobs"];
    same_entries(final_lp.as_array().expect("final logprobs"), &whole);

    // Not asked for: the text part has none.
    let plain = responses(addr, &json!({"input": QUESTION, "max_output_tokens": 4}));
    assert!(
        plain["output"][0]["content"][0].get("logprobs").is_none(),
        "{plain}"
    );
}

#[test]
fn what_cannot_be_honoured_is_a_400_naming_it() {
    let addr = shared();
    for (field, value) in [
        ("previous_response_id", json!("resp_123")),
        ("background", json!(true)),
        ("conversation", json!("conv_1")),
        ("truncation", json!("auto")),
        ("include", json!(["reasoning.encrypted_content"])),
        ("top_logprobs", json!(21)),
    ] {
        let mut b = json!({"input": "hi"});
        b[field] = value;
        let r = post(addr, "/v1/responses", &b);
        assert_eq!(r.status, 400, "{b}");
        assert_eq!(r.error()["param"], field, "{b}");
    }
    for builtin in ["web_search", "file_search", "code_interpreter"] {
        let r = post(
            addr,
            "/v1/responses",
            &json!({"input": "hi", "tools": [{"type": builtin}]}),
        );
        assert_eq!(r.status, 400);
        let e = r.error();
        assert_eq!(e["param"], "tools");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(builtin)),
            "{e}"
        );
    }
    // The chat path's checks, in the Responses body's own names.
    let r = post(
        addr,
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 0}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "max_output_tokens");
    let r = post(
        addr,
        "/v1/responses",
        &json!({"input": "hi", "text": {"format": {"type": "yaml"}}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "text");
    let r = post(
        addr,
        "/v1/responses",
        &json!({"input": [], "max_output_tokens": 4}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "input");
    let image = json!({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]});
    let r = post(addr, "/v1/responses", &image);
    assert_eq!(r.status, 400);
    let e = r.error();
    assert_eq!(e["param"], "input");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("input_image")),
        "{e}"
    );
    let r = post(addr, "/v1/responses", &json!({"max_output_tokens": 4}));
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "input");
    let r = post(
        addr,
        "/v1/responses",
        &json!({"input": "hi", "tools": [add_tool()],
                                                 "tool_choice": {"type": "function", "name": "mul"}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "tool_choice");
}
