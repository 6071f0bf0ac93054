//! Fuzzing the doors a model file comes in by: the GGUF reader and model load, split sets, the
//! safetensors header, `config.json`, `tokenizer.json`, chat-template rendering and the JSON
//! schemas of structured output. Each target
//! mutates a valid input (byte flips, overwritten counts, truncation, JSON values swapped for
//! hostile ones) and asks only that the engine answers: Ok, or an error, never a panic, an abort,
//! a hang or an allocation sized by the file.
//!
//! The pass in the test suite is short and seeded (the same cases every run);
//! `TPSLAB_FUZZ_CASES=N` runs N cases per target, `TPSLAB_FUZZ_SEED=S` another seed, and
//! `TPSLAB_FUZZ_SECS=T` batches of cases on successive seeds for T seconds per target
//! (`tests/fuzz/run-long.sh` sets them). A case that fails is printed with its seed and index,
//! and becomes a test in `regressions` below.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::Value as Json;
use tpslab_engine::device::Workspace;
use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::gguf_split::{KEY_COUNT, KEY_NO, KEY_TENSORS};
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::constraint::{Grammar, compiler_for};
use tpslab_engine::text::chat::{ChatMessage, ChatTemplate, RenderBudget};
use tpslab_kernels::ThreadPool;
use tpslab_kernels::WType;

#[path = "support/split.rs"]
mod split;
#[path = "support/temp_dir.rs"]
mod temp_dir;
#[path = "support/tiny_model.rs"]
mod tiny_model;
use temp_dir::TempDir;
use tiny_model::{tiny_folder, tiny_llama};

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

/// A runner of `cases` cases on `seed`.
fn runner_at(cases: u32, seed: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        // Shrinking re-runs a failure many times; the printed case is enough to reproduce.
        max_shrink_iters: 64,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// Runs `test` over `strategy`: `default_cases` cases (or `TPSLAB_FUZZ_CASES`) on the seed
/// (`TPSLAB_FUZZ_SEED`); with `TPSLAB_FUZZ_SECS` set, batches of that many cases on seeds
/// counted up from it until the seconds have passed (`tests/fuzz/run-long.sh`). Prints the
/// cases run, the time and the seeds, as `fuzz NAME: ...` (the figures BENCHMARKS.md quotes).
fn fuzz<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let cases = env_u64("TPSLAB_FUZZ_CASES").map_or(default_cases, |n| n as u32);
    let seed = env_u64("TPSLAB_FUZZ_SEED").unwrap_or(0x7e55_1ab5);
    let budget = env_u64("TPSLAB_FUZZ_SECS").map(std::time::Duration::from_secs);
    let t0 = std::time::Instant::now();
    let mut batches = 0u64;
    loop {
        let at = seed.wrapping_add(batches);
        if let Err(e) = runner_at(cases, at).run(strategy, &test) {
            panic!("fuzz {name}: seed {at}, batch of {cases} cases: {e}");
        }
        batches += 1;
        if budget.is_none_or(|b| t0.elapsed() >= b) {
            break;
        }
    }
    eprintln!(
        "fuzz {name}: {} cases in {:.1} s, seeds {seed}..{}",
        batches * u64::from(cases),
        t0.elapsed().as_secs_f64(),
        seed.wrapping_add(batches)
    );
}

/// One change to a byte string.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR a byte at (position mod len).
    Flip(usize, u8),
    /// Overwrite 8 bytes with a little-endian u64 (a count or a length gone wrong).
    Word(usize, u64),
    /// Overwrite 4 bytes with a u32 (a type id, a rank).
    Half(usize, u32),
    /// Cut the file at (position mod len).
    Truncate(usize),
    /// Insert bytes.
    Insert(usize, Vec<u8>),
}

fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        Just(1 << 32),
        Just(1 << 40),
        0u64..4096,
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(p, b)| Mutation::Flip(p, b)),
        3 => (any::<usize>(), hostile_u64()).prop_map(|(p, v)| Mutation::Word(p, v)),
        2 => (any::<usize>(), prop_oneof![Just(0u32), Just(u32::MAX), 0u32..64, any::<u32>()])
            .prop_map(|(p, v)| Mutation::Half(p, v)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(p, b)| Mutation::Insert(p, b)),
    ]
}

