//! The engine's one admission check as each real client sees it, on the real default model:
//! every refusal through the engine handle (the window's and the CLI's way in) as a typed
//! `Event::Refused`, through the HTTP server as its status and OpenAI error body, and on the
//! command line as its message; the same words everywhere. And how an admitted request ends:
//! its stop checker alone decides (a stop token on the last allowed token is a stop, not a
//! length), and `usage` counts what was streamed.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use tpslab_engine::sched::SchedError;
use tpslab_engine::sched::stop::{FinishReason, StopCriteria};
use tpslab_engine::serving::admission::{KvNeverFits, Refusal, RefusalKind};
use tpslab_engine::serving::engine::{EngineHandle, Event, Request};
use tpslab_engine::serving::sampler::SamplingParams;

use crate::http_client;
use http_client::*;

/// A pool of 6 blocks of 16 tokens: far smaller than the context, so "fits the context but
/// never the pool" can be asked.
const POOL_BLOCKS: usize = 6;

fn small_pool_engine(max_waiting: Option<usize>) -> EngineHandle {
    let kv = tpslab_engine::kv::KvTypes::F16.bytes_per_block(&model().model.cfg, 16) * POOL_BLOCKS;
    let eng = engine_with_kv(2, max_waiting, kv);
    assert_eq!(eng.stats().kv_total_blocks, POOL_BLOCKS);
    eng
}

fn req(prompt: Vec<u32>, max_tokens: Option<usize>) -> Request {
    Request {
        prompt,
        stop: StopCriteria::new(max_tokens, Vec::new()),
        ..Request::default()
    }
}

/// Everything `id` receives up to its last event (refused or finished).
fn events_of(rx: &mpsc::Receiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let ev = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("an event within 60 s");
        let last = matches!(ev, Event::Refused { .. } | Event::Finished { .. });
        out.push(ev);
        if last {
            return out;
        }
    }
}

/// Submits `r` and returns its refusal, checking it is the one and only event.
fn refusal(eng: &EngineHandle, r: Request) -> Refusal {
    let (tx, rx) = mpsc::channel();
    let id = eng.submit(r, tx);
    match &events_of(&rx)[..] {
        [Event::Refused { id: got, reason }] => {
            assert_eq!(*got, id);
            reason.clone()
        }
        other => panic!("not refused alone: {other:?}"),
    }
}

/// Requests the small-pool engine refuses, each with its refusal and kind.
fn refused_cases(prompt: &[u32]) -> Vec<(Request, Refusal, RefusalKind)> {
    let cfg = &model().model.cfg;
    let (ctx, vocab, n) = (cfg.context_len, cfg.vocab, prompt.len());
    let prompt = prompt.to_vec();
    let mut oov = prompt.clone();
    oov.insert(1, vocab as u32 + 3);
    vec![
        (
            req(vec![], Some(4)),
            Refusal::EmptyPrompt,
            RefusalKind::Invalid,
        ),
        (
            req(prompt.clone(), Some(0)),
            Refusal::ZeroMaxTokens,
            RefusalKind::Invalid,
        ),
        // The engine counts positions: a prompt as long as the context would still get its one
        // token (the server's stricter API rule is below); one more is past it.
        (
            req(vec![1; ctx + 1], None),
            Refusal::PastContext {
                prompt: ctx + 1,
                max_tokens: 1,
                context: ctx,
            },
            RefusalKind::TooLong,
        ),
        // Explicit max_tokens past the context is refused, never cut short.
        (
            req(prompt.clone(), Some(ctx)),
            Refusal::PastContext {
                prompt: n,
                max_tokens: ctx,
                context: ctx,
            },
            RefusalKind::TooLong,
        ),
        (
            req(oov, Some(4)),
            Refusal::OutOfVocab {
                index: 1,
                id: vocab as u32 + 3,
                vocab,
            },
            RefusalKind::Invalid,
        ),
        // Fits the context, never the pool of 96 slots: n + 200 - 1 tokens.
        (
            req(prompt.clone(), Some(200)),
            Refusal::KvNeverFits(KvNeverFits {
                tokens: n + 199,
                needed_blocks: (n + 199).div_ceil(16),
                num_blocks: POOL_BLOCKS,
            }),
            RefusalKind::TooLong,
        ),
        // max_tokens omitted: a prompt past the pool still cannot run.
        (
            req(vec![1; 100], None),
            Refusal::KvNeverFits(KvNeverFits {
                tokens: 100,
                needed_blocks: 7,
                num_blocks: POOL_BLOCKS,
            }),
            RefusalKind::TooLong,
        ),
    ]
}

