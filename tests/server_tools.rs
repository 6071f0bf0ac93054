//! Tool calls through real HTTP to `tpslab serve` on the real default model (SmolLM2-135M):
//! `tool_choice: "required"` and a named function are enforced, so the calls come back in
//! `message.tool_calls` (whole) and `delta.tool_calls` (streamed) with `finish_reason:
//! "tool_calls"`, and their arguments validate against the tool's parameters schema (the
//! `jsonschema` crate); streamed and whole greedy answers make the same calls. `auto` is checked
//! against the raw text of the same prompt (from `/v1/completions`) split by the engine's parser;
//! `none` parses nothing; a bad `tool_choice` is a 400 naming it.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{Value, json};
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};
use tpslab_engine::text::tool_calls::{ToolCallParser, ToolFormat};

#[path = "support/http_client.rs"]
mod http_client;
use http_client::{model, post, shared};

const QUESTION: &str = "What is the weather in Paris? Also add 2 and 3.";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string", "description": "The city, e.g. Paris", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["location"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": false}}},
    ])
}

fn body(extra: Value) -> Value {
    let mut b = json!({
        "messages": [
            {"role": "system", "content": "You can call functions."},
            {"role": "user", "content": QUESTION}],
        "tools": tools(),
        "temperature": 0,
        "max_tokens": 160,
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
    let errors: Vec<String> = validator.iter_errors(&args).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{name}({arguments}) does not validate: {errors:?}");
}

/// The calls of a whole answer as (name, arguments), checked for OpenAI's shape.
fn whole(addr: SocketAddr, extra: Value) -> Vec<(String, String)> {
    let r = post(addr, "/v1/chat/completions", &body(extra));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let message = &choice["message"];
    assert!(message["content"].is_null(), "{v}");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert!(!calls.is_empty(), "{v}");
    calls
        .iter()
        .map(|c| {
            assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{c}");
            assert_eq!(c["type"], "function", "{c}");
            let name = c["function"]["name"].as_str().expect("name").to_string();
            let args = c["function"]["arguments"].as_str().expect("arguments").to_string();
            check_call(&name, &args);
            (name, args)
        })
        .collect()
}

/// The calls of a streamed answer, rebuilt from `delta.tool_calls` (the first piece of each
/// call carries its id, type and name; later pieces argument fragments).
fn streamed(addr: SocketAddr, extra: Value) -> Vec<(String, String)> {
    let mut b = body(extra);
    b["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &b);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut calls: BTreeMap<u64, (String, String)> = BTreeMap::new();
    let mut last_reason = Value::Null;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).expect("chunk JSON");
        let choice = &v["choices"][0];
        if !choice["finish_reason"].is_null() {
            last_reason = choice["finish_reason"].clone();
        }
        for d in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().expect("index");
            match calls.get_mut(&i) {
                None => {
                    assert!(d["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{d}");
                    assert_eq!(d["type"], "function", "{d}");
                    let name = d["function"]["name"].as_str().expect("first piece names it");
                    let args = d["function"]["arguments"].as_str().unwrap_or_default();
                    calls.insert(i, (name.to_string(), args.to_string()));
                }
                Some((_, args)) => {
                    assert!(d.get("id").is_none(), "{d}");
                    args.push_str(d["function"]["arguments"].as_str().expect("fragment"));
                }
            }
        }
    }
    assert_eq!(last_reason, "tool_calls");
    let calls: Vec<(String, String)> = calls.into_values().collect();
    assert!(!calls.is_empty());
    for (name, args) in &calls {
        check_call(name, args);
    }
    calls
}

#[test]
fn named_tool_is_called_whole_and_streamed() {
    let addr = shared();
    let choice = json!({"tool_choice": {"type": "function", "function": {"name": "add"}}});
    let calls = whole(addr, choice.clone());
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "add");
    assert_eq!(streamed(addr, choice), calls, "greedy: the same call streamed");
    let weather = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let calls = whole(addr, weather);
    assert_eq!(calls[0].0, "get_weather");
}

#[test]
fn required_makes_at_least_one_call() {
    let addr = shared();
    let calls = whole(addr, json!({"tool_choice": "required"}));
    assert!(!calls.is_empty());
    assert_eq!(streamed(addr, json!({"tool_choice": "required"})), calls);
}

/// `auto` on the default model: whatever it writes, the answer is the raw text of the same
/// prompt split by the parser of the template's format.
#[test]
fn auto_answers_as_the_parser_reads_the_raw_text() {
    let addr = shared();
    let lm = model();
    let opts = RenderOptions {
        tools: Some(tools().as_array().expect("tools").clone()),
        ..RenderOptions::new(true)
    };
    let messages = [
        ChatMessage::system("You can call functions."),
        ChatMessage::user(QUESTION),
    ];
    let prompt = lm.template.render_with(&messages, &opts).expect("render");
    let ids = lm.tokenizer.encode(&prompt, true).expect("encode");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 160, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let raw = r.json()["choices"][0]["text"].as_str().expect("text").to_string();
    let format = ToolFormat::for_template(lm.template.source());
    let (content, calls) = ToolCallParser::parse_all(format, &raw);

    let r = post(addr, "/v1/chat/completions", &body(json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let message = &v["choices"][0]["message"];
    let got: Vec<(String, String)> = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = &c["function"];
            (f["name"].as_str().expect("name").into(), f["arguments"].as_str().expect("args").into())
        })
        .collect();
    let want: Vec<(String, String)> = calls.into_iter().map(|c| (c.name, c.arguments)).collect();
    assert_eq!(got, want, "{v}");
    if want.is_empty() {
        assert_eq!(message["content"], json!(content), "{v}");
        assert!(message.get("tool_calls").is_none(), "{v}");
        assert_ne!(v["choices"][0]["finish_reason"], "tool_calls");
    } else {
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    }
}

#[test]
fn tool_choice_none_parses_nothing() {
    let r = post(shared(), "/v1/chat/completions", &body(json!({"tool_choice": "none", "max_tokens": 8})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
}

#[test]
fn bad_tool_choices_are_400s_naming_it() {
    let addr = shared();
    let cases = [
        body(json!({"tool_choice": {"type": "function", "function": {"name": "fly"}}})),
        body(json!({"tool_choice": "sometimes"})),
        body(json!({"tool_choice": {"type": "function"}})),
        body(json!({"tool_choice": 3})),
        body(json!({"tool_choice": "required", "response_format": {"type": "json_object"}})),
        json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
    ];
    for b in cases {
        let r = post(addr, "/v1/chat/completions", &b);
        assert_eq!(r.status, 400, "{b}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.error()["param"], "tool_choice", "{b}");
    }
    let r = post(addr, "/v1/chat/completions", &body(json!({"tools": [{"type": "function", "function": {}}]})));
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "tools");
}