/// Applies `muts` to `bytes`; positions land in the first `focus` bytes (the header) 3 times in 4.
fn mutate(bytes: &[u8], muts: &[Mutation], focus: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for (i, m) in muts.iter().enumerate() {
        if out.is_empty() {
            break;
        }
        let span = if i % 4 == 3 {
            out.len()
        } else {
            focus.clamp(1, out.len())
        };
        match m {
            Mutation::Flip(p, b) => out[p % span] ^= b,
            Mutation::Word(p, v) => {
                let at = (p % span).min(out.len().saturating_sub(8));
                let end = (at + 8).min(out.len());
                out[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            Mutation::Half(p, v) => {
                let at = (p % span).min(out.len().saturating_sub(4));
                let end = (at + 4).min(out.len());
                out[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            Mutation::Truncate(p) => out.truncate(p % out.len()),
            Mutation::Insert(p, b) => {
                let at = p % out.len();
                out.splice(at..at, b.iter().copied());
            }
        }
    }
    out
}

/// Everything a user's model file goes through before and during its first answer: open, load
/// (config, tokenizer, template, weights), the chat prompt, one forward pass of a few tokens.
/// Returns whether the model loaded (so a target can show it reached past the parser).
fn exercise_model(path: &Path) -> bool {
    let Ok(lm) = LoadedModel::load(path) else {
        return false;
    };
    let small = RenderBudget {
        fuel: 200_000,
        time_limit: std::time::Duration::from_secs(2),
        ..RenderBudget::default()
    };
    let template = lm.template.clone().with_budget(small);
    let conv = [ChatMessage::system("s"), ChatMessage::user("Hi there")];
    if let Ok(text) = template.render(&conv, true) {
        let _ = lm.tokenizer.encode(&text, true);
    }
    let Ok(ids) = lm.raw_prompt("Hello, world") else {
        return true;
    };
    let ids: Vec<u32> = ids.into_iter().take(8).collect();
    if ids.is_empty() || ids.iter().any(|&t| t as usize >= lm.model.cfg.vocab) {
        return true;
    }
    let _ = lm.tokenizer.decode(&ids, false);
    let pool = ThreadPool::new(1);
    let table: Vec<u32> = (0..ids.len().div_ceil(16) as u32).collect();
    let Ok(mut kv) = KvCache::new(&lm.model.cfg, 16, table.len()) else {
        return true;
    };
    let mut ws = Workspace::default();
    let mut b = Batch::default();
    b.push_seq(table, 0, &ids, true);
    let _ = lm.model.forward(&pool, &b, &mut kv, &mut ws);
    true
}

#[test]
fn gguf_files_and_model_load() {
    let d = TempDir::new("gguf");
    let seed = tiny_llama(&[]);
    // The header (metadata and tensor table) is where the counts are.
    let focus = seed.len().min(8 << 10);
    let path = d.0.join("case.gguf");
    let loaded = std::cell::Cell::new(0);
    fuzz(
        "gguf",
        400,
        &proptest::collection::vec(mutation(), 1..6),
        |muts| {
            let bytes = mutate(&seed, &muts, focus);
            std::fs::write(&path, &bytes).expect("write case");
            loaded.set(loaded.get() + usize::from(exercise_model(&path)));
            Ok(())
        },
    );
    eprintln!("gguf: {} mutated files loaded and ran", loaded.get());
    assert!(loaded.get() > 0, "no case got past the parser");
}

/// A two-part split of the tiny model with its split keys set from the case.
fn split_case(dir: &Path, no: [u64; 2], count: [u64; 2], tensors: [i64; 2]) -> PathBuf {
    let src_path = dir.join("src.gguf");
    std::fs::write(&src_path, tiny_llama(&[])).expect("write");
    let src = GgufFile::open(&src_path).expect("open tiny");
    split::write_split(&src, dir, "case", 2, |i| {
        vec![
            (KEY_NO.into(), Value::U64(no[i])),
            (KEY_COUNT.into(), Value::U64(count[i])),
            (KEY_TENSORS.into(), Value::I64(tensors[i])),
        ]
    })
}

#[test]
fn split_sets() {
    let d = TempDir::new("split");
    let small = || prop_oneof![0u64..4, hostile_u64()];
    let signed = || prop_oneof![-2i64..40, any::<i64>()];
    fuzz(
        "split",
        64,
        &([small(), small()], [small(), small()], [signed(), signed()]),
        |(no, count, tensors)| {
            let first = split_case(&d.0, no, count, tensors);
            let _ = exercise_model(&first);
            Ok(())
        },
    );
}

/// A safetensors file: 8-byte header length, the JSON header, the data.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Swaps JSON values at random paths for hostile ones (wrong types, huge or negative numbers,
/// long strings, deep nesting), keeping the rest of the document.
fn json_mutation() -> impl Strategy<Value = (usize, Json)> {
    let hostile = prop_oneof![
        Just(Json::Null),
        Just(Json::from(-1)),
        Just(Json::from(0)),
        Just(Json::from(u64::MAX)),
        Just(Json::from(1u64 << 40)),
        Just(Json::from(1e308)),
        Just(Json::from(-0.5)),
        Just(Json::from("")),
        Just(Json::from("x".repeat(10_000))),
        Just(Json::Bool(true)),
        Just(Json::Array(vec![Json::from(1); 1000])),
        Just((0..200).fold(Json::from(1), |v, _| Json::Array(vec![v]))),
        "[a-z_./\\\\]{0,12}".prop_map(Json::from),
        any::<i64>().prop_map(Json::from),
    ];
    (any::<usize>(), hostile)
}

/// Every node of `v`, depth first, as a mutable reference: replaces the `i % n`-th one.
fn replace_nth(v: &mut Json, i: usize, with: Json) {
    fn count(v: &Json) -> usize {
        1 + match v {
            Json::Array(a) => a.iter().map(count).sum(),
            Json::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Json, target: &mut usize, with: &mut Option<Json>) {
        if *target == 0 {
            if let Some(w) = with.take() {
                *v = w;
            }
            return;
        }
        *target -= 1;
        match v {
            Json::Array(a) => a.iter_mut().for_each(|x| walk(x, target, with)),
            Json::Object(o) => o.values_mut().for_each(|x| walk(x, target, with)),
            _ => {}
        }
    }
    let mut target = i % count(v);
    walk(v, &mut target, &mut Some(with));
}

#[test]
fn safetensors_headers() {
    let d = TempDir::new("st");
    let header: Json = serde_json::json!({
        "__metadata__": {"format": "pt"},
        "a.weight": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]},
        "b.weight": {"dtype": "F16", "shape": [8], "data_offsets": [128, 144]},
    });
    let data = vec![0u8; 144];
    let path = d.0.join("case.safetensors");
    fuzz(
        "safetensors",
        512,
        &(
            proptest::collection::vec(json_mutation(), 0..4),
            proptest::collection::vec(mutation(), 0..3),
        ),
        |(jm, bm)| {
            let mut h = header.clone();
            for (i, v) in jm {
                replace_nth(&mut h, i, v);
            }
            let bytes = safetensors_bytes(&h.to_string(), &data);
            std::fs::write(&path, mutate(&bytes, &bm, 256)).expect("write");
            if let Ok(f) = tpslab_engine::formats::safetensors::SafetensorsFile::open(&path) {
                // What the folder loader does next: look tensors up by name.
                let _ = (f.tensor("a.weight"), f.tensor("b.weight"));
            }
            Ok(())
        },
    );
}

#[test]
fn hugging_face_folders_config_and_tokenizer_json() {
    let d = TempDir::new("hf");
    let (config, tokenizer) = tiny_folder(&d.0.join("seed"));
    let dir = d.0.join("case");
    std::fs::create_dir_all(&dir).expect("dir");
    for entry in std::fs::read_dir(d.0.join("seed")).expect("seed") {
        let p = entry.expect("entry").path();
        std::fs::copy(&p, dir.join(p.file_name().expect("name"))).expect("copy");
    }
    let loaded = std::cell::Cell::new(0);
    fuzz(
        "hf_folder",
        128,
        &(
            proptest::collection::vec(json_mutation(), 0..3),
            proptest::collection::vec(json_mutation(), 0..3),
            prop_oneof![
                3 => Just(Vec::new()),
                1 => proptest::collection::vec(mutation(), 1..3),
            ],
        ),
        |(cm, tm, bytes)| {
            let (mut c, mut t) = (config.clone(), tokenizer.clone());
            for (i, v) in cm {
                replace_nth(&mut c, i, v);
            }
            for (i, v) in tm {
                replace_nth(&mut t, i, v);
            }
            let t = mutate(t.to_string().as_bytes(), &bytes, 1 << 12);
            std::fs::write(dir.join("config.json"), c.to_string()).expect("write");
            std::fs::write(dir.join("tokenizer.json"), t).expect("write");
            loaded.set(loaded.get() + usize::from(exercise_model(&dir)));
            Ok(())
        },
    );
    eprintln!("folders: {} mutated folders loaded and ran", loaded.get());
    assert!(loaded.get() > 0, "no case got past the parsers");
}

/// Template fragments: real syntax, put together at random (most do not compile; those that do
/// must render or fail within the budget).
fn template_source() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("{% for m in messages %}".to_string()),
        Just("{% endfor %}".to_string()),
        Just("{% if m.role == 'user' %}".to_string()),
        Just("{% else %}".to_string()),
        Just("{% endif %}".to_string()),
        Just("{{ m.content }}".to_string()),
        Just("{{ messages[0]['content'] | trim }}".to_string()),
        Just("{% for i in range(1000) %}".to_string()),
        Just("{% set ns = namespace(s='ab') %}".to_string()),
        Just("{% set ns.s = ns.s ~ ns.s %}".to_string()),
        Just("{{ ns.s | length }}".to_string()),
        Just("{% macro f(n) %}".to_string()),
        Just("{{ f(n + 1) }}".to_string()),
        Just("{% endmacro %}".to_string()),
        Just("{{ f(0) }}".to_string()),
        Just("{{ raise_exception('no') }}".to_string()),
        Just("{{ 'x' * 1000000 }}".to_string()),
        Just("{{ messages | tojson(indent=2) }}".to_string()),
        Just("{{ strftime_now('%d %B %Y') }}".to_string()),
        Just("{{ bos_token }}{{ eos_token }}".to_string()),
        Just("{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".to_string()),
        Just("{{ (messages | map(attribute='content') | list)[1:] | join(',') }}".to_string()),
        Just("{{ m.content.split(' ') | reverse | list }}".to_string()),
        "[ -~]{0,12}".prop_map(|s| s),
    ];
    proptest::collection::vec(piece, 1..12).prop_map(|v| v.concat())
}

#[test]
fn chat_template_rendering() {
    let budget = RenderBudget {
        fuel: 100_000,
        max_output: 1 << 20,
        time_limit: std::time::Duration::from_secs(3),
        max_memory: 128 << 20,
    };
    let conv = Arc::new(vec![
        ChatMessage::system("be brief"),
        ChatMessage::user("hi there"),
        ChatMessage::assistant("hello"),
        ChatMessage::user("why?"),
    ]);
    fuzz("template", 300, &template_source(), |source| {
        if let Ok(t) = ChatTemplate::new(&source, "<s>", "</s>") {
            let _ = t.with_budget(budget).render(&conv, true);
        }
        Ok(())
    });
}

/// A schema keyword set on the `i`-th object of a schema, with a value a client could send.
fn keyword_mutation() -> impl Strategy<Value = (usize, String, Json)> {
    let key = prop_oneof![
        Just("$ref"),
        Just("minimum"),
        Just("maximum"),
        Just("exclusiveMinimum"),
        Just("pattern"),
        Just("format"),
        Just("anyOf"),
        Just("allOf"),
        Just("oneOf"),
        Just("items"),
        Just("prefixItems"),
        Just("additionalProperties"),
        Just("minItems"),
        Just("maxItems"),
        Just("minLength"),
        Just("maxLength"),
        Just("multipleOf"),
        Just("enum"),
        Just("const"),
        Just("required"),
        Just("$defs"),
        Just("type"),
    ];
    let value = prop_oneof![
        "#(/[a-z$]{0,6}){0,4}".prop_map(Json::from),
        "[a-z(|)*+?.\\\\{},0-9\\[\\]^$-]{0,24}".prop_map(Json::from),
        Just(Json::from(1e30)),
        Just(Json::from(-1e300)),
        Just(Json::from(u64::MAX)),
        Just(Json::from(0.1)),
        Just(serde_json::json!([{"$ref": "#"}, {"type": "string"}])),
        Just(serde_json::json!({"$ref": "#"})),
        Just(serde_json::json!(["integer", "null"])),
        Just(serde_json::json!({"a": {"$ref": "#/$defs/a"}})),
    ];
    (any::<usize>(), key.prop_map(String::from), value)
}

/// Sets `key` to `value` on the `i % n`-th of `v`'s `n` objects (depth first).
fn set_on_nth_object(v: &mut Json, i: usize, key: String, value: Json) {
    fn objects(v: &Json) -> usize {
        match v {
            Json::Object(o) => 1 + o.values().map(objects).sum::<usize>(),
            Json::Array(a) => a.iter().map(objects).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Json, target: &mut usize, with: &mut Option<(String, Json)>) {
        match v {
            Json::Object(o) => {
                if *target == 0 {
                    if let Some((k, x)) = with.take() {
                        o.insert(k, x);
                    }
                    return;
                }
                *target -= 1;
                o.values_mut().for_each(|x| walk(x, target, with));
            }
            Json::Array(a) => a.iter_mut().for_each(|x| walk(x, target, with)),
            _ => {}
        }
    }
    let n = objects(v);
    if n > 0 {
        walk(v, &mut (i % n), &mut Some((key, value)));
    }
}

/// JSON schemas as clients send them (the 20 of `tests/data/schemas`, values swapped for
/// hostile ones and schema keywords set to what a client could write): each compiles or is
/// refused, without a panic, an abort or a hang.
#[test]
fn json_schemas() {
    let d = TempDir::new("schema");
    let p = d.0.join("tiny.gguf");
    std::fs::write(&p, tiny_llama(&[])).expect("write");
    let lm = LoadedModel::load(&p).expect("the tiny model loads");
    let c = compiler_for(&lm.tokenizer).expect("compiler");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/schemas");
    let mut corpus: Vec<Json> = std::fs::read_dir(&dir)
        .expect("schemas")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).expect("read")).expect("JSON"))
        .collect();
    corpus.sort_by_key(Json::to_string);
    let compiled = std::cell::Cell::new(0usize);
    fuzz(
        "json_schema",
        200,
        &(
            0..corpus.len(),
            proptest::collection::vec(json_mutation(), 0..3),
            proptest::collection::vec(keyword_mutation(), 0..4),
        ),
        |(i, values, keywords)| {
            let mut schema = corpus[i].clone();
            for (at, v) in values {
                replace_nth(&mut schema, at, v);
            }
            for (at, k, v) in keywords {
                set_on_nth_object(&mut schema, at, k, v);
            }
            let t = std::time::Instant::now();
            if c.compile(&Grammar::json_schema(schema)).is_ok() {
                compiled.set(compiled.get() + 1);
            }
            prop_assert!(t.elapsed() < std::time::Duration::from_secs(30));
            Ok(())
        },
    );
    eprintln!("json_schema: {} mutated schemas compiled", compiled.get());
    assert!(compiled.get() > 0, "no case got past the checks");
}

