//! Incremental detokenizer on the real SmolLM2 tokenizer: streaming equals a full decode, and
//! text the tokenizer encoded never streams out a broken character.

use std::sync::OnceLock;

use proptest::prelude::*;
use tpslab_engine::formats::gguf::GgufFile;
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

/// Streams `ids` and returns the chunks, checking each intermediate state against a full decode.
fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut d = Detokenizer::new(skip_special);
    let mut chunks = Vec::new();
    let mut so_far = String::new();
    for (i, &id) in ids.iter().enumerate() {
        let chunk = d.push(tok, id).expect("push");
        so_far.push_str(&chunk);
        chunks.push(chunk);
        // What has been emitted is always a prefix of the full decode of the ids so far.
        let full = tok.decode(&ids[..=i], skip_special).expect("decode");
        assert!(
            full.starts_with(&so_far),
            "after {i} tokens: {so_far:?} vs {full:?}"
        );
    }
    chunks.push(d.finish());
    chunks
}

/// Pieces that make byte-level tokens split characters: emoji (4 bytes, ZWJ sequences), CJK,
/// accents, digits, whitespace.
fn text_strategy() -> impl Strategy<Value = String> {
    let pieces = vec![
        "a",
        "the",
        " cat",
        "é",
        "ñ",
        "日本語",
        "中文",
        "한국어",
        "🦀",
        "🚀",
        "👩\u{200d}👩\u{200d}👧",
        "🇫🇷",
        " ",
        "\n",
        "\t",
        "42",
        "€",
        "ß",
        "Ω",
        "…",
        "<|im_end|>",
        "’",
    ];
    proptest::collection::vec(proptest::sample::select(pieces), 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_ids_stream_to_the_full_decode(
        ids in proptest::collection::vec(0u32..49152, 0..48),
        skip in any::<bool>(),
    ) {
        let tok = tokenizer();
        let streamed: String = stream(tok, &ids, skip).concat();
        prop_assert_eq!(streamed, tok.decode(&ids, skip).expect("decode"));
        prop_assert_eq!(tok.decode(&ids, skip).expect("decode"), tok.decode_hf(&ids, skip).expect("hf"));
    }

    #[test]
    fn encoded_text_streams_back_without_broken_chars(text in text_strategy()) {
        let tok = tokenizer();
        let ids = tok.encode(&text, false).expect("encode");
        let chunks = stream(tok, &ids, true);
        for c in &chunks {
            prop_assert!(!c.contains('\u{fffd}'), "broken character in chunk {:?}", c);
        }
        prop_assert_eq!(chunks.concat(), text);
    }
}

#[test]
fn emoji_split_across_tokens_is_held_until_complete() {
    let tok = tokenizer();
    let ids = tok.encode("🦀", false).expect("encode");
    // A 4-byte emoji in a byte-level vocabulary of this size takes several tokens.
    assert!(ids.len() > 1, "{ids:?}");
    let mut d = Detokenizer::new(true);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(d.push(tok, id).expect("push"), "");
        assert!(d.has_pending());
    }
    assert_eq!(d.push(tok, ids[ids.len() - 1]).expect("push"), "🦀");
    assert_eq!(d.finish(), "");
}

#[test]
fn truncated_character_is_replaced_at_finish() {
    let tok = tokenizer();
    let ids = tok.encode("🦀", false).expect("encode");
    let cut = &ids[..ids.len() - 1];
    let streamed = stream(tok, cut, true).concat();
    assert_eq!(streamed, tok.decode(cut, true).expect("decode"));
    assert!(streamed.contains('\u{fffd}'));
}

#[test]
fn control_tokens_follow_skip_special() {
    let tok = tokenizer();
    let ids = tok
        .encode("<|im_start|>assistant\nhi<|im_end|>", true)
        .expect("encode");
    assert_eq!(stream(tok, &ids, true).concat(), "assistant\nhi");
    assert_eq!(
        stream(tok, &ids, false).concat(),
        "<|im_start|>assistant\nhi<|im_end|>"
    );
    let mut d = Detokenizer::new(true);
    assert!(
        d.push(tok, 1_000_000).is_err(),
        "unknown id must be an error, not a panic"
    );
}