#[test]
fn every_refusal_arrives_typed_through_the_engine_handle() {
    let eng = small_pool_engine(None);
    let prompt = model().raw_prompt("Once upon a time").expect("prompt");
    // A request already running goes on to its end whatever is refused beside it.
    let (tx, running_rx) = mpsc::channel();
    let mut stop = StopCriteria::new(Some(8), Vec::new());
    stop.ignore_eos = true;
    eng.submit(
        Request {
            prompt: prompt.clone(),
            stop,
            ..Request::default()
        },
        tx,
    );

    let hot = Request {
        sampling: SamplingParams {
            top_p: 1.5,
            ..SamplingParams::default()
        },
        ..req(prompt.clone(), Some(4))
    };
    for (r, want, kind) in refused_cases(&prompt) {
        let got = refusal(&eng, r);
        assert_eq!(got, want, "{got}");
        assert_eq!(got.kind(), kind, "{got}");
    }
    let got = refusal(&eng, hot);
    assert!(
        matches!(&got, Refusal::Sampling(e) if e.name == "top_p"),
        "{got}"
    );
    assert!(got.to_string().contains("top_p"), "{got}");

    match events_of(&running_rx).last() {
        Some(Event::Finished { reason, usage, .. }) => {
            assert_eq!(*reason, FinishReason::Length);
            assert_eq!(usage.completion_tokens, 8);
        }
        other => panic!("the running request did not finish: {other:?}"),
    }
}

#[test]
fn load_shedding_is_a_typed_busy_refusal() {
    let prompt = model().raw_prompt("Once upon a time").expect("prompt");
    // The scheduler's queue, after admission: typed too, and `Busy`.
    let shedding = small_pool_engine(Some(0));
    let got = refusal(&shedding, req(prompt, Some(4)));
    assert_eq!(
        got,
        Refusal::Scheduler(SchedError::QueueFull { max_waiting: 0 })
    );
    assert_eq!(got.kind(), RefusalKind::Busy);
}

/// The error object of a response of `status`, checked for OpenAI's shape.
fn error_of(r: &Resp, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let e = r.error();
    if status == 400 {
        assert_eq!(e["type"], "invalid_request_error", "{e}");
    }
    e
}

