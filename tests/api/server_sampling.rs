//! The sampling side of the OpenAI API over real HTTP with the real default model: token
//! log-probabilities (chat and completions, whole and streamed) held against a forward pass of
//! the whole sequence run here, `n` choices with a seed each and their shared prompt blocks,
//! `logit_bias`, `echo`, vLLM's `prompt_logprobs` with ranks, `/tokenize` and `/detokenize`
//! against the real tokenizer, `/v1/models`, and the 400s for fields the engine cannot honour.

use std::net::SocketAddr;

use serde_json::{Value, json};
use tpslab_engine::device::Workspace;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_kernels::ThreadPool;

use crate::http_client;
use http_client::*;

fn ok(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let r = post(addr, path, body);
    assert_eq!(
        r.status,
        200,
        "{path}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()
}

/// The log-softmax row after each of `prefix.len()..all.len()` (the row that predicted the
/// token there), from one forward pass over the whole sequence.
fn reference_rows(lm: &LoadedModel, all: &[u32], first: usize) -> Vec<Vec<f64>> {
    const BS: usize = 16;
    let cfg = &lm.model.cfg;
    let blocks = all.len().div_ceil(BS) + 1;
    let mut kv = KvCache::new(cfg, BS, blocks).expect("kv");
    let mut ws = Workspace::default();
    let pool = ThreadPool::new(2);
    let mut b = Batch::default();
    b.push_seq((0..blocks as u32).collect(), 0, all, false);
    b.logit_rows = (first - 1..all.len() - 1).collect();
    let logits = lm
        .model
        .forward(&pool, &b, &mut kv, &mut ws)
        .expect("forward");
    logits
        .chunks_exact(cfg.vocab)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            row.iter().map(|&x| x as f64 - lse).collect()
        })
        .collect()
}

