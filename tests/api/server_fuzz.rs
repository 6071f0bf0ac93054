//! Fuzz tests (proptest, fixed seeds so CI runs the same cases every time): the OpenAI request
//! parser on arbitrary JSON values, arbitrary bytes through the real HTTP routes of a real
//! server (chat with tools, `/v1/responses` and `/infill` among them), and the remote client's SSE stream reader on arbitrary and arbitrarily split input.
//! `TPSLAB_FUZZ_CASES=N` runs N cases per target instead of the default few hundred, and
//! `TPSLAB_FUZZ_SEED=S` other cases.

use std::net::SocketAddr;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value, json};
use tpslab::remote::StreamReader;
use tpslab::serve::limits::Limits;
use tpslab::serve::openai::{self, Kind, ModelShape};
use tpslab_engine::sched::ClientId;

use crate::http_client;
use http_client::*;

fn config(default_cases: u32, seed: u64) -> Config {
    let cases = std::env::var("TPSLAB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    // `TPSLAB_FUZZ_SEED` moves every target to other cases (tests/fuzz/run-long.sh).
    let offset = std::env::var("TPSLAB_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed.wrapping_add(offset)),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The fields the parser knows, so generated objects reach past the type checks.
const KEYS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "seed",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "stream",
    "stream_options",
    "priority",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "echo",
    "return_tokens_as_token_ids",
    "suffix",
    "input_prefix",
    "input_suffix",
    "input_extra",
    "n_predict",
    "filename",
    "best_of",
    "audio",
    "modalities",
    "image_url",
    "role",
    "content",
    "type",
    "text",
    "include_usage",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "function",
    "name",
    "parameters",
    "arguments",
    "tool_calls",
    "tool_call_id",
    "input",
    "instructions",
    "max_output_tokens",
    "previous_response_id",
    "call_id",
    "output",
    "format",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(-1),
            Just(2),
            Just(100),
            Just(4096)
        ]
        .prop_map(|n| json!(n)),
        "[ -~]{0,12}".prop_map(Value::String),
        Just(json!("user")),
        Just(json!("text")),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        prop::sample::select(KEYS).prop_map(String::from),
                        "[a-z0-9]{0,6}"
                    ],
                    inner
                ),
                0..8
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A body close to a valid request (completions, chat, chat with tools, responses with a
/// function tool): a valid one with some fields replaced or added.
fn near_valid() -> impl Strategy<Value = Value> {
    (
        0..4u8,
        prop::collection::vec((prop::sample::select(KEYS), json_value()), 0..4),
    )
        .prop_map(|(kind, edits)| {
            let f = json!({"name": "f", "parameters": {"type": "object",
                "properties": {"a": {"type": "integer"}}}});
            let mut b = match kind {
                0 => json!({"prompt": "Hi", "max_tokens": 2}),
                1 => json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
                2 => json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                            "tools": [{"type": "function", "function": f}],
                            "tool_choice": "required"}),
                _ => {
                    let mut tool = f;
                    tool["type"] = json!("function");
                    json!({"input": "Hi", "max_output_tokens": 2, "tools": [tool]})
                }
            };
            for (k, v) in edits {
                b[k] = v;
            }
            b
        })
}

fn shape() -> ModelShape {
    let cfg = &model().model.cfg;
    ModelShape {
        context_len: cfg.context_len,
        vocab: cfg.vocab,
    }
}

/// What a parsed request may be, whatever the input: within every cap.
fn check_parsed(p: &openai::Parsed, l: &Limits) {
    if let Some(pr) = p.common.priority {
        assert!((l.min_priority..=l.max_priority).contains(&pr));
    }
    assert!(
        p.max_tokens()
            .is_none_or(|m| m >= 1 && (m as usize) < shape().context_len)
    );
    // `n` choices within the cap (the long run at seed 1587080354 found this check still
    // asserting the n == 1 of before choices were served).
    assert!((1..=l.max_n).contains(&p.n));
    assert!(p.common.n.is_none_or(|n| n as usize == p.n));
}

proptest! {
    #![proptest_config(config(300, 0x5eed_0001))]

    #[test]
    fn the_parser_takes_any_json_without_panicking(
        v in prop_oneof![json_value(), near_valid()],
        chat in any::<bool>(),
    ) {
        let kind = if chat { Kind::Chat } else { Kind::Completion };
        let l = Limits::default();
        if let Ok(p) = openai::parse(kind, &v, &l, shape()) {
            check_parsed(&p, &l);
            // Tokenizing what parsed is bounded by the caps: it must not panic either.
            if let Ok((req, _reasoning)) = openai::to_request(&p, &model(), &l, ClientId::LOCAL) {
                prop_assert!(!req.prompt.is_empty());
                prop_assert!(req.prompt.len() < shape().context_len);
                prop_assert!(req.stop.stop_strings.len() <= l.max_stop);
            }
        }
    }
}

