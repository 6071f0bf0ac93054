//! Structured output through real HTTP to `tpslab serve` on the real default model: the 20
//! schemas of `tests/data/schemas/` (streamed and whole, greedy and sampled at temperature 1),
//! each output validated against its schema by the `jsonschema` crate; regex, Lark and GBNF
//! requests checked by matching the output; every dialect's field; the 400s (two constraints,
//! bad schemas, bad grammars); hostile schemas and regexes answered 400 or in bounded time while
//! other requests keep flowing; and `tpslab generate --json-schema`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http_client;
use http_client::*;

/// A server of its own with room for a whole schema round at once.
fn server() -> SocketAddr {
    static S: OnceLock<tpslab::serve::RunningServer> = OnceLock::new();
    S.get_or_init(|| start(engine(16, None), None)).addr
}

fn schemas() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/schemas");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .expect("schemas dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read schema");
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).expect("schema JSON"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A chat body asking for JSON; `extra` adds or overrides fields.
fn ask(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "Give me an example as JSON."}],
        "temperature": 0,
        "max_tokens": 160,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// The answer's text and finish reason, whole or streamed (the deltas joined).
fn answer(addr: SocketAddr, path: &str, body: &Value) -> (String, String) {
    let r = post(addr, path, body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let chat = path.contains("chat");
    if body["stream"] == json!(true) {
        let (mut text, mut finish) = (String::new(), String::new());
        for e in r.events().iter().filter(|e| *e != "[DONE]") {
            let c: Value = serde_json::from_str(e).expect("chunk JSON");
            let choice = &c["choices"][0];
            let piece = if chat {
                &choice["delta"]["content"]
            } else {
                &choice["text"]
            };
            text.push_str(piece.as_str().unwrap_or_default());
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        (text, finish)
    } else {
        let v = r.json();
        let choice = &v["choices"][0];
        let text = if chat {
            &choice["message"]["content"]
        } else {
            &choice["text"]
        };
        (
            text.as_str().expect("text").to_string(),
            choice["finish_reason"]
                .as_str()
                .expect("finish")
                .to_string(),
        )
    }
}

fn validate(name: &str, schema: &Value, text: &str, how: &str) {
    let v: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{name} ({how}): not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("the schema compiles");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{name} ({how}): {text} is not valid: {errors:?}"
    );
}

#[test]
fn twenty_schemas_validate_whole_and_streamed_greedy_and_sampled() {
    let addr = server();
    let all = schemas();
    assert_eq!(all.len(), 20, "the schema set");
    // Every schema's four requests at once: the batch mixes constrained requests of different
    // grammars (and the masks of a step are computed on the workers in parallel).
    std::thread::scope(|s| {
        let mut jobs = Vec::new();
        for (name, schema) in &all {
            for (stream, temperature) in [(false, 0.0), (true, 0.0), (false, 1.0), (true, 1.0)] {
                let body = ask(json!({
                    "response_format": {"type": "json_schema",
                        "json_schema": {"name": name, "schema": schema, "strict": true}},
                    "stream": stream,
                    "temperature": temperature,
                    "seed": 7,
                }));
                jobs.push(s.spawn(move || {
                    let (text, finish) = answer(addr, "/v1/chat/completions", &body);
                    (name, schema, stream, temperature, text, finish)
                }));
            }
        }
        let mut greedy: std::collections::HashMap<&str, String> = Default::default();
        for j in jobs {
            let (name, schema, stream, t, text, finish) = j.join().expect("request thread");
            let how = format!("stream {stream}, temperature {t}");
            assert_eq!(finish, "stop", "{name} ({how}) ran out of tokens: {text:?}");
            validate(name, schema, &text, &how);
            if t == 0.0 {
                // Greedy: streamed and whole are the same text.
                if let Some(prev) = greedy.insert(name, text.clone()) {
                    assert_eq!(prev, text, "{name}: greedy streamed != whole");
                }
            }
        }
    });
}

#[test]
fn completions_take_json_schema_and_json_object() {
    let addr = server();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                        "required": ["city"], "additionalProperties": false});
    for stream in [false, true] {
        let body = json!({"prompt": "The capital of France as JSON:", "max_tokens": 60,
                          "temperature": 0, "stream": stream,
                          "response_format": {"type": "json_schema",
                              "json_schema": {"name": "c", "schema": schema}}});
        let (text, finish) = answer(addr, "/v1/completions", &body);
        assert_eq!(finish, "stop", "{text:?}");
        validate("completion", &schema, &text, "completions");
    }
    let body = ask(json!({"response_format": {"type": "json_object"}, "max_tokens": 200}));
    let (text, finish) = answer(addr, "/v1/chat/completions", &body);
    if finish == "stop" {
        let v: Value = serde_json::from_str(&text).expect("json_object answer is JSON");
        assert!(v.is_object(), "{text}");
    } else {
        // Cut at max_tokens: still a prefix of an object.
        assert!(text.starts_with('{'), "{text:?}");
    }
}