fn id_of(name: &Value) -> u32 {
    name.as_str()
        .and_then(|s| s.strip_prefix("token_id:"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a token_id name: {name}"))
}

const TOL: f64 = 2e-3;

/// A generated token as returned: its id, its log-probability, and its alternatives.
type Returned = (u32, f64, Vec<(u32, f64)>);

/// Each chosen token's log-probability and its alternatives against the reference rows.
fn check_against_reference(tokens: &[Returned], rows: &[Vec<f64>], k: usize) {
    assert_eq!(tokens.len(), rows.len());
    for (pos, ((id, lp, top), row)) in tokens.iter().zip(rows).enumerate() {
        let want = row[*id as usize];
        assert!(
            (lp - want).abs() < TOL,
            "position {pos}: logprob {lp} vs {want}"
        );
        assert_eq!(top.len(), k, "position {pos}: {k} alternatives");
        for w in top.windows(2) {
            assert!(
                w[0].1 >= w[1].1,
                "position {pos}: alternatives not in order {top:?}"
            );
        }
        for &(t, l) in top {
            assert!(
                (l - row[t as usize]).abs() < TOL,
                "position {pos}: top {t} {l}"
            );
        }
        // Nothing outside the alternatives is more likely than the last of them.
        let last = top.last().map_or(f64::INFINITY, |t| t.1);
        let better = row
            .iter()
            .enumerate()
            .filter(|&(t, &l)| l > last + TOL && !top.iter().any(|x| x.0 as usize == t))
            .count();
        assert_eq!(
            better, 0,
            "position {pos}: a likelier token is missing from {top:?}"
        );
    }
}

fn chat_tokens(logprobs: &Value) -> Vec<Returned> {
    logprobs["content"]
        .as_array()
        .expect("logprobs.content")
        .iter()
        .map(|e| {
            let top = e["top_logprobs"]
                .as_array()
                .expect("top_logprobs")
                .iter()
                .map(|t| (id_of(&t["token"]), t["logprob"].as_f64().expect("logprob")))
                .collect();
            (
                id_of(&e["token"]),
                e["logprob"].as_f64().expect("logprob"),
                top,
            )
        })
        .collect()
}

#[test]
fn chat_logprobs_are_the_models_log_softmax_whole_and_streamed() {
    let addr = shared();
    let lm = model();
    let body = chat_body(json!({
        "logprobs": true, "top_logprobs": 5, "return_tokens_as_token_ids": true,
        "max_tokens": 10, "temperature": 0.7, "seed": 5,
    }));
    let v = ok(addr, "/v1/chat/completions", &body);
    let got = chat_tokens(&v["choices"][0]["logprobs"]);
    let n = v["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
    assert_eq!(got.len(), n, "one entry per generated token");
    let prompt = ok(addr, "/tokenize", &json!({"messages": body["messages"]}));
    let mut all: Vec<u32> = serde_json::from_value(prompt["tokens"].clone()).expect("tokens");
    assert_eq!(
        all.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().expect("prompt")
    );
    let first = all.len();
    all.extend(got.iter().map(|t| t.0));
    // The text is the tokens' text (a stop token ends it and shows nothing).
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let decoded = lm.tokenizer.decode(&all[first..], true).expect("decode");
    assert_eq!(text, decoded, "text and tokens agree");
    check_against_reference(&got, &reference_rows(&lm, &all, first), 5);

    // Streamed with the same seed: the same tokens, their log-probabilities spread over the
    // chunks in order.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200);
    let mut streamed = Vec::new();
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).expect("chunk");
        if let Some(lp) = c["choices"][0]["logprobs"].as_object() {
            streamed.extend(chat_tokens(&Value::Object(lp.clone())));
        }
    }
    assert_eq!(streamed.len(), got.len());
    for (a, b) in streamed.iter().zip(&got) {
        assert_eq!(a.0, b.0);
        assert!((a.1 - b.1).abs() < 1e-6);
    }
}

#[test]
fn completion_logprobs_offsets_and_zero_alternatives() {
    let addr = shared();
    let lm = model();
    let prompt = "The quick brown fox";
    let v = ok(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2,
                "ignore_eos": true}),
    );
    let c = &v["choices"][0];
    let text = c["text"].as_str().expect("text");
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("str"))
        .collect();
    assert_eq!(tokens.len(), 6);
    assert_eq!(tokens.concat(), text, "the tokens spell the text");
    let offsets: Vec<usize> = serde_json::from_value(lp["text_offset"].clone()).expect("offsets");
    let mut at = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, at);
        at += t.len();
    }
    // Greedy: each chosen token is the likeliest, so its entry leads the alternatives.
    for (i, top) in lp["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .enumerate()
    {
        let top = top.as_object().expect("map");
        assert!(top.len() <= 3 && !top.is_empty());
        let chosen = lp["token_logprobs"][i].as_f64().expect("lp");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        assert!(
            (best - chosen).abs() < 1e-9,
            "greedy token {i} is the top one"
        );
    }
    // The same through ids, against the reference.
    let v = ok(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                "ignore_eos": true, "return_tokens_as_token_ids": true}),
    );
    let lp = &v["choices"][0]["logprobs"];
    let ids: Vec<u32> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(id_of)
        .collect();
    let mut all = lm.tokenizer.encode(prompt, false).expect("encode");
    let first = all.len();
    all.extend(&ids);
    let rows = reference_rows(&lm, &all, first);
    for (i, (id, row)) in ids.iter().zip(&rows).enumerate() {
        let got = lp["token_logprobs"][i].as_f64().expect("lp");
        assert!((got - row[*id as usize]).abs() < TOL, "token {i}");
        assert_eq!(
            lp["top_logprobs"][i].as_object().expect("map").len(),
            1,
            "0 alternatives: the chosen one only"
        );
    }
}

