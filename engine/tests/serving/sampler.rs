//! Sampler properties: seeded runs repeat, truncations (top-k, top-p, min-p) never pick outside
//! their sets, greedy is argmax, penalties move choices the expected way, bad logits never panic.

use proptest::prelude::*;
use tpslab_engine::serving::sampler::{Sampler, SamplingParams, argmax};

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(7),
        ..SamplingParams::default()
    }
}

/// Ids ordered best first: logit descending, id ascending on ties.
fn ranked(logits: &[f32]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    ids
}

fn draws(p: &SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
    let mut s = Sampler::new(p);
    (0..n)
        .map(|_| s.sample(&mut logits.to_vec(), &[]))
        .collect()
}

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-8.0f32..8.0, 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn seeded_runs_repeat_exactly(
        logits in logits_strategy(),
        temperature in 0.05f32..2.0,
        top_k in 0u32..40,
        top_p in 0.05f32..=1.0,
        min_p in 0.0f32..0.3,
        seed in any::<u64>(),
    ) {
        let p = SamplingParams { temperature, top_k, top_p, min_p, seed: Some(seed), ..Default::default() };
        prop_assert_eq!(draws(&p, &logits, 30), draws(&p, &logits, 30));
    }

    #[test]
    fn top_k_never_picks_outside_the_k_best(logits in logits_strategy(), k in 1u32..20, seed in any::<u64>()) {
        let p = SamplingParams { temperature: 1.5, top_k: k, seed: Some(seed), ..Default::default() };
        let allowed = &ranked(&logits)[..(k as usize).min(logits.len())];
        for id in draws(&p, &logits, 50) {
            prop_assert!(allowed.contains(&(id as usize)), "picked {} outside top-{}", id, k);
        }
    }

    #[test]
    fn top_p_never_picks_outside_the_nucleus(
        logits in logits_strategy(),
        top_p in 0.05f32..0.95,
        top_k in 0u32..30,
        seed in any::<u64>(),
    ) {
        // Reference: sort everything, keep top-k, normalise, take the smallest prefix reaching p.
        let order = ranked(&logits);
        let kept = if top_k == 0 { order.len() } else { (top_k as usize).min(order.len()) };
        let max = f64::from(logits[order[0]]);
        let w: Vec<f64> = order[..kept].iter().map(|&i| (f64::from(logits[i]) - max).exp()).collect();
        let z: f64 = w.iter().sum();
        let mut cum = 0.0;
        let mut n = kept;
        for (i, wi) in w.iter().enumerate() {
            cum += wi / z;
            if cum >= f64::from(top_p) {
                n = i + 1;
                break;
            }
        }
        // One extra candidate of slack for a float tie exactly at the boundary.
        let allowed = &order[..(n + 1).min(kept)];
        let p = SamplingParams { temperature: 1.0, top_k, top_p, seed: Some(seed), ..Default::default() };
        for id in draws(&p, &logits, 50) {
            prop_assert!(allowed.contains(&(id as usize)), "picked {} outside the nucleus of {}", id, n);
        }
    }

    #[test]
    fn min_p_never_picks_unlikely_tokens(logits in logits_strategy(), min_p in 0.01f32..0.9, seed in any::<u64>()) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let p = SamplingParams { temperature: 2.0, min_p, seed: Some(seed), ..Default::default() };
        for id in draws(&p, &logits, 50) {
            // p_i / p_max at temperature 1 must be at least min_p (tiny slack for rounding).
            let ratio = (f64::from(logits[id as usize]) - f64::from(max)).exp();
            prop_assert!(ratio >= f64::from(min_p) * (1.0 - 1e-5), "ratio {} < min_p {}", ratio, min_p);
        }
    }

    #[test]
    fn temperature_zero_is_argmax_with_lowest_id_on_ties(
        logits in proptest::collection::vec((-3i32..3).prop_map(|x| x as f32), 1..100),
    ) {
        let want = ranked(&logits)[0] as u32;
        let mut s = Sampler::new(&params(0.0));
        prop_assert_eq!(s.sample(&mut logits.clone(), &[]), want);
        prop_assert_eq!(argmax(&logits), want);
    }

    /// Greedy choice after penalties equals the argmax of independently penalised logits.
    #[test]
    fn penalties_match_a_reference(
        logits in proptest::collection::vec(-5.0f32..5.0, 2..60),
        history in proptest::collection::vec(0u32..80, 0..40),
        prompt_frac in 0.0f64..1.0,
        rep in 0.5f32..2.0,
        freq in -2.0f32..2.0,
        pres in -2.0f32..2.0,
    ) {
        let prompt_len = (history.len() as f64 * prompt_frac) as usize;
        let mut want = logits.clone();
        let mut seen = std::collections::BTreeSet::new();
        for &t in &history {
            if (t as usize) < want.len() && seen.insert(t) {
                let l = &mut want[t as usize];
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
        }
        let mut counts = std::collections::BTreeMap::new();
        for &t in &history[prompt_len..] {
            if (t as usize) < want.len() {
                *counts.entry(t).or_insert(0u32) += 1;
            }
        }
        for (&t, &c) in &counts {
            want[t as usize] -= c as f32 * freq + pres;
        }
        let p = SamplingParams {
            repetition_penalty: rep,
            frequency_penalty: freq,
            presence_penalty: pres,
            ..SamplingParams::default()
        };
        let mut got_logits = logits.clone();
        let got = Sampler::new(&p).sample_with_prompt(&mut got_logits, &history, prompt_len);
        prop_assert_eq!(got, argmax(&want));
        prop_assert_eq!(got_logits, want);
    }
}

