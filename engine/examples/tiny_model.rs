//! Writes a tiny random model of one architecture (`tpslab_engine::model::tiny`) with the
//! tokenizer of a vocabulary GGUF, for `tests/reference/make_arch_refs.py`; `--f32` writes
//! every weight F32 (the files the references are recorded on):
//!
//!   cargo run -p tpslab-engine --example tiny_model -- [--f32] ARCH VOCAB.gguf OUT.gguf
//!
//! `--list` prints one line per variant llama.cpp runs: its name, the llama.cpp vocabulary its
//! references are recorded with, and `moe` or `dense` (the script's two reference files).

use tpslab_engine::model::tiny;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--list") {
        for v in tiny::variants() {
            let Some(spec) = tiny::spec(v) else { continue };
            if let Some(vocab) = spec.reference_vocab {
                let kind = if spec.experts.is_some() {
                    "moe"
                } else {
                    "dense"
                };
                println!("{v} {vocab} {kind}");
            }
        }
        return Ok(());
    }
    let f32_only = args.first().is_some_and(|a| a == "--f32");
    if f32_only {
        args.remove(0);
    }
    let [arch, vocab, out] = args.as_slice() else {
        return Err("usage: tiny_model [--f32] ARCH VOCAB.gguf OUT.gguf".into());
    };
    let tokenizer = tiny::tokenizer_of(vocab.as_ref())?;
    if f32_only {
        tiny::write_tiny_f32(arch, &tokenizer, out.as_ref())?;
    } else {
        tiny::write_tiny(arch, &tokenizer, out.as_ref())?;
    }
    Ok(())
}
