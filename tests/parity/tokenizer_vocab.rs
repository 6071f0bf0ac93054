//! Every tokenizer vocabulary of llama.cpp's test fixtures (`models/ggml-vocab-*.gguf`) held
//! against llama.cpp: a vocabulary the engine claims must tokenize each case of its `.inp` file
//! to exactly the ids of its `.out` file, compared as llama.cpp's `test-tokenizer-0` compares
//! them (no BOS/EOS added, special tokens in the text not parsed); one it does not claim must be
//! refused with an error naming what is unsupported. `llama-spm` also round-trips every token
//! and every code point, as llama.cpp's `test-tokenizer-1-spm` does.

use crate::llamacpp;

use std::sync::OnceLock;

use proptest::prelude::*;
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::text::detok::Detokenizer;
use tpslab_engine::text::tokenizer::Tokenizer;

/// The vocabularies this engine claims. Those with `.inp`/`.out` cases must match them all.
const CLAIMED: &[&str] = &[
    "aquila",
    "baichuan",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gpt-2",
    "gpt-neox",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// The vocabularies it refuses, with the word its error must name.
const REFUSED: &[(&str, &str)] = &[
    ("bert-bge", "'bert'"),
    ("gemma-4", "'gemma4'"),
    ("nomic-bert-moe", "'t5'"),
];

fn fixture_names() -> Vec<String> {
    let dir = llamacpp::models_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(
                name.strip_prefix("ggml-vocab-")?
                    .strip_suffix(".gguf")?
                    .to_string(),
            )
        })
        .collect();
    names.sort();
    names
}

fn load(name: &str) -> Result<Tokenizer, String> {
    let path = llamacpp::vocab(name);
    let gguf = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Tokenizer::from_gguf(&gguf).map_err(|e| e.to_string())
}

fn has_cases(name: &str) -> bool {
    llamacpp::vocab(name).with_extension("gguf.inp").is_file()
}

/// Streams `ids` through the detokenizer and checks the text equals the whole decode.
fn assert_streams_like_decode(tok: &Tokenizer, ids: &[u32], what: &str) {
    let mut d = Detokenizer::new(false);
    let mut streamed = String::new();
    for &id in ids {
        streamed.push_str(&d.push(tok, id).expect("push"));
    }
    streamed.push_str(&d.finish());
    assert_eq!(
        streamed,
        tok.decode(ids, false).expect("decode"),
        "{what}: streamed text differs from the full decode"
    );
}

