//! Tool calls through real HTTP to `tpslab serve` on the real default model (SmolLM2-135M):
//! `tool_choice: "required"` and a named function are enforced, so the calls come back in
//! `message.tool_calls` (whole) and `delta.tool_calls` (streamed: id, type and name first, then
//! argument pieces) with `finish_reason: "tool_calls"`, and their arguments validate against the
//! tool's parameters schema (the `jsonschema` crate); streamed and whole greedy answers make the
//! same calls, and with `n = 2` each choice makes its own. `auto` is checked against the raw text
//! of the same prompt (from `/v1/completions`) split by the engine's parser, on the default
//! template and on Qwen2.5's (which teaches `<tool_call>`), where a conversation with an
//! assistant's calls and a tool's result also renders exactly as the template renders it
//! locally; `none` parses nothing; bad `tools` / `tool_choice` are 400s naming them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};
use tpslab_engine::text::tool_calls::{ToolCallParser, ToolFormat};

use crate::http_client;
use crate::llamacpp;
use crate::runaway;
use http_client::{model, post, serve_model, shared};

const SYSTEM: &str = "You can call functions.";
const QUESTION: &str = "What is the weather in Paris? Also add 2 and 3.";

/// Bounded so that even a 135M model's constrained arguments end well within `max_tokens`.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string", "description": "The city, e.g. Paris", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["location"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                "required": ["a", "b"], "additionalProperties": false}}},
    ])
}

fn body(extra: Value) -> Value {
    let mut b = json!({
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION}],
        "tools": tools(),
        "temperature": 0,
        "max_tokens": 96,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

fn params(name: &str) -> Value {
    tools()
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["function"]["name"] == name)
        .map(|t| t["function"]["parameters"].clone())
        .unwrap_or_else(|| panic!("the model called {name:?}, which is not a tool"))
}

/// Checks one call's name and arguments (JSON text valid against the tool's schema).
fn check_call(name: &str, arguments: &str) {
    let args: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("{name}: arguments are not JSON ({e}): {arguments:?}"));
    let schema = params(name);
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&args)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{name}({arguments}) does not validate: {errors:?}"
    );
}

type Calls = Vec<(String, String)>;

/// The calls of one whole choice as (name, arguments), checked for OpenAI's shape.
fn choice_calls(choice: &Value) -> Calls {
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let message = &choice["message"];
    assert!(message["content"].is_null(), "{choice}");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert!(!calls.is_empty(), "{choice}");
    calls
        .iter()
        .map(|c| {
            assert!(
                c["id"].as_str().is_some_and(|id| id.starts_with("call_")),
                "{c}"
            );
            assert_eq!(c["type"], "function", "{c}");
            let name = c["function"]["name"].as_str().expect("name").to_string();
            let args = c["function"]["arguments"]
                .as_str()
                .expect("arguments")
                .to_string();
            check_call(&name, &args);
            (name, args)
        })
        .collect()
}

/// Every choice's calls of a whole answer.
fn whole(addr: SocketAddr, extra: Value) -> Vec<Calls> {
    let r = post(addr, "/v1/chat/completions", &body(extra));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(choice_calls)
        .collect()
}

/// Every choice's calls of a streamed answer, rebuilt from `delta.tool_calls` (the first piece
/// of each call carries its id, type and name; later pieces argument fragments only).
fn streamed(addr: SocketAddr, extra: Value) -> Vec<Calls> {
    let mut b = body(extra);
    b["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &b);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut calls: BTreeMap<u64, BTreeMap<u64, (String, String)>> = BTreeMap::new();
    let mut reasons: BTreeMap<u64, Value> = BTreeMap::new();
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).expect("chunk JSON");
        let choice = &v["choices"][0];
        let ci = choice["index"].as_u64().expect("choice index");
        assert!(!reasons.contains_key(&ci), "a chunk after the finish: {v}");
        if !choice["finish_reason"].is_null() {
            reasons.insert(ci, choice["finish_reason"].clone());
        }
        let mine = calls.entry(ci).or_default();
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().expect("index");
            match mine.get_mut(&i) {
                None => {
                    assert!(
                        d["id"].as_str().is_some_and(|id| id.starts_with("call_")),
                        "{d}"
                    );
                    assert_eq!(d["type"], "function", "{d}");
                    let name = d["function"]["name"]
                        .as_str()
                        .expect("first piece names it");
                    let args = d["function"]["arguments"].as_str().unwrap_or_default();
                    mine.insert(i, (name.to_string(), args.to_string()));
                }
                Some((_, args)) => {
                    assert!(
                        d.get("id").is_none() && d["function"].get("name").is_none(),
                        "{d}"
                    );
                    args.push_str(d["function"]["arguments"].as_str().expect("fragment"));
                }
            }
        }
    }
    calls
        .into_iter()
        .map(|(ci, calls)| {
            assert_eq!(reasons.get(&ci), Some(&json!("tool_calls")), "choice {ci}");
            let calls: Calls = calls.into_values().collect();
            assert!(!calls.is_empty());
            for (name, args) in &calls {
                check_call(name, args);
            }
            calls
        })
        .collect()
}

