//! The reasoning splitter: what a thinking model writes is split into reasoning and answer the
//! same way whole and streamed in any pieces (tags cut across tokens, one character at a time,
//! random cuts), with the prompt having opened `<think>` or not.

use proptest::prelude::*;
use tpslab_engine::text::reasoning::{ReasoningParser, ReasoningTags, Split, THINK};

fn split(reasoning: &str, content: &str) -> Split {
    Split {
        reasoning: reasoning.into(),
        content: content.into(),
    }
}

/// (prompt opened the reasoning, output, expected split)
fn cases() -> Vec<(bool, &'static str, Split)> {
    vec![
        // Qwen3 with thinking on: the model opens and closes the block itself.
        (
            false,
            "<think>\nI add two and two.\n</think>\n\nThe answer is 4.",
            split("I add two and two.", "The answer is 4."),
        ),
        // DeepSeek-R1: the prompt ended with "<think>\n"; the output only closes it.
        (
            true,
            "Okay, 2+2.\nThat is 4.\n</think>\n\n**4**",
            split("Okay, 2+2.\nThat is 4.", "**4**"),
        ),
        // No reasoning at all: the answer is kept exactly, whitespace included.
        (
            false,
            "  Paris is the capital.\n",
            split("", "  Paris is the capital.\n"),
        ),
        // A tag later in the answer is part of the answer.
        (
            false,
            "Use <think> tags like </think> this.",
            split("", "Use <think> tags like </think> this."),
        ),
        // Leading whitespace before the open tag.
        (false, "\n\n<think>hmm</think>ok", split("hmm", "ok")),
        // Never closed: all reasoning (the answer ran out of tokens while thinking).
        (
            true,
            "\nStill thinking about it ",
            split("Still thinking about it", ""),
        ),
        (false, "<think>\nunfinished", split("unfinished", "")),
        // Qwen3 with thinking off: the prompt closed the block; the answer is plain.
        (false, "The answer is 4.", split("", "The answer is 4.")),
        // Only the start of a tag, then the end: not a tag.
        (false, "<thin", split("", "<thin")),
        (true, "a </thi", split("a </thi", "")),
        // An empty reasoning block, and text that only looks like a close at first.
        (false, "<think>\n\n</think>\n\nHi", split("", "Hi")),
        (
            true,
            "x </thinking> y</think>z",
            split("x </thinking> y", "z"),
        ),
        // Multi-byte text around the tags.
        (
            true,
            "日本語で考える 🦀</think>答え",
            split("日本語で考える 🦀", "答え"),
        ),
        (false, "", split("", "")),
    ]
}

fn parser(opened: bool) -> ReasoningParser {
    let prompt = if opened {
        "<｜Assistant｜><think>\n"
    } else {
        "<|im_start|>assistant\n"
    };
    ReasoningParser::for_prompt(THINK, prompt)
}

/// Streams `text` cut at `cuts` (byte offsets on char boundaries).
fn streamed(opened: bool, text: &str, cuts: &[usize]) -> Split {
    let mut p = parser(opened);
    let mut out = Split::default();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        out.extend(p.push(&text[at..c]));
        at = c;
    }
    out.extend(p.finish());
    out
}

#[test]
fn whole_outputs_split_as_llama_server_does() {
    for (opened, text, want) in cases() {
        assert_eq!(
            parser(opened).split_all(text),
            want,
            "{text:?} (opened {opened})"
        );
    }
}

#[test]
fn every_cut_into_two_and_three_pieces_gives_the_same_split() {
    for (opened, text, want) in cases() {
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &bounds {
            assert_eq!(streamed(opened, text, &[a]), want, "{text:?} cut at {a}");
            for &b in bounds.iter().filter(|&&b| b >= a) {
                assert_eq!(
                    streamed(opened, text, &[a, b]),
                    want,
                    "{text:?} cut at {a}, {b}"
                );
            }
        }
        let inner = bounds.len().saturating_sub(1).max(1);
        let one_char: Vec<usize> = bounds.get(1..inner).unwrap_or_default().to_vec();
        assert_eq!(
            streamed(opened, text, &one_char),
            want,
            "{text:?} a char at a time"
        );
    }
}

#[test]
fn whether_it_is_in_reasoning_is_known_per_piece() {
    let mut p = parser(true);
    assert!(p.in_reasoning());
    let s = p.push("Let me see.");
    assert_eq!(s, split("Let me see.", ""));
    assert!(p.in_reasoning());
    // The close tag split over two tokens: nothing of it leaks into the reasoning.
    assert_eq!(p.push(" </th"), split("", ""));
    assert_eq!(p.push("ink>\n\nDone"), split("", "Done"));
    assert!(!p.in_reasoning());
    assert_eq!(p.finish(), Split::default());
}

#[test]
fn other_families_tags() {
    let magistral = ReasoningTags::for_template("{{ '[THINK]' }}...{{ '[/THINK]' }}");
    let got = ReasoningParser::new(magistral).split_all("[THINK]plan[/THINK]answer");
    assert_eq!(got, split("plan", "answer"));
}

proptest! {
    #[test]
    fn random_cuts_of_random_outputs_agree(
        opened in any::<bool>(),
        parts in prop::collection::vec(
            prop::sample::select(vec!["<think>", "</think>", "</th", "ink>", "\n", " ", "a", "é", "🦀", "<", "think", "x y"]),
            0..24,
        ),
        cuts in prop::collection::vec(0usize..200, 0..8),
    ) {
        let text: String = parts.concat();
        let mut cuts: Vec<usize> = cuts
            .into_iter()
            .map(|c| c.min(text.len()))
            .filter(|&c| text.is_char_boundary(c))
            .collect();
        cuts.sort_unstable();
        let whole = parser(opened).split_all(&text);
        prop_assert_eq!(streamed(opened, &text, &cuts), whole.clone());
        // Nothing is lost but tags and the whitespace next to them.
        let kept: usize = whole.reasoning.len() + whole.content.len();
        prop_assert!(kept <= text.len());
    }
}
