//! Structured output in the engine on the real default model: the 20 schemas of
//! `tests/data/schemas/` through one batch (greedy and sampled), every output validated by the
//! `jsonschema` crate, and finished by the grammar's end (`stop`); a regex and a GBNF grammar
//! matched; the vocabulary's trie against the tokenizer; hostile grammars refused or compiled
//! within a bound; and the per-mask cost.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::constraint::{
    Grammar, MAX_GRAMMAR_STRUCTURE, compiler_for, mask_stats, structure,
};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Event, Knobs, Request};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::ChatMessage;

use crate::default_model;
use default_model::model;

fn engine() -> EngineHandle {
    static E: OnceLock<EngineHandle> = OnceLock::new();
    E.get_or_init(|| {
        let mut knobs = Knobs::default();
        knobs.kv.budget_bytes = 128 << 20;
        knobs.scheduler.max_num_seqs = 48;
        let config = EngineConfig {
            threads: 2,
            knobs,
            ..EngineConfig::default()
        };
        EngineHandle::start(model(), config, None).expect("engine")
    })
    .clone()
}

fn schemas() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/schemas");
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

fn request(lm: &LoadedModel, grammar: &Grammar, temperature: f32, max_tokens: usize) -> Request {
    let prompt = lm
        .chat_prompt(&[ChatMessage::user("Give me an example as JSON.")])
        .expect("prompt");
    let constraint = compiler_for(&lm.tokenizer)
        .expect("compiler")
        .compile(grammar)
        .unwrap_or_else(|e| panic!("{grammar:?}: {e}"));
    Request {
        prompt,
        sampling: SamplingParams {
            temperature,
            seed: Some(11),
            ..SamplingParams::default()
        },
        stop: lm.default_stop(Some(max_tokens)),
        constraint: Some(constraint),
        ..Request::default()
    }
}