fn named(name: &str) -> Value {
    json!({"tool_choice": {"type": "function", "function": {"name": name}}})
}

#[test]
fn named_tool_is_called_whole_and_streamed() {
    let addr = shared();
    let calls = whole(addr, named("add"));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].len(), 1);
    assert_eq!(calls[0][0].0, "add");
    assert_eq!(
        streamed(addr, named("add")),
        calls,
        "greedy: the same call streamed"
    );
    let calls = whole(addr, named("get_weather"));
    assert_eq!(calls[0][0].0, "get_weather");
}

#[test]
fn required_makes_at_least_one_call() {
    let addr = shared();
    let calls = whole(addr, json!({"tool_choice": "required"}));
    assert!(!calls[0].is_empty());
    assert_eq!(streamed(addr, json!({"tool_choice": "required"})), calls);
    // The calls stream as they are written: the name first, then the arguments in pieces, not
    // all in the last chunk.
    let mut b = body(json!({"tool_choice": "required", "stream": true}));
    b["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &b);
    let pieces = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter(|e| {
            let v: Value = serde_json::from_str(e).expect("chunk JSON");
            v["choices"][0]["delta"]["tool_calls"].is_array()
        })
        .count();
    assert!(
        pieces > calls[0].len() + 1,
        "{pieces} chunks carry the calls"
    );
    // Without parallel calls, exactly one.
    let one = whole(
        addr,
        json!({"tool_choice": "required", "parallel_tool_calls": false}),
    );
    assert_eq!(one[0].len(), 1, "{one:?}");
}

/// `n = 2` sampled choices: each one's output is read for its own call.
#[test]
fn each_choice_makes_its_own_call() {
    let addr = shared();
    let extra = |stream: bool| {
        let mut e = named("get_weather");
        e["n"] = json!(2);
        e["temperature"] = json!(1.0);
        e["seed"] = json!(7);
        e["stream"] = json!(stream);
        e
    };
    let calls = whole(addr, extra(false));
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.len() == 1 && c[0].0 == "get_weather")
    );
    assert_eq!(
        streamed(addr, extra(true)),
        calls,
        "seeded: streamed as whole"
    );
}

/// The raw answer of `messages` (rendered here with `tools`) from `/v1/completions`, split by
/// the parser of the template's format, and the chat endpoint's answer to the same request.
fn auto_matches_raw(addr: SocketAddr, lm: &LoadedModel, model: Option<&str>) {
    let opts = RenderOptions {
        tools: Some(tools().as_array().expect("tools").clone()),
        ..RenderOptions::conversation()
    };
    let messages = [ChatMessage::system(SYSTEM), ChatMessage::user(QUESTION)];
    let prompt = lm.template.render_with(&messages, &opts).expect("render");
    let ids = lm.tokenizer.encode(&prompt, true).expect("encode");
    let mut raw_body = json!({"prompt": ids, "max_tokens": 64, "temperature": 0});
    let mut chat = body(json!({"max_tokens": 64}));
    if let Some(m) = model {
        raw_body["model"] = json!(m);
        chat["model"] = json!(m);
    }
    let r = post(addr, "/v1/completions", &raw_body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let raw = r.json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let format = ToolFormat::for_template(lm.template.source());
    let (content, calls) = ToolCallParser::parse_all(format, &raw);

    let r = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let message = &v["choices"][0]["message"];
    assert_eq!(v["usage"]["prompt_tokens"], json!(ids.len()), "{v}");
    let got: Calls = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = &c["function"];
            (
                f["name"].as_str().expect("name").into(),
                f["arguments"].as_str().expect("args").into(),
            )
        })
        .collect();
    let want: Calls = calls.into_iter().map(|c| (c.name, c.arguments)).collect();
    assert_eq!(got, want, "raw {raw:?}: {v}");
    if want.is_empty() {
        assert_eq!(message["content"], json!(content), "{v}");
        assert!(message.get("tool_calls").is_none(), "{v}");
        assert_ne!(v["choices"][0]["finish_reason"], "tool_calls");
    } else {
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    }
}