/// One server for the HTTP fuzz: a small KV pool, so a body that happens to be valid (with
/// `max_tokens` omitted: as much as fits) still finishes in moments.
fn fuzz_server() -> SocketAddr {
    static S: OnceLock<tpslab::serve::RunningServer> = OnceLock::new();
    S.get_or_init(|| {
        let kv = tpslab_engine::kv::KvTypes::F16.bytes_per_block(&model().model.cfg, 16) * 4;
        start(engine_with_kv(4, None, kv), None)
    })
    .addr
}

fn body_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        near_valid().prop_map(|v| v.to_string().into_bytes()),
        (near_valid(), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
            let b = v.to_string().into_bytes();
            let at = cut.index(b.len() + 1);
            b[..at].to_vec()
        }),
    ]
}

proptest! {
    #![proptest_config(config(200, 0x5eed_0002))]

    #[test]
    fn any_body_through_the_real_routes_gets_an_answer(
        body in body_bytes(),
        route in prop::sample::select(&["/v1/chat/completions", "/v1/completions", "/v1/responses", "/infill"][..]),
    ) {
        let addr = fuzz_server();
        let path = route;
        let r = request(addr, "POST", path, &[], &body);
        prop_assert!(
            [200, 400, 404, 413, 422, 429].contains(&r.status),
            "status {} for {:?}: {}",
            r.status,
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&r.body)
        );
        if r.status != 200 {
            r.error();
        }
    }
}

/// Pieces of a completion stream: good chunks, usage with any counts, errors, garbage.
fn sse_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,20}".prop_map(|t| format!(
            "data: {}\n\n",
            json!({"choices": [{"text": t, "finish_reason": null}]})
        )),
        prop_oneof![Just("stop"), Just("length"), Just("other")].prop_map(|r| format!(
            "data: {}\n\n",
            json!({"choices": [{"text": "", "finish_reason": r}]})
        )),
        (any::<u64>(), any::<u64>()).prop_map(|(p, c)| format!(
            "data: {}\n\n",
            json!({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c}})
        )),
        Just("data: [DONE]\n\n".to_string()),
        Just(": keep-alive\n\n".to_string()),
        Just("data: {\"error\": {\"message\": \"boom\"}}\n\n".to_string()),
        "[ -~\r\n]{0,40}",
    ]
}

/// Feeds `chunks`; what came out: the texts, and how it ended.
fn read_all(chunks: &[&[u8]]) -> (Vec<String>, Result<String, String>) {
    let mut r = StreamReader::new();
    let mut texts = Vec::new();
    for c in chunks {
        match r.feed(c, &mut texts) {
            Ok(false) => {}
            Ok(true) => break,
            Err(e) => return (texts, Err(e)),
        }
    }
    (
        texts,
        r.end()
            .map(|(reason, usage)| format!("{reason:?} {usage:?}")),
    )
}

proptest! {
    #![proptest_config(config(400, 0x5eed_0003))]

    #[test]
    fn the_sse_reader_gives_the_same_answer_however_the_stream_is_cut(
        pieces in prop::collection::vec(sse_piece(), 0..24),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let whole = pieces.concat().into_bytes();
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(whole.len() + 1)).collect();
        at.sort_unstable();
        at.dedup();
        let mut chunks = Vec::new();
        let mut from = 0;
        for &a in &at {
            chunks.push(&whole[from..a]);
            from = a;
        }
        chunks.push(&whole[from..]);
        prop_assert_eq!(read_all(&chunks), read_all(&[&whole[..]]));
    }

    #[test]
    fn the_sse_reader_takes_any_bytes(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..12),
    ) {
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let _ = read_all(&refs);
    }
}

/// The long run's find (seed 1587080354): a chat with `n: 2` parses, within the caps.
#[test]
fn a_chat_of_two_choices_parses_within_the_caps() {
    let v = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 2});
    let l = Limits::default();
    let p = openai::parse(Kind::Chat, &v, &l, shape()).expect("parses");
    check_parsed(&p, &l);
    assert_eq!(p.n, 2);
}