/// Runs requests together; each one's text and finish reason, in order.
fn run(reqs: Vec<Request>) -> Vec<(String, FinishReason)> {
    let engine = engine();
    let (tx, rx) = mpsc::channel();
    let ids: Vec<u64> = reqs
        .into_iter()
        .map(|r| engine.submit(r, tx.clone()))
        .collect();
    let mut text: HashMap<u64, String> = HashMap::new();
    let mut done: HashMap<u64, FinishReason> = HashMap::new();
    while done.len() < ids.len() {
        match rx
            .recv_timeout(Duration::from_secs(600))
            .expect("engine answers")
        {
            Event::Token { id, text: t, .. } => text.entry(id).or_default().push_str(&t),
            Event::Finished {
                id,
                reason,
                text: t,
                ..
            } => {
                text.entry(id).or_default().push_str(&t);
                done.insert(id, reason);
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
    ids.iter()
        .map(|id| (text.remove(id).unwrap_or_default(), done[id]))
        .collect()
}

fn validate(name: &str, schema: &Value, text: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("the schema compiles");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{name}: {text} is not valid: {errors:?}");
}

#[test]
fn twenty_schemas_in_one_batch_validate_greedy_and_sampled() {
    let lm = model();
    let all = schemas();
    assert_eq!(all.len(), 20);
    let mut reqs = Vec::new();
    for (_, schema) in &all {
        for t in [0.0, 1.0] {
            reqs.push(request(&lm, &Grammar::json_schema(schema.clone()), t, 160));
        }
    }
    let before = mask_stats();
    let t = Instant::now();
    let out = run(reqs);
    let took = t.elapsed();
    let after = mask_stats();
    let mut tokens = 0;
    for (i, (text, reason)) in out.iter().enumerate() {
        let (name, schema) = &all[i / 2];
        assert_eq!(*reason, FinishReason::Stop, "{name}: {text:?}");
        validate(name, schema, text);
        tokens += lm.tokenizer.encode(text, false).map_or(0, |t| t.len());
        eprintln!("{name} (t={}): {text}", if i % 2 == 0 { 0 } else { 1 });
    }
    let masks = after.masks - before.masks;
    eprintln!(
        "{} requests, ~{tokens} tokens in {took:?}; {masks} masks, {:.3} ms each, step waited {:.3} ms per mask",
        out.len(),
        (after.compute_ns - before.compute_ns) as f64 / masks.max(1) as f64 / 1e6,
        (after.wait_ns - before.wait_ns) as f64 / masks.max(1) as f64 / 1e6,
    );
    assert!(masks as usize >= out.len(), "a mask per token at least");
}

#[test]
fn regex_gbnf_and_lark_outputs_match() {
    let lm = model();
    let rx = regex::Regex::new(r"^[0-9]{3}-[a-z]{2,4}$").expect("regex");
    let gbnf = "root ::= greeting \" \" name\ngreeting ::= \"hello\" | \"hi\"\nname ::= [A-Z] [a-z]{1,8}\n";
    let gx = regex::Regex::new(r"^(hello|hi) [A-Z][a-z]{1,8}$").expect("regex");
    let lark = "start: \"color: \" COLOR\nCOLOR: \"red\" | \"green\" | \"blue\"\n";
    let grammars = [
        Grammar::Regex("[0-9]{3}-[a-z]{2,4}".into()),
        Grammar::Gbnf(gbnf.into()),
        Grammar::Lark(lark.into()),
    ];
    let mut reqs = Vec::new();
    for g in &grammars {
        for t in [0.0, 1.0] {
            reqs.push(request(&lm, g, t, 40));
        }
    }
    let out = run(reqs);
    for (i, (text, reason)) in out.iter().enumerate() {
        assert_eq!(*reason, FinishReason::Stop, "{text:?}");
        match i / 2 {
            0 => assert!(rx.is_match(text), "regex: {text:?}"),
            1 => assert!(gx.is_match(text), "gbnf: {text:?}"),
            _ => assert!(
                ["color: red", "color: green", "color: blue"].contains(&text.as_str()),
                "lark: {text:?}"
            ),
        }
    }
}

#[test]
fn bad_and_hostile_grammars_fail_cleanly_and_in_bounded_time() {
    let lm = model();
    let c = compiler_for(&lm.tokenizer).expect("compiler");
    for bad in [
        Grammar::json_schema(json!({"type": "frobnicate"})),
        Grammar::json_schema(json!(5)),
        Grammar::Regex("(unclosed".into()),
        Grammar::Lark("start: missing_rule".into()),
        Grammar::Gbnf("root ::= \"open".into()),
        Grammar::Gbnf("notroot ::= \"a\"".into()),
        // A bound past 2^53 would be saturated to i64::MAX and admit what it excludes.
        Grammar::json_schema(json!({"type": "integer", "minimum": 1e30})),
        Grammar::json_schema(json!({"type": "object", "properties":
            {"n": {"type": "number", "exclusiveMaximum": -1e300}}})),
    ] {
        assert!(c.compile(&bad).is_err(), "{bad:?} compiled");
    }
    // Within 2^53, and such numbers as data, compile.
    for fine in [
        json!({"type": "integer", "minimum": 9_007_199_254_740_992_i64}),
        json!({"const": {"minimum": 1e30}}),
    ] {
        assert!(
            c.compile(&Grammar::json_schema(fine.clone())).is_ok(),
            "{fine}"
        );
    }
    let mut deep = json!({"type": "integer"});
    for _ in 0..300 {
        deep = json!({"type": "object", "properties": {"a": deep}, "required": ["a"]});
    }
    let huge: Vec<String> = (0..8_000)
        .map(|i| format!("value-{i}-{}", i * 7919))
        .collect();
    for hostile in [
        Grammar::json_schema(deep),
        Grammar::json_schema(json!({"enum": huge})),
        Grammar::Regex("(a|aa)*(b|bb)*((x+x+)+y){50}[a-z]{1000}".into()),
        Grammar::Regex("([a-z]{1,100}){1,100}".into()),
        Grammar::Regex("(.*a){40}".into()),
    ] {
        let t = Instant::now();
        let r = c.compile(&hostile);
        let took = t.elapsed();
        eprintln!(
            "{}: {} in {took:?}",
            hostile.kind(),
            r.as_ref()
                .map_or_else(|e| format!("refused ({e:.120})"), |_| "compiled".into())
        );
        assert!(took < Duration::from_secs(30), "compile took {took:?}");
        if let Ok(constraint) = r {
            // It compiled: running it must end (budgets bound every mask) without a panic.
            let mut req = request(&lm, &Grammar::Regex("a".into()), 0.0, 16);
            req.constraint = Some(constraint);
            let t = Instant::now();
            let (tx, rx) = mpsc::channel();
            engine().submit(req, tx);
            loop {
                match rx.recv_timeout(Duration::from_secs(120)).expect("answers") {
                    Event::Finished { .. } | Event::Refused { .. } => break,
                    _ => {}
                }
            }
            assert!(t.elapsed() < Duration::from_secs(120));
        }
    }
}

/// Chains of references, the shapes llguidance compiles by recursion, `n` links long.
fn chain(shape: &str, n: usize) -> Grammar {
    let lines = |f: &dyn Fn(usize) -> String, head: &str, tail: &str| {
        let mut t = String::from(head);
        (0..n).for_each(|i| t.push_str(&f(i)));
        t.push_str(tail);
        t
    };
    let defs = |f: &dyn Fn(usize) -> Value| {
        let mut d = serde_json::Map::new();
        (0..n).for_each(|i| {
            d.insert(format!("a{i}"), f(i));
        });
        d.insert(format!("a{n}"), json!({"type": "integer"}));
        Grammar::json_schema(json!({"$defs": d, "$ref": "#/$defs/a0"}))
    };
    match shape {
        "$ref" => defs(&|i| json!({"$ref": format!("#/$defs/a{}", i + 1)})),
        "anyOf" => defs(&|i| json!({"anyOf": [{"$ref": format!("#/$defs/a{}", i + 1)}]})),
        "items" => {
            defs(&|i| json!({"type": "array", "items": {"$ref": format!("#/$defs/a{}", i + 1)}}))
        }
        "rules" => Grammar::Lark(lines(
            &|i| format!("a{i}:a{}\n", i + 1),
            "start:a0\n",
            &format!("a{n}:\"x\"\n"),
        )),
        "terminals" => Grammar::Lark(lines(
            &|i| format!("A{i}:A{}\n", i + 1),
            "start:A0\n",
            &format!("A{n}:\"x\"\n"),
        )),
        "groups" => Grammar::Lark(lines(
            &|i| format!("a{i}:(a{})\n", i + 1),
            "start:a0\n",
            &format!("a{n}:\"x\"\n"),
        )),
        "gbnf" => Grammar::Gbnf(lines(
            &|i| format!("a{i}::=a{}\n", i + 1),
            "root::=a0\n",
            &format!("a{n}::=\"x\"\n"),
        )),
        _ => unreachable!("{shape}"),
    }
}

/// A long chain of references used to overflow the compiling thread's stack and abort the
/// process. Each shape, as long as the structure bound lets it be, compiles (or is refused by
/// llguidance) without taking the process down; one link more is refused before compiling.
#[test]
fn reference_chains_compile_up_to_the_bound_and_are_refused_past_it() {
    let lm = model();
    let c = compiler_for(&lm.tokenizer).expect("compiler");
    for shape in [
        "$ref",
        "anyOf",
        "items",
        "rules",
        "terminals",
        "groups",
        "gbnf",
    ] {
        // The longest chain within the bound.
        let (mut lo, mut hi) = (1, MAX_GRAMMAR_STRUCTURE);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if structure(&chain(shape, mid)) <= MAX_GRAMMAR_STRUCTURE {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        assert!(lo > 1000, "{shape}: only {lo} links fit the bound");
        let t = Instant::now();
        let r = c.compile(&chain(shape, lo));
        eprintln!(
            "{shape} x{lo}: {} in {:?}",
            r.as_ref()
                .map_or_else(|e| format!("refused ({e:.100})"), |_| "compiled".into()),
            t.elapsed()
        );
        if let Err(e) = &r {
            assert!(!e.to_string().contains("too large"), "{shape}: {e}");
        }
        let past = c
            .compile(&chain(shape, lo + 1))
            .expect_err("past the bound");
        assert!(past.to_string().contains("too large"), "{shape}: {past}");
    }
}

#[test]
fn trie_holds_every_token_as_the_detokenizer_writes_it() {
    let lm = model();
    let c = compiler_for(&lm.tokenizer).expect("compiler");
    // The same compiler comes back for the same tokenizer (built once per model).
    let again = compiler_for(&lm.tokenizer).expect("compiler");
    assert!(Arc::ptr_eq(&c, &again));
    // A regex of one token's text admits that token's text: greedy output equals it.
    let out = run(vec![request(&lm, &Grammar::Regex("Paris".into()), 0.0, 8)]);
    assert_eq!(out[0].0, "Paris");
    assert_eq!(out[0].1, FinishReason::Stop);
}