#[test]
fn repetition_penalty_pushes_repeated_tokens_down() {
    let p = SamplingParams {
        repetition_penalty: 1.1,
        ..params(0.0)
    };
    // Positive logit divided: 2.0 / 1.1 = 1.82 < 1.9.
    assert_eq!(Sampler::new(&p).sample(&mut [2.0, 1.9], &[0]), 1);
    // Negative logit multiplied: -1.0 * 1.1 = -1.1 < -1.05.
    assert_eq!(Sampler::new(&p).sample(&mut [-1.0, -1.05], &[0]), 1);
    // Not in history: untouched.
    assert_eq!(Sampler::new(&p).sample(&mut [2.0, 1.9], &[1]), 0);
    // Counted once however often it repeats.
    let mut l = [2.0f32, 0.0];
    Sampler::new(&p).sample(&mut l, &[0, 0, 0, 0]);
    assert!((l[0] - 2.0 / 1.1).abs() < 1e-6);
}

#[test]
fn frequency_and_presence_penalties_count_generated_tokens() {
    let freq = SamplingParams {
        frequency_penalty: 0.2,
        ..params(0.0)
    };
    // 1.0 - 3 * 0.2 = 0.4 < 0.5
    assert_eq!(Sampler::new(&freq).sample(&mut [1.0, 0.5], &[0, 0, 0]), 1);
    // 1.0 - 2 * 0.2 = 0.6 > 0.5
    assert_eq!(Sampler::new(&freq).sample(&mut [1.0, 0.5], &[0, 0]), 0);
    // The same tokens in the prompt do not count for frequency (OpenAI / vLLM).
    assert_eq!(
        Sampler::new(&freq).sample_with_prompt(&mut [1.0, 0.5], &[0, 0, 0], 3),
        0
    );
    let pres = SamplingParams {
        presence_penalty: 0.6,
        ..params(0.0)
    };
    assert_eq!(Sampler::new(&pres).sample(&mut [1.0, 0.5], &[0]), 1);
    // A negative penalty encourages.
    let enc = SamplingParams {
        presence_penalty: -1.0,
        ..params(0.0)
    };
    assert_eq!(Sampler::new(&enc).sample(&mut [1.0, 0.5], &[1]), 1);
}