/// `auto` on the default model: whatever it writes, the answer is the raw text of the same
/// prompt split by the parser of the template's format.
#[test]
fn auto_answers_as_the_parser_reads_the_raw_text() {
    auto_matches_raw(shared(), &model(), None);
}

/// Qwen2.5's template teaches Hermes' `<tool_call>`: the tools, an assistant's calls and the
/// tool's result reach the template as transformers passes them (the server's prompt is the
/// local render's tokens), and `auto` reads the answer with the Hermes parser.
#[test]
fn a_tool_conversation_renders_through_the_template() {
    let dir = std::env::temp_dir().join(format!("tpslab-serve-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let template = llamacpp::template("Qwen-Qwen2.5-7B-Instruct");
    let path = runaway::model_with_template(&dir, &template, "Tools Served");
    let lm = Arc::new(LoadedModel::load(&path).expect("load"));
    let (server, id) = serve_model(Arc::clone(&lm));
    let addr = server.addr;

    let call = json!({"id": "call_1", "type": "function",
                      "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}});
    let history = json!([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]);
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"model": id, "messages": history, "tools": tools(), "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut local_call = call.clone();
    local_call["function"]["arguments"] = json!({"a": 2, "b": 3});
    let messages = [
        ChatMessage::system(SYSTEM),
        ChatMessage::user("Add 2 and 3."),
        ChatMessage::tool_calls(vec![local_call]),
        ChatMessage::tool_result("call_1", "5"),
    ];
    let opts = RenderOptions {
        tools: Some(tools().as_array().expect("tools").clone()),
        ..RenderOptions::conversation()
    };
    let prompt = lm.template.render_with(&messages, &opts).expect("render");
    for part in [
        "<tool_call>",
        "\"name\": \"add\"",
        "<tool_response>\n5\n</tool_response>",
        "get_weather",
    ] {
        assert!(prompt.contains(part), "{part:?} not in {prompt}");
    }
    let ids = lm.tokenizer.encode(&prompt, true).expect("encode");
    assert_eq!(r.json()["usage"]["prompt_tokens"], json!(ids.len()));

    assert_eq!(
        ToolFormat::for_template(lm.template.source()),
        ToolFormat::Hermes
    );
    auto_matches_raw(addr, &lm, Some(&id));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tool_choice_none_parses_nothing() {
    let r = post(
        shared(),
        "/v1/chat/completions",
        &body(json!({"tool_choice": "none", "max_tokens": 8})),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(
        v["choices"][0]["message"].get("tool_calls").is_none(),
        "{v}"
    );
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    assert_ne!(v["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn bad_tools_and_choices_are_400s_naming_them() {
    let addr = shared();
    let choice_cases = [
        body(named("fly")),
        body(json!({"tool_choice": "sometimes"})),
        body(json!({"tool_choice": {"type": "function"}})),
        body(json!({"tool_choice": 3})),
        body(json!({"tool_choice": "required", "response_format": {"type": "json_object"}})),
        json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
        json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function", "function": {"name": "add"}}}),
    ];
    for b in choice_cases {
        let r = post(addr, "/v1/chat/completions", &b);
        assert_eq!(r.status, 400, "{b}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.error()["param"], "tool_choice", "{b}");
    }
    let f = |function: Value| json!([{"type": "function", "function": function}]);
    let tool_cases = [
        f(json!({})),
        f(json!({"name": "has space"})),
        f(json!({"name": "x".repeat(65)})),
        f(json!({"name": "f", "parameters": "object"})),
        json!([{"type": "web_search"}]),
        json!([f(json!({"name": "f"}))[0], f(json!({"name": "f"}))[0]]),
    ];
    for t in tool_cases {
        let r = post(addr, "/v1/chat/completions", &body(json!({"tools": t})));
        assert_eq!(r.status, 400, "{t}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.error()["param"], "tools", "{t}");
    }
    // Not a list: the typed read's 422, naming it.
    let r = post(
        addr,
        "/v1/chat/completions",
        &body(json!({"tools": {"name": "f"}})),
    );
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.error()["param"], "tools");
    // A parameters schema the grammar compiler refuses, on an enforced choice.
    let bad_schema = f(
        json!({"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}),
    );
    let r = post(
        addr,
        "/v1/chat/completions",
        &body(json!({"tools": bad_schema, "tool_choice": "required"})),
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.error()["param"], "tools");
    let r = post(
        addr,
        "/v1/chat/completions",
        &body(json!({"parallel_tool_calls": "yes"})),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "parallel_tool_calls");
}