#[test]
fn every_refusal_is_an_openai_error_over_http() {
    let server = start(small_pool_engine(None), None);
    let addr = server.addr;
    let cfg = &model().model.cfg;
    let (ctx, vocab) = (cfg.context_len, cfg.vocab);
    let text = "Once upon a time";
    let n = model().raw_prompt(text).expect("prompt").len();
    let done = "/v1/completions";

    let e = error_of(
        &post(addr, done, &json!({"prompt": "", "max_tokens": 4})),
        400,
    );
    assert_eq!(e["param"], "prompt");
    assert_eq!(e["message"], Refusal::EmptyPrompt.to_string());
    assert_eq!(e["code"], Value::Null);

    let e = error_of(
        &post(
            addr,
            done,
            &json!({"prompt": [5, vocab + 1], "max_tokens": 4}),
        ),
        400,
    );
    assert_eq!(e["param"], "prompt");
    let oov = Refusal::OutOfVocab {
        index: 1,
        id: vocab as u32 + 1,
        vocab,
    };
    assert_eq!(e["message"], oov.to_string());

    // The prompt fits the context, the prompt plus max_tokens does not: the API counts the last
    // token sampled (vLLM's boundary), where the engine alone would admit it.
    let max = ctx - n + 1;
    let e = error_of(
        &post(addr, done, &json!({"prompt": text, "max_tokens": max})),
        400,
    );
    assert_eq!(e["code"], "context_length_exceeded");
    assert_eq!(e["param"], "messages");
    let past = Refusal::PastContext {
        prompt: n,
        max_tokens: max,
        context: ctx,
    };
    assert_eq!(e["message"], past.to_string());

    // Within the context, past the pool: refused by the engine at submit, the same 400, streamed
    // or not (the status waits for the engine's first event).
    let never = Refusal::KvNeverFits(KvNeverFits {
        tokens: n + 199,
        needed_blocks: (n + 199).div_ceil(16),
        num_blocks: POOL_BLOCKS,
    });
    for stream in [false, true] {
        let body = json!({"prompt": text, "max_tokens": 200, "stream": stream});
        let e = error_of(&post(addr, done, &body), 400);
        assert_eq!(e["code"], "context_length_exceeded", "stream {stream}");
        assert_eq!(e["message"], never.to_string(), "stream {stream}");
    }
    // The chat endpoint goes through the same admission.
    let mut chat = chat_body(json!({"max_tokens": 200}));
    chat["messages"][0]["content"] = json!("Hi");
    let e = error_of(&post(addr, "/v1/chat/completions", &chat), 400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(
        e["message"]
            .as_str()
            .expect("message")
            .contains("KV blocks"),
        "{e}"
    );

    // And what fits is served after all of that.
    let ok = post(
        addr,
        done,
        &json!({"prompt": text, "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    assert_eq!(ok.json()["usage"]["completion_tokens"], 3);

    // Load shedding: 429 with Retry-After, the scheduler's message.
    let shedding = start(small_pool_engine(Some(0)), None);
    let r = post(
        shedding.addr,
        done,
        &json!({"prompt": text, "max_tokens": 2}),
    );
    let e = error_of(&r, 429);
    assert_eq!(e["type"], "rate_limit_error");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(e["code"], "rate_limit_exceeded");
    assert_eq!(
        e["message"],
        Refusal::Scheduler(SchedError::QueueFull { max_waiting: 0 }).to_string()
    );
}

#[test]
fn the_cli_prints_the_same_refusal() {
    let path = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("default model");
    let m = path.to_str().expect("utf8 path");
    let ctx = model().model.cfg.context_len;
    let n = model().raw_prompt("Hello").expect("prompt").len();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
            .args(args)
            .output()
            .expect("run tpslab")
    };
    let max = (ctx + 10).to_string();
    let out = run(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Hello",
        "--max-tokens",
        &max,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let past = Refusal::PastContext {
        prompt: n,
        max_tokens: ctx + 10,
        context: ctx,
    };
    assert_eq!(
        err.lines().last(),
        Some(format!("error: {past}").as_str()),
        "{err}"
    );

    let out = run(&["generate", "--model", m, "--prompt", ""]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let empty = format!("error: {}", Refusal::EmptyPrompt);
    assert_eq!(err.lines().last(), Some(empty.as_str()), "{err}");
}

/// The tokens `prompt` streams under `stop` (greedy), how it ended and its usage count.
fn greedy(
    eng: &EngineHandle,
    prompt: &[u32],
    stop: StopCriteria,
) -> (Vec<u32>, FinishReason, usize) {
    let (tx, rx) = mpsc::channel();
    eng.submit(
        Request {
            prompt: prompt.to_vec(),
            stop,
            ..Request::default()
        },
        tx,
    );
    let mut tokens = Vec::new();
    for ev in events_of(&rx) {
        match ev {
            Event::Token { token, .. } => tokens.push(token),
            Event::Finished { reason, usage, .. } => {
                return (tokens, reason, usage.completion_tokens);
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
    panic!("no end")
}

#[test]
fn the_stop_checker_alone_decides_how_a_request_ends() {
    let eng = engine(2, None);
    let prompt = model()
        .raw_prompt("The capital of France is")
        .expect("prompt");
    let free = StopCriteria {
        max_tokens: Some(6),
        ignore_eos: true,
        ..StopCriteria::default()
    };
    let (tokens, reason, count) = greedy(&eng, &prompt, free.clone());
    assert_eq!((tokens.len(), reason, count), (6, FinishReason::Length, 6));
    // A later greedy token (the last one not seen before it) made a stop token: the request
    // ends there with `stop`, even when max_tokens is exactly that long (the limit and the stop
    // on the same token: one decision).
    let k = (1..tokens.len())
        .rev()
        .find(|&i| !tokens[..i].contains(&tokens[i]))
        .expect("a token not seen before it");
    let t = tokens[k];
    for max in [k + 1, 6] {
        let stop = StopCriteria {
            max_tokens: Some(max),
            stop_token_ids: vec![t],
            ..StopCriteria::default()
        };
        let (got, reason, count) = greedy(&eng, &prompt, stop);
        assert_eq!(reason, FinishReason::Stop, "max_tokens {max}");
        assert_eq!(got, tokens[..=k], "max_tokens {max}");
        assert_eq!(
            count,
            k + 1,
            "usage counts the stop token, max_tokens {max}"
        );
    }
    // One short of the stop token: the limit.
    let stop = StopCriteria {
        max_tokens: Some(k),
        stop_token_ids: vec![t],
        ..StopCriteria::default()
    };
    let (got, reason, count) = greedy(&eng, &prompt, stop);
    assert_eq!(
        (got, reason, count),
        (tokens[..k].to_vec(), FinishReason::Length, k)
    );
}