#[test]
fn n_choices_are_seeded_each_share_the_prompt_and_sum_their_usage() {
    let addr = shared();
    let body = chat_body(
        json!({"n": 3, "temperature": 1.0, "seed": 42, "max_tokens": 16,
        "messages": [{"role": "user", "content": "Write one sentence about the sea, the sky, the wind and the rain."}]}),
    );
    let before = prefix_hits(addr);
    let a = ok(addr, "/v1/chat/completions", &body);
    let after = prefix_hits(addr);
    let choices = a["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["message"]["content"].as_str().expect("content"))
        .collect();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "three seeds, three draws: {texts:?}"
    );
    assert!(
        after > before,
        "the later choices found the prompt's blocks in the prefix cache"
    );
    let b = ok(addr, "/v1/chat/completions", &body);
    let again: Vec<&str> = b["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["message"]["content"].as_str().expect("content"))
        .collect();
    assert_eq!(texts, again, "seeded choices repeat");
    // Choice i is seeded seed + i: choice 1 of seed 42 is choice 0 of seed 43.
    let mut one = body.clone();
    one["n"] = json!(1);
    one["seed"] = json!(43);
    let c = ok(addr, "/v1/chat/completions", &one);
    assert_eq!(c["choices"][0]["message"]["content"], texts[1]);
    let u = &a["usage"];
    let prompt = c["usage"]["prompt_tokens"].as_u64().expect("prompt");
    assert_eq!(
        u["prompt_tokens"].as_u64(),
        Some(prompt),
        "the prompt counts once"
    );
    let ones: u64 = [42, 43, 44]
        .iter()
        .map(|&s| {
            one["seed"] = json!(s);
            ok(addr, "/v1/chat/completions", &one)["usage"]["completion_tokens"]
                .as_u64()
                .expect("n")
        })
        .sum();
    assert_eq!(u["completion_tokens"].as_u64(), Some(ones));

    // Streamed: every index gets its role, its text and its own finish, then one [DONE].
    let mut s = body.clone();
    s["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &s);
    let mut joined = vec![String::new(); 3];
    let mut finished = [0; 3];
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).expect("chunk");
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().expect("index") as usize;
        if let Some(t) = ch["delta"]["content"].as_str() {
            joined[i].push_str(t);
        }
        if !ch["finish_reason"].is_null() {
            finished[i] += 1;
        }
    }
    assert_eq!(finished, [1, 1, 1]);
    assert_eq!(joined, texts);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
}

fn prefix_hits(addr: SocketAddr) -> f64 {
    let r = request(addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find(|l| l.starts_with("tpslab:prefix_cache_hits"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no prefix_cache_hits in /metrics:\n{text}"))
}

#[test]
fn logit_bias_moves_the_greedy_choice() {
    let addr = shared();
    let base = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
                      "ignore_eos": true, "logprobs": 0, "return_tokens_as_token_ids": true});
    let ids = |v: &Value| -> Vec<u32> {
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(id_of)
            .collect()
    };
    let plain = ids(&ok(addr, "/v1/completions", &base));
    let mut banned = base.clone();
    banned["logit_bias"] = json!({ plain[0].to_string(): -100 });
    let b = ids(&ok(addr, "/v1/completions", &banned));
    assert_ne!(b[0], plain[0], "a -100 bias bans the token");
    assert!(!b.contains(&plain[0]));
    let forced_id = model().tokenizer.encode(" banana", false).expect("encode")[0];
    let mut forced = base.clone();
    forced["logit_bias"] = json!({ forced_id.to_string(): 100 });
    assert_eq!(
        ids(&ok(addr, "/v1/completions", &forced)),
        vec![forced_id; 4]
    );
    // Out of range, not a token: 400 naming the field.
    for bad in [json!({"5": 101}), json!({"99999999": 1}), json!({"x": 1})] {
        let mut b = base.clone();
        b["logit_bias"] = bad;
        let r = post(addr, "/v1/completions", &b);
        assert_eq!(r.status, 400);
        assert_eq!(r.error()["param"], "logit_bias");
    }
}

#[test]
fn echo_puts_the_prompt_first_whole_and_streamed() {
    let addr = shared();
    let prompt = "Once upon a time";
    let body = json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "echo": true});
    let whole = ok(addr, "/v1/completions", &body);
    let text = whole["choices"][0]["text"].as_str().expect("text");
    let mut plain = body.clone();
    plain["echo"] = json!(false);
    let answer = ok(addr, "/v1/completions", &plain)["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    assert_eq!(text, format!("{prompt}{answer}"));
    let mut s = body.clone();
    s["stream"] = json!(true);
    let r = post(addr, "/v1/completions", &s);
    let joined: String = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(joined, text);
}