#[test]
fn every_fixture_vocabulary_is_claimed_and_matches_or_refused_clearly() {
    let names = fixture_names();
    assert!(
        names.len() >= 19,
        "expected llama.cpp's vocabularies, found {names:?}"
    );
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for name in &names {
        let claimed = CLAIMED.contains(&name.as_str());
        let refused = REFUSED.iter().find(|(n, _)| n == name);
        match (load(name), claimed, refused) {
            (Ok(tok), true, _) => {
                if !has_cases(name) {
                    // Only loaded: llama.cpp ships no cases for it.
                    assert!(tok.vocab_size() > 0);
                    continue;
                }
                for (i, (text, want)) in llamacpp::vocab_cases(name).iter().enumerate() {
                    checked += 1;
                    let got = tok.encode(text, false).expect("encode");
                    if &got != want {
                        failures.push(format!(
                            "{name} case {i} {text:?}:\n  llama.cpp {want:?}\n  engine    {got:?}"
                        ));
                        continue;
                    }
                    assert_streams_like_decode(&tok, &got, &format!("{name} case {i}"));
                    // Byte-level BPE and SentencePiece with byte fallback lose nothing: the
                    // pieces (BPE), or llama.cpp's detokenize that takes the added leading
                    // space off again (SentencePiece), give the text back.
                    let back = if tok.is_sentencepiece() {
                        tok.detokenize(&got, false, true).expect("detokenize")
                    } else {
                        tok.decode(&got, false).expect("decode")
                    };
                    if back != *text {
                        failures.push(format!("{name} case {i}: {text:?} decodes to {back:?}"));
                    }
                }
            }
            (Err(e), false, Some((_, word))) => {
                assert!(
                    e.contains(word),
                    "{name}: refusal {e:?} does not name {word}"
                );
            }
            (Ok(_), false, _) => failures.push(format!(
                "{name} is claimed now: add it to CLAIMED so its cases are checked"
            )),
            (Err(e), true, _) => failures.push(format!("{name} should load: {e}")),
            (Err(e), false, None) => failures.push(format!(
                "{name} (a new fixture?) is refused ({e}) but not listed in REFUSED"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 300, "only {checked} cases checked");
}

#[test]
fn sentencepiece_vocabularies_give_llama_cpp_prompt_ids() {
    // Llama 2's vocabulary: BOS first, a leading space, byte fallback for what it lacks.
    let tok = load("llama-spm").expect("llama-spm");
    assert!(tok.is_sentencepiece());
    assert!(tok.add_bos());
    assert_eq!(tok.pre_tokenizer(), None);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    let ids = tok.encode_prompt(" Hello", false).expect("encode");
    assert_eq!(ids[0], 1);
    assert_eq!(&ids[1..], llamacpp_case("llama-spm", " Hello").as_slice());
    // Control tokens in text stay text unless parsed; parsed, the text after one gets the
    // leading space again.
    let plain = tok.encode("<s>Hi", false).expect("encode");
    assert!(!plain.contains(&1), "{plain:?}");
    let parsed = tok.encode("<s>Hi", true).expect("encode");
    assert_eq!(parsed[0], 1);
    assert_eq!(
        &parsed[1..],
        tok.encode("Hi", false).expect("encode").as_slice()
    );
    // </s> ends generation.
    assert!(tok.stop_token_ids().contains(&2));
}

/// The `.out` ids of one `.inp` case of a vocabulary.
fn llamacpp_case(name: &str, text: &str) -> Vec<u32> {
    llamacpp::vocab_cases(name)
        .into_iter()
        .find(|(t, _)| t == text)
        .map(|(_, ids)| ids)
        .unwrap_or_else(|| panic!("{name} has no case {text:?}"))
}

#[test]
fn phi3_special_tokens_strip_the_whitespace_after_them() {
    // llama.cpp gives Phi-3's special tokens the right-strip attribute (not <s>, <unk>,
    // <|endoftext|>): the newline after <|user|> belongs to no token.
    let tok = load("phi-3").expect("phi-3");
    let user = tok.token_to_id("<|user|>").expect("<|user|>");
    let end = tok.token_to_id("<|end|>").expect("<|end|>");
    let ids = tok.encode("<|user|>\nHi<|end|>\n", true).expect("encode");
    let hi = tok.encode("Hi", false).expect("encode");
    let mut want = vec![user];
    want.extend(&hi);
    want.push(end);
    assert_eq!(ids, want);
    assert!(tok.stop_token_ids().contains(&end));
    assert!(tok.stop_token_ids().contains(&32000)); // <|endoftext|>
}

#[test]
fn llama_spm_round_trips_every_token_and_code_point() {
    let tok = load("llama-spm").expect("llama-spm");
    for id in 0..tok.vocab_size() as u32 {
        let s = tok.detokenize(&[id], false, true).expect("detokenize");
        let ids = tok.encode(&s, true).expect("encode");
        let check = tok.detokenize(&ids, false, true).expect("detokenize");
        assert_eq!(
            check, s,
            "token {id} detokenizes to {s:?}, its ids {ids:?} to {check:?}"
        );
    }
    for cp in 0..0x11_0000u32 {
        if (0xD800..=0xDFFF).contains(&cp) || (0x4_0000..=0xE_0000).contains(&cp) {
            continue;
        }
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        let s = c.to_string();
        let ids = tok.encode(&s, true).expect("encode");
        let check = tok.detokenize(&ids, false, true).expect("detokenize");
        // U+2581 is SentencePiece's own space mark, which decodes to a space.
        assert!(
            cp == 0x2581 || check == s,
            "U+{cp:04X} round-trips to {check:?}"
        );
    }
}

#[test]
fn hostile_texts_finish_without_error() {
    // Many special tokens and long runs in one text: bounded work, no panic.
    let tok = load("command-r").expect("command-r");
    let mut text = String::new();
    for _ in 0..2000 {
        text.push_str("<|START_OF_TURN_TOKEN|>  \u{2581}\u{2581} <0xFF> ");
    }
    text.push_str(&" ".repeat(100_000));
    let start = std::time::Instant::now();
    for parse in [false, true] {
        let ids = tok.encode(&text, parse).expect("encode");
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids, false).expect("decode"), text);
    }
    let spm = load("llama-spm").expect("llama-spm");
    let ids = spm
        .encode(&"\u{10FFFF}日本".repeat(20_000), true)
        .expect("encode");
    assert!(ids.len() > 20_000);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
}

/// llama.cpp's `llama-tokenize` over the claimed vocabularies (committed; regenerate with
/// `tests/data/tokenizer/make_llamacpp_prompts.py`): chat-style prompts with BOS and special
/// tokens parsed, the same texts plain, and each vocabulary's end-of-generation set.
const PROMPTS: &str = include_str!("../data/tokenizer/llamacpp_prompts.json");

#[test]
fn prompts_and_stop_tokens_match_llama_tokenize() {
    let refs: serde_json::Value = serde_json::from_str(PROMPTS).expect("reference JSON");
    let refs = refs.as_object().expect("object");
    assert_eq!(refs.len(), CLAIMED.len());
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let mut failures = Vec::new();
    for (name, r) in refs {
        let tok = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let eog = ids(&r["eog"]);
        if tok.stop_token_ids() != eog {
            failures.push(format!(
                "{name}: stop tokens {:?}, llama.cpp {eog:?}",
                tok.stop_token_ids()
            ));
        }
        for case in r["cases"].as_array().expect("cases") {
            let text = case["text"].as_str().expect("text");
            let plain = tok.encode(text, false).expect("encode");
            if plain != ids(&case["plain"]) {
                failures.push(format!(
                    "{name} plain {text:?}:\n  llama.cpp {:?}\n  engine    {plain:?}",
                    ids(&case["plain"])
                ));
            }
            // llama.cpp adds BOS even before a BOS the text starts with (and warns); this
            // engine does not double it.
            let mut want = ids(&case["prompt"]);
            if want.len() >= 2 && tok.bos_id() == Some(want[0]) && want[1] == want[0] {
                want.remove(0);
            }
            let prompt = tok.encode_prompt(text, true).expect("encode");
            if prompt != want {
                failures.push(format!(
                    "{name} prompt {text:?}:\n  llama.cpp {want:?}\n  engine    {prompt:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn llama_spm() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| load("llama-spm").expect("llama-spm"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// SentencePiece byte tokens (`<0xE6>`...) cut characters apart; streamed, the text still
    /// equals the whole decode.
    #[test]
    fn sentencepiece_random_ids_stream_to_the_full_decode(
        ids in proptest::collection::vec(prop_oneof![3u32..259, 0u32..32000], 0..48),
        skip in any::<bool>(),
    ) {
        let tok = llama_spm();
        let mut d = Detokenizer::new(skip);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&d.push(tok, id).expect("push"));
        }
        streamed.push_str(&d.finish());
        prop_assert_eq!(streamed, tok.decode(&ids, skip).expect("decode"));
    }
}

/// Every claimed vocabulary, loaded once.
fn claimed() -> &'static [(String, Tokenizer)] {
    static ALL: OnceLock<Vec<(String, Tokenizer)>> = OnceLock::new();
    ALL.get_or_init(|| {
        CLAIMED
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    load(n).unwrap_or_else(|e| panic!("{n}: {e}")),
                )
            })
            .collect()
    })
}

