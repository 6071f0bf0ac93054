//! Mixtures of experts on the CPU device, end to end through the model forward: the tiny random
//! `qwen3moe` and `mixtral` files of `model::tiny` load, and a sequence's logits are the same
//! bits alone as inside a batch of other sequences (prefill and decode mixed), so a token's
//! experts and output never depend on its batch mates. The step reports the share of expert
//! bytes it read. A hostile expert count is refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tpslab_engine::device::Workspace;
use tpslab_engine::formats::gguf::Value;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::Model;
use tpslab_engine::model::tiny::write_tiny;
use tpslab_kernels::ThreadPool;

const VOCAB: usize = 300;

/// A tokenizer of `VOCAB` placeholder tokens: the model forward needs only its size.
fn tokenizer() -> Vec<(String, Value)> {
    let tokens = (0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
    ]
}

fn tiny(variant: &str) -> (tempdir::Dir, Model) {
    let dir = tempdir::Dir::new(variant);
    let path = dir.0.join("m.gguf");
    write_tiny(variant, &tokenizer(), &path).unwrap();
    let (m, _) = Model::load(&path).unwrap_or_else(|e| panic!("{variant}: {e}"));
    (dir, m)
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("tpslab-moe-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) % VOCAB as u32)
        .collect()
}

/// Prefill then three decode steps of `seqs`, run together in one batch per step; returns each
/// sequence's logits rows (one per step) and the expert-byte share of every step.
fn run(model: &Model, seqs: &[Vec<u32>]) -> (Vec<Vec<Vec<f32>>>, Vec<f64>) {
    let pool = ThreadPool::new(2);
    let per = 4;
    let mut kv = KvCache::new(&model.cfg, 16, per * seqs.len()).unwrap();
    let mut ws = Workspace::default();
    let mut out = vec![Vec::new(); seqs.len()];
    let mut shares = Vec::new();
    let mut pos = vec![0; seqs.len()];
    let mut feed: Vec<Vec<u32>> = seqs.to_vec();
    for _ in 0..4 {
        let mut batch = Batch::default();
        for (s, f) in feed.iter().enumerate() {
            let table = (0..per as u32).map(|b| s as u32 * per as u32 + b).collect();
            batch.push_seq(table, pos[s], f, true);
        }
        let logits = model.forward(&pool, &batch, &mut kv, &mut ws).unwrap();
        for (s, row) in logits.chunks(model.cfg.vocab).enumerate() {
            out[s].push(row.to_vec());
            pos[s] += feed[s].len();
            let next = row
                .iter()
                .enumerate()
                .fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
            feed[s] = vec![next as u32];
        }
        shares.push(
            ws.experts
                .share()
                .expect("a mixture of experts reports its load"),
        );
    }
    (out, shares)
}

#[test]
fn a_sequence_computes_the_same_bits_alone_and_in_a_batch() {
    for variant in ["qwen3moe", "mixtral"] {
        let (_dir, model) = tiny(variant);
        let seqs = [prompt(1, 9), prompt(2, 3), prompt(3, 17), prompt(4, 1)];
        let (together, shares) = run(&model, &seqs);
        for (s, seq) in seqs.iter().enumerate() {
            let (alone, _) = run(&model, std::slice::from_ref(seq));
            assert!(
                alone[0] == together[s],
                "{variant}: sequence {s} differs in a batch"
            );
        }
        assert!(shares.iter().all(|&f| f > 0.0 && f <= 1.0), "{shares:?}");
        // A one-token decode of one sequence reads only its routed experts.
        let (_, one) = run(&model, &[prompt(5, 1)]);
        let m = model.cfg.extras.moe.unwrap();
        let want = m.router.n_used as f64 / m.n_expert as f64;
        assert!(
            (one[0] - want).abs() < 1e-9,
            "{variant}: {} vs {want}",
            one[0]
        );
    }
}

#[test]
fn a_hostile_expert_count_is_refused_by_name() {
    use tpslab_engine::formats::gguf_write::write_gguf;
    let (dir, _) = tiny("qwen3moe");
    let src = tpslab_engine::formats::gguf::GgufFile::open(dir.0.join("m.gguf")).unwrap();
    for (key, v, what) in [
        ("qwen3moe.expert_count", Value::U32(1 << 20), "expert_count"),
        (
            "qwen3moe.expert_used_count",
            Value::U32(9),
            "expert_used_count",
        ),
        (
            "qwen3moe.expert_used_count",
            Value::U32(0),
            "expert_used_count",
        ),
        ("qwen3moe.expert_count", Value::U32(0), "expert_count"),
    ] {
        let md: Vec<(String, Value)> = src
            .metadata
            .iter()
            .map(|(k, old)| (k.clone(), if k == key { v.clone() } else { old.clone() }))
            .collect();
        let path = dir.0.join("bad.gguf");
        let f = std::fs::File::create(&path).unwrap();
        // No tensors: the configuration must refuse before any is looked at.
        write_gguf(std::io::BufWriter::new(f), &md, &[]).unwrap();
        let err = Model::load(&path).err().expect("refused").to_string();
        assert!(err.contains(what), "{key} = {v:?}: {err}");
    }
}
