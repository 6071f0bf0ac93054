//! Writes a tiny random model of one architecture (`tpslab_engine::model::tiny`) with the
//! tokenizer of a vocabulary GGUF, for `tests/reference/make-arch-refs.sh`:
//!
//!   cargo run --release -p tpslab-engine --example tiny_model -- ARCH VOCAB.gguf OUT.gguf

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [arch, vocab, out] = args.as_slice() else {
        return Err("usage: tiny_model ARCH VOCAB.gguf OUT.gguf".into());
    };
    let tokenizer = tpslab_engine::model::tiny::tokenizer_of(vocab.as_ref())?;
    tpslab_engine::model::tiny::write_tiny(arch, &tokenizer, out.as_ref())?;
    Ok(())
}