/// Cases the fuzzer found, kept so they stay fixed.
mod regressions {
    use super::*;

    /// The seed itself loads and answers: the targets above start from a working model.
    #[test]
    fn the_seeds_are_valid() {
        let d = TempDir::new("seeds");
        let p = d.0.join("tiny.gguf");
        std::fs::write(&p, tiny_llama(&[])).expect("write");
        let lm = LoadedModel::load(&p).expect("the tiny model loads");
        assert_eq!(lm.model.cfg.n_layers, 1);
        let ids = lm.raw_prompt("Hello").expect("prompt");
        assert!(!ids.is_empty());
        let f = GgufFile::open(&p).expect("open");
        assert!(f.tensors.iter().any(|t| t.ty == WType::F32));
        let (_, _) = tiny_folder(&d.0.join("folder"));
        let from_folder = LoadedModel::load(&d.0.join("folder")).expect("the tiny folder loads");
        assert_eq!(from_folder.model.cfg.n_layers, 1);
        let first = split_case(&d.0, [0, 1], [2, 2], [11, 11]);
        LoadedModel::load(&first).expect("the tiny split set loads");
    }

    /// Found by the folder target (seed 12345): `num_key_value_heads` of u64::MAX overflowed
    /// `2 * heads` in the RoPE row check before any bound on it (a panic in a debug build, a
    /// wrapped check in a release one).
    #[test]
    fn a_huge_key_value_head_count_is_refused() {
        let d = TempDir::new("kvheads");
        let (mut config, _) = tiny_folder(&d.0);
        for kv in [u64::MAX, u64::MAX / 2 + 1, 3] {
            config["num_key_value_heads"] = Json::from(kv);
            std::fs::write(d.0.join("config.json"), config.to_string()).expect("write");
            let e = LoadedModel::load(&d.0).expect_err("refused").to_string();
            assert!(e.contains("key/value heads"), "{kv}: {e}");
        }
    }
}
