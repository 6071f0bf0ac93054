//! Speculative decoding on the real model. Greedy outputs are token-identical with every
//! proposer (n-gram lookup, self-drafting from the first layers, a draft model) to runs without
//! speculation: alone and in batch mixes, under chunked prefill, a small batch cap and a KV pool
//! small enough to preempt. Sampled outputs at temperature 1 keep the model's distribution: a
//! two-sample chi-square test over many seeded draws cannot tell speculation on from off.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use tpslab_engine::kv::KvTypes;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::SchedulerConfig;
use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::serving::engine::{
    EngineConfig, EngineHandle, Event, Knobs, KvSettings, Request, Usage,
};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::spec::{SpecConfig, SpecMethod};

use crate::default_model;
use default_model::model;

/// Copy-heavy prompts (where n-gram lookup pays) and free writing.
const PROMPTS: [&str; 5] = [
    "Repeat the list exactly. apple, banana, cherry, date, elderberry, fig, grape. Again: apple, banana,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "1, 2, 3, 4, 5, 6, 7, 8,",
];
const MAX_TOKENS: usize = 24;

fn request(lm: &LoadedModel, text: &str, sampling: SamplingParams, max_tokens: usize) -> Request {
    Request {
        prompt: lm.raw_prompt(text).expect("tokenize"),
        sampling,
        stop: StopCriteria {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Submits every request at once; each one's tokens and usage, in order.
fn run_all(engine: &EngineHandle, reqs: Vec<Request>) -> Vec<(Vec<u32>, Usage)> {
    let (tx, rx) = mpsc::channel();
    let ids: Vec<u64> = reqs
        .into_iter()
        .map(|r| engine.submit(r, tx.clone()))
        .collect();
    let mut toks: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut usage: HashMap<u64, Usage> = HashMap::new();
    while usage.len() < ids.len() {
        match rx
            .recv_timeout(Duration::from_secs(600))
            .expect("engine answers")
        {
            Event::Token { id, token, .. } => toks.entry(id).or_default().push(token),
            Event::Finished { id, usage: u, .. } => {
                usage.insert(id, u);
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
    ids.iter()
        .map(|id| (toks.remove(id).unwrap_or_default(), usage[id]))
        .collect()
}

fn engine(knobs: Knobs) -> EngineHandle {
    let draft = (knobs.spec.method == SpecMethod::Draft).then(model);
    EngineHandle::start(
        model(),
        EngineConfig {
            threads: 2,
            knobs,
            draft,
            ..EngineConfig::default()
        },
        None,
    )
    .expect("engine")
}

/// Speculation by `method`, every proposal verified (the pay-off policy off), so the paths
/// these tests hold to the same tokens run at every step.
fn spec(method: SpecMethod) -> SpecConfig {
    SpecConfig {
        method,
        num_tokens: 4,
        payoff: false,
        ..SpecConfig::default()
    }
}

fn greedy(lm: &LoadedModel, texts: &[&str]) -> Vec<Request> {
    texts
        .iter()
        .map(|t| request(lm, t, SamplingParams::greedy(), MAX_TOKENS))
        .collect()
}

#[test]
fn greedy_tokens_are_identical_with_every_proposer_alone_and_in_batches() {
    let lm = model();
    let off = engine(Knobs::default());
    let alone: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|t| run_all(&off, greedy(&lm, &[t])).remove(0).0)
        .collect();
    drop(off);
    assert!(alone.iter().all(|o| o.len() == MAX_TOKENS));
    let per_block = KvTypes::F16.bytes_per_block(&lm.model.cfg, 4);
    let settings: Vec<(&str, SchedulerConfig, KvSettings)> = vec![
        ("default", SchedulerConfig::default(), KvSettings::default()),
        (
            "tiny token budget, chunked prefill",
            SchedulerConfig {
                max_num_batched_tokens: 7,
                ..SchedulerConfig::default()
            },
            KvSettings::default(),
        ),
        (
            "two sequences at a time",
            SchedulerConfig {
                max_num_seqs: 2,
                ..SchedulerConfig::default()
            },
            KvSettings::default(),
        ),
        (
            // 30 blocks of 4 tokens: the longest request alone needs 15, all ten ~110.
            "tiny KV pool (preemption)",
            SchedulerConfig::default(),
            KvSettings {
                budget_bytes: per_block * 30,
                block_size: 4,
                ..KvSettings::default()
            },
        ),
    ];
    for method in [SpecMethod::Ngram, SpecMethod::SelfDraft, SpecMethod::Draft] {
        let (mut drafted, mut accepted) = (0, 0);
        for (name, scheduler, kv) in &settings {
            let e = engine(Knobs {
                scheduler: scheduler.clone(),
                kv: kv.clone(),
                spec: spec(method),
            });
            // Each prompt twice: the repeats also hit the prefix cache.
            let texts: Vec<&str> = PROMPTS.iter().chain(PROMPTS.iter()).copied().collect();
            let together = run_all(&e, greedy(&lm, &texts));
            for (i, (got, u)) in together.iter().enumerate() {
                assert_eq!(
                    got,
                    &alone[i % PROMPTS.len()],
                    "{method}, {name}: prompt {:?}",
                    texts[i]
                );
                assert_eq!(u.completion_tokens, MAX_TOKENS);
                // A request whose proposals were verified spent time in those steps.
                assert_eq!(u.spec.verify_us > 0, u.spec.drafts > 0, "{method}, {name}");
                drafted += u.spec.draft_tokens;
                accepted += u.spec.accepted_tokens;
            }
            std::thread::sleep(Duration::from_millis(50));
            let st = e.stats();
            if name.contains("preemption") {
                assert!(st.live.counters.preemptions > 0, "{method}: no preemption");
            }
            let c = &st.live.counters.spec;
            assert_eq!(c.num_draft_tokens as usize > 0, drafted > 0);
            assert_eq!(c.verify_us > 0, c.num_drafts > 0, "{method}, {name}");
            assert!(
                c.propose_us > 0,
                "{method}, {name}: no proposal time counted"
            );
        }
        eprintln!("{method}: {accepted} of {drafted} proposed tokens accepted");
        assert!(drafted > 0, "{method}: nothing was proposed");
        assert!(accepted > 0, "{method}: nothing was accepted");
        assert!(accepted <= drafted);
    }
}

/// One draw's category: the prompt, the position in the answer and the token there.
type Draw = (usize, usize, u32);

/// Two-sample chi-square statistic over the categories both samples see at least `min` times
/// together (the rest pooled into one), and its degrees of freedom.
fn chi_square(a: &HashMap<Draw, u64>, b: &HashMap<Draw, u64>, min: u64) -> (f64, usize) {
    let mut keys: Vec<Draw> = a.keys().chain(b.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let (mut stat, mut cats, mut rest) = (0.0, 0usize, (0u64, 0u64));
    let na: u64 = a.values().sum();
    let nb: u64 = b.values().sum();
    let term = |x: u64, y: u64| {
        // Samples of sizes na and nb (equal here, but kept general).
        let (x, y) = (x as f64, y as f64);
        let (ka, kb) = (
            (nb as f64 / na as f64).sqrt(),
            (na as f64 / nb as f64).sqrt(),
        );
        (ka * x - kb * y).powi(2) / (x + y)
    };
    for k in keys {
        let (x, y) = (
            a.get(&k).copied().unwrap_or(0),
            b.get(&k).copied().unwrap_or(0),
        );
        if x + y >= min {
            stat += term(x, y);
            cats += 1;
        } else {
            rest = (rest.0 + x, rest.1 + y);
        }
    }
    if rest.0 + rest.1 > 0 {
        stat += term(rest.0, rest.1);
        cats += 1;
    }
    (stat, cats.saturating_sub(1))
}

/// Upper critical value of chi-square with `df` degrees of freedom at p = 0.001
/// (Wilson-Hilferty: accurate to a few percent from df = 3 on).
fn chi_square_critical_001(df: usize) -> f64 {
    let (k, z) = (df as f64, 3.0902);
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Prompts of the distribution test: one the model continues freely (many likely tokens, so
/// the test has categories to compare) and one it copies (n-gram proposals are accepted often,
/// so the acceptance path is what is compared, not only the rejection path).
const DRAW_PROMPTS: [&str; 2] = [
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "red green blue red green blue red green blue red green blue red green",
];

#[test]
fn sampled_outputs_keep_the_models_distribution() {
    let lm = model();
    const DRAWS: u64 = 400;
    const LEN: usize = 4;
    // The histogram of (prompt, position, token) of many seeded draws at temperature 1.
    let draw = |method: SpecMethod| {
        let e = engine(Knobs {
            spec: spec(method),
            ..Knobs::default()
        });
        let reqs: Vec<Request> = (0..DRAWS)
            .flat_map(|seed| {
                let sampling = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed),
                    ..SamplingParams::default()
                };
                DRAW_PROMPTS.map(|p| request(&lm, p, sampling.clone(), LEN))
            })
            .collect();
        let mut hist: HashMap<Draw, u64> = HashMap::new();
        let (mut drafted, mut accepted) = (0, 0);
        for (i, (toks, u)) in run_all(&e, reqs).into_iter().enumerate() {
            assert_eq!(toks.len(), LEN);
            // The first token comes from the prompt's own step, before any proposal.
            for (pos, &t) in toks.iter().enumerate().skip(1) {
                *hist.entry((i % DRAW_PROMPTS.len(), pos, t)).or_default() += 1;
            }
            drafted += u.spec.draft_tokens;
            accepted += u.spec.accepted_tokens;
        }
        (hist, drafted, accepted)
    };
    let (off, _, _) = draw(SpecMethod::Off);
    for method in [SpecMethod::Ngram, SpecMethod::SelfDraft] {
        let (on, drafted, accepted) = draw(method);
        assert!(drafted > 100, "{method}: only {drafted} proposed");
        // Both paths of the acceptance rule are taken many times, not a handful.
        assert!(
            accepted >= 20 && accepted + 20 <= drafted,
            "{method}: {accepted} of {drafted}"
        );
        let (stat, df) = chi_square(&off, &on, 10);
        let crit = chi_square_critical_001(df);
        eprintln!(
            "{method}: chi2 {stat:.1} on {df} df (critical {crit:.1}); {accepted}/{drafted} accepted"
        );
        assert!(df >= 3, "too few categories to judge");
        assert!(
            stat < crit,
            "{method}: distributions differ (chi2 {stat:.1} >= {crit:.1}, {df} df)"
        );
    }
}

/// The engine's stats once `done` holds (bounded: the engine publishes after each command).
fn stats_when(
    e: &EngineHandle,
    what: &str,
    done: impl Fn(&tpslab_engine::serving::engine::EngineSnapshot) -> bool,
) -> tpslab_engine::serving::engine::EngineSnapshot {
    for _ in 0..600 {
        let st = e.stats();
        if done(&st) {
            return st;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("waited 30 s for {what}: {:?}", e.stats().last_error);
}

/// A draft model set while the engine runs (the dashboard's picker): one with another
/// vocabulary is refused with the reason and nothing changes; one that shares the tokenizer is
/// used once the draft method is on, with the same greedy tokens as without and proposals made.
#[test]
fn a_draft_model_set_while_running_is_checked_then_used() {
    let lm = model();
    let e = engine(Knobs::default());
    let texts = &PROMPTS[..2];
    let plain = run_all(&e, greedy(&lm, texts));
    // A synthetic model: the same vocabulary size, but byte tokens where the model has words.
    let other = LoadedModel::synthetic("smollm2-135m", tpslab_kernels::WType::Q8_0, 1, 2)
        .expect("synthetic model");
    e.set_draft(Some(std::sync::Arc::new(other)));
    let st = stats_when(&e, "the refusal", |s| s.last_error.is_some());
    let err = st.last_error.unwrap_or_default();
    assert!(err.contains("vocabulary differs"), "{err}");
    assert!(err.contains("kept the previous draft model"), "{err}");
    assert_eq!(st.spec_draft, None);

    e.set_draft(Some(std::sync::Arc::clone(&lm)));
    e.set_knobs(Knobs {
        spec: spec(SpecMethod::Draft),
        ..Knobs::default()
    });
    let st = stats_when(&e, "the draft method", |s| {
        s.knobs.spec.method == SpecMethod::Draft
    });
    assert_eq!(st.last_error, None);
    assert_eq!(st.spec_draft.as_deref(), Some(lm.path.as_path()));
    let with = run_all(&e, greedy(&lm, texts));
    for (i, ((want, _), (got, _))) in plain.iter().zip(&with).enumerate() {
        assert_eq!(got, want, "prompt {:?}", texts[i]);
    }
    let drafted: usize = with.iter().map(|(_, u)| u.spec.draft_tokens).sum();
    assert!(drafted > 0, "the draft model proposed nothing");
}

/// A draft model whose proposals are never kept (a tiny model of random weights that shares the
/// tokenizer): with the pay-off policy on, its proposals stop being verified after a few
/// rejections, and are only probed now and then; the tokens stay those of the run without
/// speculation. With every proposal verified, it proposes at every step.
#[test]
fn proposals_never_kept_stop_being_verified() {
    let lm = model();
    let dir = std::env::temp_dir().join(format!("tpslab-spec-payoff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("random-draft.gguf");
    let tok = tpslab_engine::model::tiny::tokenizer_of(&lm.path).expect("tokenizer");
    tpslab_engine::model::tiny::write_tiny("llama", &tok, &path).expect("tiny model");
    let draft = std::sync::Arc::new(LoadedModel::load(&path).expect("load the tiny model"));
    let tokens = 160;
    let text = PROMPTS[3];
    let run = |payoff: bool| {
        let e = EngineHandle::start(
            model(),
            EngineConfig {
                threads: 2,
                knobs: Knobs {
                    spec: SpecConfig {
                        payoff,
                        ..spec(SpecMethod::Draft)
                    },
                    ..Knobs::default()
                },
                draft: Some(std::sync::Arc::clone(&draft)),
                ..EngineConfig::default()
            },
            None,
        )
        .expect("engine");
        let req = request(&lm, text, SamplingParams::greedy(), tokens);
        run_all(&e, vec![req]).remove(0)
    };
    let off = engine(Knobs::default());
    let (plain, _) = run_all(
        &off,
        vec![request(&lm, text, SamplingParams::greedy(), tokens)],
    )
    .remove(0);
    drop(off);
    let (every, every_usage) = run(false);
    let (paid, paid_usage) = run(true);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(every, plain);
    assert_eq!(paid, plain);
    let (e, p) = (every_usage.spec, paid_usage.spec);
    eprintln!(
        "verified always: {} proposals, {} tokens, {} kept; when it pays: {} proposals, {} tokens, {} kept",
        e.drafts, e.draft_tokens, e.accepted_tokens, p.drafts, p.draft_tokens, p.accepted_tokens
    );
    assert!(
        e.accepted_tokens * 10 < e.draft_tokens,
        "the random draft's proposals were kept: {e:?}"
    );
    assert!(e.drafts > 100, "every step verified: {e:?}");
    // A handful of rejections, then one probe every PROBE_STEPS steps.
    assert!(
        p.drafts * 4 < e.drafts,
        "the policy kept verifying proposals that were never kept: {p:?} against {e:?}"
    );
}