/// Completions' `logprobs` as (id, logprob, alternatives) per token (`null` for the first
/// token of an echoed prompt).
fn completion_entries(lp: &Value) -> Vec<Option<Returned>> {
    let tokens = lp["tokens"].as_array().expect("tokens");
    (0..tokens.len())
        .map(|i| {
            let chosen = lp["token_logprobs"][i].as_f64()?;
            let top = lp["top_logprobs"][i]
                .as_object()
                .expect("top map")
                .iter()
                .map(|(k, v)| (id_of(&json!(k)), v.as_f64().expect("lp")))
                .collect();
            Some((id_of(&tokens[i]), chosen, top))
        })
        .collect()
}

#[test]
fn echo_with_logprobs_scores_the_prompt_whole_and_streamed() {
    let addr = shared();
    let lm = model();
    let prompt = "It is a truth universally acknowledged, that a single man in possession \
                  of a good fortune, must be in want of a wife.";
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": true,
                      "logprobs": 3, "ignore_eos": true, "return_tokens_as_token_ids": true});
    let v = ok(addr, "/v1/completions", &body);
    let c = &v["choices"][0];
    assert!(c["text"].as_str().expect("text").starts_with(prompt));
    let got = completion_entries(&c["logprobs"]);
    let ids: Vec<u32> =
        serde_json::from_value(ok(addr, "/tokenize", &json!({"prompt": prompt}))["tokens"].clone())
            .expect("tokens");
    let n_prompt = ids.len();
    assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(
        got.len(),
        n_prompt + 4,
        "every prompt token, then the 4 generated"
    );
    // The first prompt token has no context, hence no log-probability.
    assert!(got[0].is_none());
    assert!(c["logprobs"]["top_logprobs"][0].is_null());
    let scored: Vec<Returned> = got[1..]
        .iter()
        .map(|e| e.clone().expect("scored"))
        .collect();
    let all: Vec<u32> = ids
        .iter()
        .copied()
        .chain(scored[n_prompt - 1..].iter().map(|t| t.0))
        .collect();
    let returned: Vec<u32> = std::iter::once(ids[0])
        .chain(scored.iter().map(|t| t.0))
        .collect();
    assert_eq!(returned, all, "the prompt's ids, then the generated ones");
    let rows = reference_rows(&lm, &all, 1);
    for (pos, ((id, lp, top), row)) in scored.iter().zip(&rows).enumerate() {
        assert!(
            (lp - row[*id as usize]).abs() < TOL,
            "position {}: {lp} vs {}",
            pos + 1,
            row[*id as usize]
        );
        // Three alternatives, plus the chosen token when it is not among them.
        assert!(
            (3..=4).contains(&top.len()),
            "position {}: {top:?}",
            pos + 1
        );
        for &(t, l) in top {
            assert!(
                (l - row[t as usize]).abs() < TOL,
                "position {}: top {t}",
                pos + 1
            );
        }
    }
    // Offsets run over the tokens' text from the start of the echoed prompt.
    let offsets: Vec<usize> =
        serde_json::from_value(c["logprobs"]["text_offset"].clone()).expect("offsets");
    let mut at = 0;
    for (o, id) in offsets.iter().zip(&all) {
        assert_eq!(*o, at);
        at += String::from_utf8_lossy(lm.tokenizer.token_bytes(*id).unwrap_or_default()).len();
    }

    // Again, now that its blocks are in the prefix cache: still every position, the same
    // figures; and streamed: the same entries, the prompt's in the first chunk.
    let again = ok(addr, "/v1/completions", &body);
    assert_eq!(completion_entries(&again["choices"][0]["logprobs"]), got);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = post(addr, "/v1/completions", &sbody);
    assert_eq!(r.status, 200);
    let chunks: Vec<Value> = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    let first = completion_entries(&chunks[0]["choices"][0]["logprobs"]);
    assert!(first.len() >= n_prompt, "the prompt's entries come first");
    let streamed: Vec<Option<Returned>> = chunks
        .iter()
        .filter(|c| c["choices"][0]["logprobs"].is_object())
        .flat_map(|c| completion_entries(&c["choices"][0]["logprobs"]))
        .collect();
    assert_eq!(streamed.len(), got.len());
    for (i, (a, b)) in streamed.iter().zip(&got).enumerate() {
        match (a, b) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert_eq!(a.0, b.0, "entry {i}");
                assert!((a.1 - b.1).abs() < 1e-6, "entry {i}");
            }
            _ => panic!("entry {i}: {a:?} vs {b:?}"),
        }
    }
}

