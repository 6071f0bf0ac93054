//! Stop criteria: stop strings that span token boundaries (real tokenizer and arbitrary
//! chunking), hold-back of possible stop-string prefixes, stop tokens and token limits.

use std::sync::OnceLock;

use proptest::prelude::*;
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::sched::stop::{FinishReason, StopChecker, StopCriteria, StopMatch};
use tpslab_engine::text::detok::Detokenizer;
use tpslab_engine::text::tokenizer::Tokenizer;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))
            .expect("default model");
        Tokenizer::from_gguf(&GgufFile::open(path).expect("open")).expect("tokenizer")
    })
}

/// The reference: the text up to the earliest occurrence of any stop string.
fn cut_at_first_stop(text: &str, stops: &[String]) -> (String, bool) {
    match stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
    {
        Some(p) => (text[..p].to_string(), true),
        None => (text.to_string(), false),
    }
}

struct Outcome {
    text: String,
    finish: Option<FinishReason>,
    matched: Option<StopMatch>,
}

/// Feeds (token, text) pairs the way the engine does and checks that the emitted text only
/// ever grows and never contains a stop string.
fn feed(criteria: StopCriteria, pieces: &[(u32, String)], tail: &str) -> Outcome {
    let stops = criteria.stop_strings.clone();
    let mut checker = StopChecker::new(criteria);
    let mut out = Outcome {
        text: String::new(),
        finish: None,
        matched: None,
    };
    for (t, p) in pieces {
        let step = checker.push(*t, p);
        out.text.push_str(&step.text);
        for s in stops.iter().filter(|s| !s.is_empty()) {
            assert!(
                !out.text.contains(s.as_str()),
                "stop string {s:?} leaked into {:?}",
                out.text
            );
        }
        if step.finish.is_some() {
            out.finish = step.finish;
            out.matched = step.matched;
            break;
        }
    }
    out.text.push_str(&checker.flush(tail).text);
    if out.finish.is_none() {
        out.finish = checker.finished();
    }
    out
}

fn tokens_of(text: &str) -> Vec<(u32, String)> {
    let tok = tokenizer();
    let ids = tok.encode(text, false).expect("encode");
    let mut d = Detokenizer::new(true);
    ids.iter()
        .map(|&id| (id, d.push(tok, id).expect("push")))
        .collect()
}

#[test]
fn stop_string_spanning_tokens_with_real_tokenizer() {
    let text = "The answer is 42.\nObservation: the sky is blue.";
    let pieces = tokens_of(text);
    // "\nObservation:" is several tokens long and starts mid-way through the text.
    let stop = "\nObservation:".to_string();
    let c = StopCriteria {
        stop_strings: vec![stop.clone()],
        ..Default::default()
    };
    let out = feed(c, &pieces, "");
    assert_eq!(out.text, "The answer is 42.");
    assert_eq!(out.finish, Some(FinishReason::Stop));
    assert_eq!(out.matched, Some(StopMatch::String(stop)));
}

#[test]
fn stop_string_inside_a_single_token_is_cut() {
    // "Paris" is a single token; the stop string "ari" sits inside it.
    let pieces = tokens_of("The capital is Paris.");
    let c = StopCriteria {
        stop_strings: vec!["ari".into()],
        ..Default::default()
    };
    assert_eq!(feed(c, &pieces, "").text, "The capital is P");
}

#[test]
fn prefix_is_held_then_released() {
    let c = StopCriteria {
        stop_strings: vec!["<END>".into()],
        ..Default::default()
    };
    let mut ch = StopChecker::new(c);
    assert_eq!(ch.push(1, "x <E").text, "x ");
    assert_eq!(ch.push(1, "N").text, "");
    let step = ch.push(1, "TER");
    assert_eq!(step.text, "<ENTER");
    assert_eq!(step.finish, None);
    // Held text at the end of the stream still comes out.
    assert_eq!(ch.push(1, " <EN").text, " ");
    assert_eq!(ch.flush("").text, "<EN");
}