#[test]
fn every_dialect_field_constrains() {
    let addr = server();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                        "maximum": 5}}, "required": ["n"], "additionalProperties": false});
    for field in ["guided_json", "json_schema"] {
        let mut extra = serde_json::Map::new();
        extra.insert(field.to_string(), schema.clone());
        let (text, _) = answer(addr, "/v1/chat/completions", &ask(Value::Object(extra)));
        validate(field, &schema, &text, field);
    }
    let (text, _) = answer(
        addr,
        "/v1/chat/completions",
        &ask(json!({"structured_outputs": {"json": schema}})),
    );
    validate("structured_outputs", &schema, &text, "structured_outputs");
    let re = regex::Regex::new(r"^[0-9]{3}-[a-z]{2,4}$").expect("regex");
    for (stream, t) in [(false, 0.0), (true, 1.0)] {
        let body = ask(
            json!({"guided_regex": "[0-9]{3}-[a-z]{2,4}", "stream": stream,
                              "temperature": t}),
        );
        let (text, finish) = answer(addr, "/v1/chat/completions", &body);
        assert!(re.is_match(&text), "regex output {text:?}");
        assert_eq!(finish, "stop");
    }
    let (text, _) = answer(
        addr,
        "/v1/chat/completions",
        &ask(json!({"guided_choice": ["yes", "no", "maybe so"]})),
    );
    assert!(
        ["yes", "no", "maybe so"].contains(&text.as_str()),
        "{text:?}"
    );
    // llguidance's Lark (vLLM's guided_grammar) and llama.cpp's GBNF (`grammar`).
    let lark = "start: \"color: \" COLOR\nCOLOR: \"red\" | \"green\" | \"blue\"\n";
    let (text, _) = answer(
        addr,
        "/v1/chat/completions",
        &ask(json!({"guided_grammar": lark})),
    );
    assert!(
        ["color: red", "color: green", "color: blue"].contains(&text.as_str()),
        "{text:?}"
    );
    let gbnf = "root ::= greeting \" \" name\ngreeting ::= \"hello\" | \"hi\"\nname ::= [A-Z] [a-z]{1,8}\n";
    let re = regex::Regex::new(r"^(hello|hi) [A-Z][a-z]{1,8}$").expect("regex");
    for (stream, t) in [(false, 0.0), (true, 1.0)] {
        let body = ask(json!({"grammar": gbnf, "stream": stream, "temperature": t}));
        let (text, finish) = answer(
            addr,
            "/v1/completions",
            &json!({
            "prompt": "Say hello to someone:", "max_tokens": 30, "temperature": t,
            "stream": stream, "grammar": gbnf}),
        );
        assert!(re.is_match(&text), "GBNF output {text:?}");
        assert_eq!(finish, "stop");
        let (text, _) = answer(addr, "/v1/chat/completions", &body);
        assert!(re.is_match(&text), "GBNF chat output {text:?}");
    }
}

/// The status and message of a request that should be refused.
fn refused(addr: SocketAddr, body: &Value) -> (u16, String) {
    let r = post(addr, "/v1/chat/completions", body);
    let msg = serde_json::from_slice::<Value>(&r.body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(String::from))
        .unwrap_or_default();
    (r.status, msg)
}

#[test]
fn bad_constraints_are_400s_naming_the_problem() {
    let addr = server();
    let two = ask(json!({"guided_regex": "a+", "response_format": {"type": "json_object"}}));
    let (status, msg) = refused(addr, &two);
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("more than one"), "{msg}");
    for (body, needle) in [
        (
            ask(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "frobnicate"}, "strict": true}}})),
            "response_format",
        ),
        (ask(json!({"guided_json": "{not json"})), "guided_json"),
        (ask(json!({"guided_regex": "(unclosed"})), "guided_regex"),
        (
            ask(json!({"guided_grammar": "start: undefined_rule"})),
            "guided_grammar",
        ),
        (ask(json!({"grammar": "root ::= \"open"})), "grammar"),
        (ask(json!({"grammar": "rot ::= \"a\""})), "root"),
        (
            ask(json!({"response_format": {"type": "xml"}})),
            "response_format",
        ),
        (ask(json!({"guided_json": 5})), "guided_json"),
    ] {
        let (status, msg) = refused(addr, &body);
        assert_eq!(status, 400, "{body}: {msg}");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
}