/// vLLM's `prompt_logprobs` entry of one position: (id, logprob, rank, decoded_token).
fn prompt_entries(pos: &Value) -> Vec<(u32, f64, u64, String)> {
    pos.as_object()
        .expect("a map per position")
        .iter()
        .map(|(k, e)| {
            (
                k.parse().expect("token id key"),
                e["logprob"].as_f64().expect("logprob"),
                e["rank"].as_u64().expect("rank"),
                e["decoded_token"].as_str().expect("decoded_token").into(),
            )
        })
        .collect()
}

#[test]
fn prompt_logprobs_score_every_prompt_token_with_its_rank() {
    let addr = shared();
    let lm = model();
    let prompt = "The quick brown fox jumps over the lazy dog, and then it runs away.";
    let ids: Vec<u32> =
        serde_json::from_value(ok(addr, "/tokenize", &json!({"prompt": prompt}))["tokens"].clone())
            .expect("tokens");
    // Echo with one alternative, prompt_logprobs with three: each answer keeps its own count.
    let body = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0, "echo": true,
                      "logprobs": 1, "prompt_logprobs": 3});
    let v = ok(addr, "/v1/completions", &body);
    let c = &v["choices"][0];
    let pl = c["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(pl.len(), ids.len(), "one entry per prompt token");
    assert!(pl[0].is_null(), "the first token has no context");
    let rows = reference_rows(&lm, &ids, 1);
    for (pos, (entry, row)) in pl[1..].iter().zip(&rows).enumerate() {
        let id = ids[pos + 1];
        let got = prompt_entries(entry);
        assert!(
            (3..=4).contains(&got.len()),
            "position {}: {got:?}",
            pos + 1
        );
        let mut top: Vec<_> = got.iter().filter(|e| e.2 <= 3).collect();
        top.sort_by_key(|e| e.2);
        let ranks: Vec<u64> = top.iter().map(|e| e.2).collect();
        assert_eq!(ranks, [1, 2, 3], "position {}: {got:?}", pos + 1);
        for (t, lp, rank, text) in &got {
            let want = row[*t as usize];
            assert!(
                (lp - want).abs() < TOL,
                "position {}: {t} {lp} vs {want}",
                pos + 1
            );
            let bytes = lm.tokenizer.token_bytes(*t).unwrap_or_default();
            assert_eq!(*text, String::from_utf8_lossy(bytes));
            // Its rank counts the tokens at least as likely (within the tolerance of a
            // reference computed apart).
            let above = row.iter().filter(|&&x| x > want + TOL).count() as u64;
            let at_least = row.iter().filter(|&&x| x >= want - TOL).count() as u64;
            assert!(
                (above + 1..=at_least).contains(rank),
                "position {}: token {t} rank {rank}, reference {above}+1..={at_least}",
                pos + 1
            );
        }
        assert!(
            got.iter().any(|e| e.0 == id),
            "the prompt's own token is there"
        );
    }
    // The echoed prompt's entries in `logprobs` keep the one alternative asked there.
    let tops = c["logprobs"]["top_logprobs"]
        .as_array()
        .expect("top_logprobs");
    assert!(
        tops[1..ids.len()]
            .iter()
            .all(|t| (1..=2).contains(&t.as_object().map_or(0, |m| m.len())))
    );

    // Chat: beside the choices, one entry per token of the rendered prompt.
    let v = ok(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"prompt_logprobs": 0})),
    );
    let pl = v["prompt_logprobs"]
        .as_array()
        .expect("chat prompt_logprobs");
    assert_eq!(
        pl.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().expect("usage")
    );
    assert!(pl[0].is_null());
    assert!(
        pl[1..].iter().all(|e| prompt_entries(e).len() == 1),
        "0 alternatives: the token alone"
    );
    assert!(v["choices"][0].get("prompt_logprobs").is_none());

    // What vLLM refuses is a 400 naming the field.
    for bad in [
        json!({"prompt_logprobs": 21}),
        json!({"prompt_logprobs": -1}),
        json!({"prompt_logprobs": 1, "stream": true}),
    ] {
        let r = post(addr, "/v1/chat/completions", &chat_body(bad.clone()));
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.error()["param"], "prompt_logprobs", "{bad}");
    }
}

