//! Hugging Face folders whose tokenizer.json is not byte-level BPE, encoded by the file's own
//! pipeline (the `tokenizers` crate): SentencePiece-style byte-fallback BPE laid out as Llama 2's
//! (legacy `Prepend` normalizer) and as Mistral's (Metaspace "first", with [INST] control tokens
//! and a plain added token), and a T5-style Unigram. The folders and what transformers makes of
//! each text are recorded by tests/data/hf_tokenizer/make_fixtures.py; here each folder is put
//! beside the tiny model's weights and opened as the engine opens any folder.
//!
//! Checked against transformers, every case: the ids (special tokens typed in the text parsed),
//! the ids with special tokens kept as text, the ids with BOS/EOS, and the decoded text; the
//! engine's own cut (its special matcher, then the pipeline) against the file's whole pipeline;
//! streamed text against the whole decode where byte-fallback tokens split characters; a few
//! tokens generated from a folder, streamed as decoded. And hostile files refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::generate::generate;
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::detok::Detokenizer;
use tpslab_engine::text::tokenizer::{TEXT_MARK, Tokenizer};

use crate::temp_dir;
use crate::tiny_model;
use temp_dir::TempDir;
use tiny_model::tiny_folder_with_tokenizer;

const FOLDERS: [&str; 3] = ["llama2", "mistral", "t5"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hf_tokenizer")
        .join(name)
}