#[test]
fn hostile_constraints_are_refused_or_bounded_and_others_keep_flowing() {
    let addr = server();
    // 300 levels of nested objects.
    let mut deep = json!({"type": "integer"});
    for _ in 0..300 {
        deep = json!({"type": "object", "properties": {"a": deep}, "required": ["a"]});
    }
    let huge_enum: Vec<String> = (0..8_000)
        .map(|i| format!("value-{i}-{}", i * 7919))
        .collect();
    let hostile = [
        json!({"guided_json": deep}),
        json!({"guided_json": {"enum": huge_enum}}),
        json!({"guided_regex": "(a|aa)*(b|bb)*((x+x+)+y){50}[a-z]{1000}"}),
        json!({"guided_regex": "([a-z]{1,100}){1,100}"}),
        json!({"guided_regex": "(.*a){40}"}),
        json!({"guided_json": {"type": "string", "pattern": "^(x+x+)+y$", "minLength": 5000}}),
    ];
    std::thread::scope(|s| {
        let mut jobs = Vec::new();
        for h in &hostile {
            let mut body = ask(json!({"max_tokens": 24}));
            for (k, v) in h.as_object().expect("object") {
                body[k] = v.clone();
            }
            jobs.push(s.spawn(move || {
                let t = Instant::now();
                let r = post(addr, "/v1/chat/completions", &body);
                (
                    r.status,
                    String::from_utf8_lossy(&r.body).into_owned(),
                    t.elapsed(),
                )
            }));
        }
        // Meanwhile a plain request is answered.
        let t = Instant::now();
        let (text, _) = answer(addr, "/v1/chat/completions", &ask(json!({"max_tokens": 8})));
        assert!(!text.is_empty());
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "a plain request waited {:?} behind hostile ones",
            t.elapsed()
        );
        for (j, h) in jobs.into_iter().zip(&hostile) {
            let (status, body, took) = j.join().expect("hostile thread");
            let key = h
                .as_object()
                .and_then(|o| o.keys().next().cloned())
                .unwrap_or_default();
            // Refused at compile (400), finished (200), or failed alone when the grammar blows
            // its budget while decoding: the request's fault, a 400 naming the field it came in.
            eprintln!("{key}: {status} {body:.200}");
            assert!([200, 400].contains(&status), "{key}: {status} {body:.300}");
            if status == 400 {
                let e: Value = serde_json::from_str(&body).expect("error body is JSON");
                assert!(
                    e["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty())
                );
            }
            if body.contains("\"message\":\"structured output: ") {
                // Failed while decoding.
                assert_eq!(status, 400, "{key}: {body:.300}");
                let param = format!("\"param\":\"{key}\"");
                assert!(body.contains(&param), "{key}: {body:.300}");
            }
            assert!(took < Duration::from_secs(90), "{key} took {took:?}");
        }
    });
    // And the server still serves constrained requests afterwards.
    let (text, _) = answer(
        addr,
        "/v1/chat/completions",
        &ask(json!({"guided_choice": ["ok", "fine"]})),
    );
    assert!(["ok", "fine"].contains(&text.as_str()), "{text:?}");
}

#[test]
fn generate_json_schema_on_the_command_line() {
    let model = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("default model");
    let schema_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/schemas/01_person.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("read")).expect("json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(["generate", "--model"])
        .arg(&model)
        .args([
            "--prompt",
            "A person as JSON:",
            "--max-tokens",
            "80",
            "--json",
        ])
        .arg("--json-schema")
        .arg(&schema_path)
        .output()
        .expect("run tpslab");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json output");
    assert_eq!(v["finish_reason"], "stop", "{v}");
    validate(
        "generate",
        &schema,
        v["text"].as_str().expect("text"),
        "cli",
    );
    let re = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(["generate", "--model"])
        .arg(&model)
        .args(["--prompt", "Pick:", "--json", "--regex", "(left|right)"])
        .output()
        .expect("run tpslab");
    let v: Value = serde_json::from_slice(&re.stdout).expect("--json output");
    assert!(
        ["left", "right"].contains(&v["text"].as_str().unwrap_or_default()),
        "{v}"
    );
    let bad = std::fs::write(
        std::env::temp_dir().join("tpslab-bad-schema.json"),
        "{\"type\": 5}",
    );
    assert!(bad.is_ok());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(["generate", "--model"])
        .arg(&model)
        .args(["--prompt", "x", "--json-schema"])
        .arg(std::env::temp_dir().join("tpslab-bad-schema.json"))
        .output()
        .expect("run tpslab");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("json_schema") && !err.contains("panicked"),
        "{err}"
    );
}