#[test]
fn seeded_sampling_follows_the_softmax() {
    // Fixed seed: deterministic, so this is not a flaky statistical test.
    let probs = [0.5f64, 0.3, 0.2];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let count = |t: f32| {
        let mut c = [0usize; 3];
        for id in draws(
            &SamplingParams {
                temperature: t,
                seed: Some(1234),
                ..Default::default()
            },
            &logits,
            20_000,
        ) {
            c[id as usize] += 1;
        }
        c.map(|x| x as f64 / 20_000.0)
    };
    let t1 = count(1.0);
    for (got, want) in t1.iter().zip(probs) {
        assert!((got - want).abs() < 0.02, "T=1: {t1:?}");
    }
    // T = 0.5 squares the probabilities before renormalising: sharper.
    let z: f64 = probs.iter().map(|p| p * p).sum();
    let t05 = count(0.5);
    for (got, p) in t05.iter().zip(probs) {
        assert!((got - p * p / z).abs() < 0.02, "T=0.5: {t05:?}");
    }
}

#[test]
fn different_seeds_differ() {
    let logits = vec![0.0f32; 1000];
    let a = draws(
        &SamplingParams {
            temperature: 1.0,
            seed: Some(1),
            ..Default::default()
        },
        &logits,
        20,
    );
    let b = draws(
        &SamplingParams {
            temperature: 1.0,
            seed: Some(2),
            ..Default::default()
        },
        &logits,
        20,
    );
    assert_ne!(a, b);
}

#[test]
fn bad_logits_never_panic() {
    let nan = f32::NAN;
    for t in [0.0, 0.8] {
        for top_p in [1.0, 0.9] {
            for min_p in [0.0, 0.1] {
                let p = SamplingParams {
                    top_p,
                    min_p,
                    top_k: 5,
                    ..params(t)
                };
                let mut s = Sampler::new(&p);
                // All NaN / all -inf / empty: documented fallback 0.
                assert_eq!(s.sample(&mut [nan, nan, nan], &[]), 0);
                assert_eq!(s.sample(&mut [f32::NEG_INFINITY; 4], &[1]), 0);
                assert_eq!(s.sample(&mut [], &[3]), 0);
                // NaN is treated as -inf, never chosen.
                for _ in 0..50 {
                    assert_eq!(s.sample(&mut [nan, -1.0, nan], &[]), 1);
                }
                // +inf wins outright.
                assert_eq!(s.sample(&mut [0.0, f32::INFINITY, 5.0], &[]), 1);
                // History ids outside the vocabulary are ignored.
                assert_eq!(s.sample(&mut [nan, 1.0], &[99, 1_000_000]), 1);
            }
        }
    }
}

#[test]
fn params_default_serde_and_validation() {
    let d = SamplingParams::default();
    assert_eq!(d.temperature, 0.0, "the default is greedy");
    let p: SamplingParams =
        serde_json::from_str(r#"{"temperature":0.7,"top_p":0.9,"seed":5}"#).expect("json");
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.seed),
        (0.7, 0.9, 0, Some(5))
    );
    assert!(p.validate().is_ok());
    let bad = SamplingParams {
        top_p: 0.0,
        ..d.clone()
    };
    assert_eq!(bad.validate().map_err(|e| e.name), Err("top_p"));
    let bad = SamplingParams {
        temperature: f32::NAN,
        ..d.clone()
    };
    assert_eq!(bad.validate().map_err(|e| e.name), Err("temperature"));
    // Unvalidated nonsense is clamped, not a crash: NaN temperature -> greedy.
    assert_eq!(Sampler::new(&bad).sample(&mut [0.0, 1.0, 0.5], &[]), 1);
    assert_eq!(Sampler::new(&bad).params().temperature, 0.0);
}