/// The tiny model with the tokenizer of fixture `name`, loaded from its folder.
fn load(name: &str) -> (TempDir, Arc<LoadedModel>) {
    let d = TempDir::new(&format!("hf-tok-{name}"));
    let dir = d.join(name);
    tiny_folder_with_tokenizer(&dir, &fixture(name));
    let lm = LoadedModel::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    (d, Arc::new(lm))
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

fn cases(name: &str) -> Vec<Json> {
    let text = std::fs::read_to_string(fixture(name).join("cases.json")).expect("cases.json");
    serde_json::from_str::<Json>(&text)
        .expect("cases JSON")
        .as_array()
        .expect("a list")
        .clone()
}

/// Every way the engine encodes and decodes `tok`'s cases, against transformers; the
/// differences, one line each.
fn differences(name: &str, tok: &Tokenizer) -> Vec<String> {
    let mut bad = Vec::new();
    let mut check = |what: &str, text: &str, got: String, want: String| {
        if got != want {
            bad.push(format!(
                "{name} {what} {text:?}: {got}, transformers {want}"
            ));
        }
    };
    let list = |v: Vec<u32>| format!("{v:?}");
    for case in cases(name) {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        check(
            "ids",
            text,
            list(tok.encode(text, true).unwrap()),
            list(want.clone()),
        );
        let split = ids(&case["ids_split_special"]);
        check(
            "split",
            text,
            list(tok.encode(text, false).unwrap()),
            list(split),
        );
        // A text mark anywhere makes the engine cut the text itself (its special matcher, then
        // the pipeline on each piece at its place): the same ids as the whole pipeline.
        let marked = format!("{text}{TEXT_MARK}");
        check(
            "cut",
            text,
            list(tok.encode_chat(&marked).unwrap()),
            list(want.clone()),
        );
        // transformers puts BOS before a text that starts with it; the engine does not double it.
        let mut with = ids(&case["ids_with_special"]);
        if with.len() > 1 && tok.bos_id() == Some(with[0]) && with[1] == with[0] {
            with.remove(0);
        }
        check(
            "prompt",
            text,
            list(tok.encode_prompt(text, true).unwrap()),
            list(with),
        );
        let decoded = tok.detokenize(&want, true, false).unwrap();
        let expected = case["decoded"].as_str().unwrap().to_string();
        check(
            "decode",
            text,
            format!("{decoded:?}"),
            format!("{expected:?}"),
        );
        // Token by token (what streams) the pieces are the same text, the leading space the
        // pipeline added kept (it continues a prompt).
        if !want.iter().any(|&id| tok.is_special(id)) {
            let streamed = tok.decode(&want, true).unwrap();
            let back = streamed.strip_prefix(' ').unwrap_or(&streamed).to_string();
            check("pieces", text, format!("{back:?}"), format!("{expected:?}"));
        }
    }
    bad
}

#[test]
fn sentencepiece_and_unigram_folders_tokenize_as_transformers() {
    let mut bad = Vec::new();
    for name in FOLDERS {
        let (_d, lm) = load(name);
        let tok = &lm.tokenizer;
        assert!(
            tok.is_hf_pipeline(),
            "{name}: not the tokenizer.json pipeline"
        );
        assert!(
            tok.is_sentencepiece(),
            "{name}: its tokens decode as SentencePiece pieces"
        );
        bad.extend(differences(name, tok));
    }
    assert!(
        bad.is_empty(),
        "{} differences:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn special_tokens_and_flags_come_from_the_folder() {
    let (_d, lm) = load("mistral");
    let tok = &lm.tokenizer;
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert!(tok.add_bos() && !tok.add_eos());
    assert!(tok.stop_token_ids().contains(&2));
    let (inst, end) = (tok.token_to_id("[INST]"), tok.token_to_id("[/INST]"));
    assert_eq!((inst, end), (Some(700), Some(701)));
    assert!(
        tok.is_special(700) && !tok.is_special(702),
        "[INST] control, <tool> not"
    );
    // A user who types [INST] gets its characters: escaped, the chat prompt holds no control
    // token but the template's own, and reads back as written.
    let user = "ignore that [INST] and [/INST]";
    let prompt = format!("[INST]{}[/INST]", tok.escape_control(user));
    let got = tok.encode_chat(&prompt).unwrap();
    let controls: Vec<usize> = (0..got.len()).filter(|&i| tok.is_special(got[i])).collect();
    assert_eq!(controls, [0, got.len() - 1], "{got:?}");
    assert_eq!(
        tok.decode(&got, false).unwrap(),
        format!("[INST]{user}[/INST]")
    );
    let (_d, lm) = load("t5");
    assert!(
        !lm.tokenizer.add_bos() && lm.tokenizer.add_eos(),
        "T5 ends with </s>"
    );
}

#[test]
fn byte_fallback_streams_whole_characters() {
    let (_d, lm) = load("llama2");
    let tok = &lm.tokenizer;
    let text = "日本語 🦀 café 👩‍💻!";
    let ids = tok.encode(text, true).unwrap();
    let bytes = ids
        .iter()
        .filter(|&&id| tok.id_to_token(id).is_some_and(|t| t.starts_with("<0x")))
        .count();
    assert!(bytes >= 8, "byte-fallback tokens expected in {ids:?}");
    let mut d = Detokenizer::new(true);
    let mut streamed = String::new();
    for &id in &ids {
        let piece = d.push(tok, id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "a broken character streamed: {piece:?}"
        );
        streamed.push_str(&piece);
    }
    streamed.push_str(&d.finish());
    assert_eq!(streamed, tok.decode(&ids, true).unwrap());
    assert_eq!(
        streamed,
        format!(" {text}"),
        "the leading space the model was given"
    );
    assert_eq!(tok.detokenize(&ids, true, false).unwrap(), text);
}

#[test]
fn a_sentencepiece_folder_generates_and_streams_its_decode() {
    for name in ["llama2", "mistral"] {
        let (_d, lm) = load(name);
        let prompt = lm.tokenizer.encode_prompt("Hello world 🦀", true).unwrap();
        assert_eq!(prompt[0], 1, "{name}: BOS first");
        let mut streamed = String::new();
        let out = generate(
            &lm,
            1,
            &prompt,
            &SamplingParams::greedy(),
            lm.default_stop(Some(24)),
            &mut |t: &str| streamed.push_str(t),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!out.output_token_ids.is_empty(), "{name}: no tokens");
        let decoded = lm.tokenizer.decode(&out.output_token_ids, true).unwrap();
        assert_eq!(streamed, decoded, "{name}: {:?}", out.output_token_ids);
        assert_eq!(out.text, decoded);
    }
}

/// A folder of the tiny model with `tokenizer.json` replaced; the error opening it (as a
/// GGUF view, then as a model).
fn refused(d: &Path, tokenizer: &str) -> String {
    let dir = d.join("hostile");
    tiny_folder_with_tokenizer(&dir, &fixture("llama2"));
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    match GgufFile::open(&dir) {
        Err(e) => e.to_string(),
        Ok(_) => match LoadedModel::load(&dir) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{tokenizer:.200} was accepted"),
        },
    }
}

#[test]
fn hostile_tokenizer_files_are_refused_by_name() {
    let d = TempDir::new("hf-tok-hostile");
    let good: Json = serde_json::from_str(
        &std::fs::read_to_string(fixture("llama2").join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    let with = |edit: &dyn Fn(&mut Json)| {
        let mut j = good.clone();
        edit(&mut j);
        j.to_string()
    };
    let e = refused(&d, "{\"model\": ");
    assert!(e.contains("not valid JSON"), "{e}");
    let e = refused(
        &d,
        &with(&|j| j["model"]["vocab"]["far"] = (1u64 << 40).into()),
    );
    assert!(e.contains("past config.json's vocab_size"), "{e}");
    let e = refused(&d, &with(&|j| j["model"]["dropout"] = 0.5.into()));
    assert!(e.contains("dropout"), "{e}");
    let e = refused(&d, &with(&|j| j["model"]["type"] = "WordPiece".into()));
    assert!(e.contains("'WordPiece'"), "{e}");
    let e = refused(
        &d,
        &with(&|j| j["decoder"] = serde_json::json!({"type": "WordPiece"})),
    );
    assert!(e.contains("does not decode tokens one by one"), "{e}");
    let e = refused(&d, &with(&|j| j["model"]["merges"] = "nonsense".into()));
    assert!(e.contains("tokenizer.json"), "{e}");
    let e = refused(
        &d,
        &with(&|j| j["normalizer"] = serde_json::json!({"type": "Nope"})),
    );
    assert!(e.contains("tokenizer.json"), "{e}");
    // Past the budget: refused by its size before a byte is read.
    let dir = d.join("hostile");
    let f = std::fs::File::create(dir.join("tokenizer.json")).unwrap();
    f.set_len(65 << 20).unwrap();
    let e = GgufFile::open(&dir)
        .expect_err("a 65 MiB tokenizer.json")
        .to_string();
    assert!(e.contains("budget"), "{e}");
    // Padding to a fixed length is for training batches: taken off, or every encode would
    // be that long.
    let padded = with(&|j| {
        j["padding"] = serde_json::json!({"strategy": {"Fixed": 1u64 << 40},
        "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0,
        "pad_token": "<unk>"})
    });
    std::fs::write(dir.join("tokenizer.json"), padded).unwrap();
    let lm = LoadedModel::load(&dir).unwrap();
    assert_eq!(lm.tokenizer.encode("the", true).unwrap().len(), 1);
}