#[test]
fn stop_token_is_not_emitted_and_ends_the_request() {
    let tok = tokenizer();
    let c = StopCriteria::new(Some(100), tok.stop_token_ids());
    let mut pieces = tokens_of("Hello there");
    pieces.push((2, String::new())); // <|im_end|>
    pieces.extend(tokens_of(" ignored"));
    let out = feed(c, &pieces, "");
    assert_eq!(out.text, "Hello there");
    assert_eq!(out.finish, Some(FinishReason::Stop));
    assert_eq!(out.matched, Some(StopMatch::Token(2)));
}

#[test]
fn length_limit_counts_tokens_and_flushes_held_text() {
    let c = StopCriteria {
        max_tokens: Some(2),
        stop_strings: vec!["abc".into()],
        ..Default::default()
    };
    let pieces = vec![
        (5, "x".to_string()),
        (6, "ab".to_string()),
        (7, "c".to_string()),
    ];
    let out = feed(c, &pieces, "");
    // "ab" was held as a possible start of "abc", but the limit ends the stream first.
    assert_eq!(out.text, "xab");
    assert_eq!(out.finish, Some(FinishReason::Length));
}

#[test]
fn ignore_eos_runs_to_the_limit() {
    let c = StopCriteria {
        max_tokens: Some(3),
        stop_token_ids: vec![2],
        ignore_eos: true,
        ..Default::default()
    };
    let pieces = vec![
        (2, "a".to_string()),
        (2, "b".to_string()),
        (2, "c".to_string()),
        (2, "d".to_string()),
    ];
    let out = feed(c, &pieces, "");
    assert_eq!(
        (out.text.as_str(), out.finish),
        ("abc", Some(FinishReason::Length))
    );
}

#[test]
fn detokenizer_tail_can_complete_a_stop_string_at_flush() {
    let c = StopCriteria {
        stop_strings: vec!["ab".into()],
        ..Default::default()
    };
    let mut ch = StopChecker::new(c);
    assert_eq!(ch.push(1, "xa").text, "x");
    let step = ch.flush("b tail");
    assert_eq!(step.text, "");
    assert_eq!(ch.finished(), Some(FinishReason::Stop));
}

fn piece_strategy() -> impl Strategy<Value = String> {
    let atoms = vec![
        "a", "b", "c", "ab", "é", "日", "🦀", " ", "\n", "END", "E", "N", "D",
    ];
    proptest::collection::vec(proptest::sample::select(atoms), 0..4).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any chunking of any text gives the same output as cutting the whole text at the first
    /// stop string, and never lets a stop string out.
    #[test]
    fn chunked_stream_equals_cut_of_whole_text(
        pieces in proptest::collection::vec(piece_strategy(), 0..24),
        stops in proptest::collection::vec(
            proptest::sample::select(vec!["END", "ab", "b c", "🦀🦀", "é\n", "aaa", "D"]), 0..3),
    ) {
        let stops: Vec<String> = stops.into_iter().map(String::from).collect();
        let whole: String = pieces.concat();
        let (want, stopped) = cut_at_first_stop(&whole, &stops);
        let c = StopCriteria { stop_strings: stops.clone(), ..Default::default() };
        let fed: Vec<(u32, String)> = pieces.into_iter().map(|p| (7, p)).collect();
        let out = feed(c, &fed, "");
        prop_assert_eq!(out.text, want);
        prop_assert_eq!(out.finish == Some(FinishReason::Stop), stopped);
    }

    /// The same with real tokens from the model's tokenizer.
    #[test]
    fn real_tokens_equal_cut_of_whole_text(
        pieces in proptest::collection::vec(piece_strategy(), 0..16),
        stop in proptest::sample::select(vec!["END", "b a", "🦀", " 日", "\n\n", "é"]),
    ) {
        let whole: String = pieces.concat();
        let stops = vec![stop.to_string()];
        let (want, _) = cut_at_first_stop(&whole, &stops);
        let c = StopCriteria { stop_strings: stops, ..Default::default() };
        let out = feed(c, &tokens_of(&whole), "");
        prop_assert_eq!(out.text, want);
    }
}