/// What a GPU backend sends for top-k rows: the k largest logits (or more), unordered. Sampling
/// from them stays inside the top-k set, repeats with a seed whatever order they arrive in, and
/// follows the same softmax as sampling from the whole row.
#[test]
fn sampling_from_top_k_candidates() {
    let logits: Vec<f32> = (0..500).map(|i| ((i * 7919) % 613) as f32 / 60.0).collect();
    let top: Vec<usize> = ranked(&logits).into_iter().take(64).collect();
    let mut p = params(0.9);
    p.top_k = 40;
    p.seed = Some(11);
    let mut s = Sampler::new(&p);
    assert_eq!(s.top_k_only(), Some(40));
    let ids: Vec<u32> = top.iter().map(|&i| i as u32).collect();
    let vals: Vec<f32> = top.iter().map(|&i| logits[i]).collect();
    let mut rev_ids = ids.clone();
    rev_ids.reverse();
    let mut rev_vals = vals.clone();
    rev_vals.reverse();
    let mut s2 = Sampler::new(&p);
    let allowed: Vec<usize> = ranked(&logits).into_iter().take(40).collect();
    let mut hits = vec![0usize; logits.len()];
    for _ in 0..4000 {
        let a = s.sample_candidates(&ids, &vals);
        let b = s2.sample_candidates(&rev_ids, &rev_vals);
        assert_eq!(a, b, "candidate order changed a seeded draw");
        assert!(allowed.contains(&(a as usize)), "{a} is outside the top-40");
        hits[a as usize] += 1;
    }
    // The most likely token is drawn most often, as from the full row.
    let best = argmax(&logits) as usize;
    assert_eq!(
        hits.iter()
            .enumerate()
            .max_by_key(|&(_, h)| *h)
            .map(|(i, _)| i),
        Some(best)
    );
    // Penalties or greedy need more than the candidates.
    p.repetition_penalty = 1.1;
    assert_eq!(Sampler::new(&p).top_k_only(), None);
    assert_eq!(Sampler::new(&params(0.0)).top_k_only(), None);
}

/// Speculative verification keeps the distribution: whatever token is proposed, the token
/// `verify` returns is distributed as `sample` would draw it (rejection sampling against a
/// point-mass proposal), under plain sampling and under top-k / top-p truncation; greedy keeps
/// the argmax. 40 000 seeded draws per case, each frequency within 0.015 of its probability.
#[test]
fn verification_keeps_the_distribution_whatever_is_proposed() {
    let probs = [0.4f64, 0.25, 0.15, 0.1, 0.06, 0.04];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let n = 40_000;
    let cases: [(&str, SamplingParams, Vec<f64>); 3] = [
        (
            "plain",
            SamplingParams {
                temperature: 1.0,
                seed: Some(99),
                ..Default::default()
            },
            probs.to_vec(),
        ),
        (
            "top-k 3",
            SamplingParams {
                temperature: 1.0,
                top_k: 3,
                seed: Some(99),
                ..Default::default()
            },
            {
                let z: f64 = probs[..3].iter().sum();
                probs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| if i < 3 { p / z } else { 0.0 })
                    .collect()
            },
        ),
        (
            "top-p 0.7",
            SamplingParams {
                temperature: 1.0,
                top_p: 0.7,
                seed: Some(99),
                ..Default::default()
            },
            {
                // 0.4 + 0.25 < 0.7 <= 0.4 + 0.25 + 0.15: the nucleus is the first three.
                let z: f64 = probs[..3].iter().sum();
                probs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| if i < 3 { p / z } else { 0.0 })
                    .collect()
            },
        ),
    ];
    for (name, params, want) in cases {
        // A likely, an unlikely and an impossible (truncated away) proposal.
        for draft in [0u32, 4, 5] {
            let mut s = Sampler::new(&params);
            let mut c = vec![0usize; probs.len()];
            let mut kept = 0;
            for _ in 0..n {
                let t = s.verify(&mut logits.clone(), &[], 0, draft);
                c[t as usize] += 1;
                kept += usize::from(t == draft);
            }
            for (i, (&got, &p)) in c.iter().zip(&want).enumerate() {
                let f = got as f64 / n as f64;
                assert!(
                    (f - p).abs() < 0.015,
                    "{name}, proposal {draft}: token {i} drawn {f:.3}, probability {p:.3}"
                );
            }
            // The proposal is kept exactly as often as it is likely.
            let f = kept as f64 / n as f64;
            assert!(
                (f - want[draft as usize]).abs() < 0.015,
                "{name}: kept {f:.3}"
            );
        }
    }
    // Greedy: the argmax, kept iff proposed.
    let mut g = Sampler::new(&SamplingParams::greedy());
    assert_eq!(g.verify(&mut logits.clone(), &[], 0, 0), 0);
    assert_eq!(g.verify(&mut logits.clone(), &[], 0, 3), 0);
}