#[test]
fn tokenize_and_detokenize_speak_the_real_tokenizer() {
    let addr = shared();
    let lm = model();
    let text = "Hello, world! Ünïcödé and 12345.";
    let v = ok(
        addr,
        "/tokenize",
        &json!({"prompt": text, "return_token_strs": true}),
    );
    let want = lm.tokenizer.encode(text, false).expect("encode");
    let got: Vec<u32> = serde_json::from_value(v["tokens"].clone()).expect("tokens");
    // BOS only where the model adds one.
    let body = if lm.tokenizer.add_bos() {
        &got[1..]
    } else {
        &got[..]
    };
    assert_eq!(body, &want[..]);
    assert_eq!(v["count"], got.len());
    assert_eq!(v["max_model_len"], lm.model.cfg.context_len);
    assert_eq!(v["token_strs"].as_array().map(Vec::len), Some(got.len()));
    let back = ok(addr, "/detokenize", &json!({"tokens": want}));
    assert_eq!(back["prompt"], text);
    // A chat's tokens are what a chat request counts as its prompt.
    let chat = chat_body(json!({"max_tokens": 1}));
    let t = ok(addr, "/tokenize", &json!({"messages": chat["messages"]}));
    let c = ok(addr, "/v1/chat/completions", &chat);
    assert_eq!(t["count"], c["usage"]["prompt_tokens"]);
    for bad in [
        json!({"tokens": [-1]}),
        json!({"tokens": [lm.model.cfg.vocab]}),
        json!({"tokens": "x"}),
    ] {
        let r = post(addr, "/detokenize", &bad);
        assert!(r.status == 400 || r.status == 422, "{bad}: {}", r.status);
    }
    let r = post(addr, "/tokenize", &json!({}));
    assert_eq!(r.status, 400);
}

#[test]
fn models_lists_context_and_quant_type() {
    let r = request(shared(), "GET", "/v1/models", &[], b"");
    let m = &r.json()["data"][0];
    assert_eq!(m["max_model_len"], model().model.cfg.context_len);
    assert_eq!(m["quantization"], "Q4_1");
}

#[test]
fn fields_the_engine_cannot_honour_are_400s_naming_them() {
    let addr = shared();
    let cases = [
        (
            "/v1/chat/completions",
            chat_body(
                json!({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}),
            ),
            "audio",
        ),
        (
            "/v1/chat/completions",
            chat_body(json!({"modalities": ["audio"]})),
            "modalities",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in it?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
            "messages[0].content[1]",
        ),
        (
            "/v1/chat/completions",
            chat_body(json!({"top_logprobs": 3})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat_body(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        ("/v1/chat/completions", chat_body(json!({"n": 0})), "n"),
        ("/v1/chat/completions", chat_body(json!({"n": 17})), "n"),
        (
            "/v1/chat/completions",
            chat_body(json!({"echo": true})),
            "echo",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "suffix": "b"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "best_of": 2}),
            "best_of",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "use_beam_search": true}),
            "use_beam_search",
        ),
    ];
    for (path, body, param) in cases {
        let r = post(addr, path, &body);
        assert_eq!(
            r.status,
            400,
            "{param}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.error()["param"], param, "{}", r.error());
    }
}