/// Ids of `text` cut into pieces of `piece` bytes, and whole, for one vocabulary.
fn pieces_and_whole(tok: &Tokenizer, text: &str, piece: usize) -> (Vec<u32>, Vec<u32>) {
    let cut = tok.encode_in_pieces(text, false, piece).expect("encode");
    let whole = tok
        .encode_in_pieces(text, false, usize::MAX)
        .expect("encode");
    (cut, whole)
}

#[test]
fn long_text_cut_into_pieces_tokenizes_as_it_does_whole() {
    // Every llama.cpp case joined into one long text, between prose, CJK with its punctuation,
    // digits and runs of spaces: cut as often as it can be (pieces of one byte take every cut),
    // each vocabulary's ids must be those of the whole text.
    let mut failures = Vec::new();
    for (name, tok) in claimed() {
        let mut text = String::new();
        let cases = if has_cases(name) {
            llamacpp::vocab_cases(name)
        } else {
            Vec::new()
        };
        for (i, (case, _)) in cases.iter().enumerate() {
            text.push_str(case);
            text.push_str(
                [
                    "the quick fox ",
                    "我们运行模型。速度，",
                    "  12 ab cd\n\n x y",
                    " ",
                ][i % 4],
            );
        }
        text.push_str(&"Hello world, it's 2026 and we're here. ".repeat(40));
        for piece in [1, 5, 64, 1000] {
            let (cut, whole) = pieces_and_whole(tok, &text, piece);
            if cut != whole {
                let at = cut.iter().zip(&whole).take_while(|(a, b)| a == b).count();
                failures.push(format!(
                    "{name}, pieces of {piece}: ids differ from token {at} (of {})",
                    whole.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random text over the characters around each cut (ASCII letters, spaces, CJK ideographs
    /// and punctuation, digits, apostrophes, newlines, `▁`): every vocabulary gives the same
    /// ids cut into pieces as whole.
    #[test]
    fn random_text_cut_into_pieces_tokenizes_as_it_does_whole(
        text in "([a-zA-Z]{1,6}|[ ]{1,3}|[我们运行模型]{1,4}|[。，、！？；：]|[0-9]{1,4}|'s|'ll|\n|\u{2581}|[.,!?-]|é){1,60}",
        piece in 1usize..24,
    ) {
        for (name, tok) in claimed() {
            let (cut, whole) = pieces_and_whole(tok, &text, piece);
            prop_assert_eq!(cut, whole, "{} pieces of {}: {:?}", name, piece, text);
        }
    }
}
