#!/usr/bin/env python3
"""A Llama-3.2-1B-shaped GGUF (or, with `--shape smollm2-360m`, SmolLM2-360M's: width 960) with
random F16 weights, for timing the kernels against llama.cpp on the shapes users download.

Llama-3.2-1B's layers exactly (hidden 2048, 16 layers, 32 query and 8 KV heads of 64, FFN 8192,
RoPE base 500000, tied output), with the tokenizer of another GGUF (the default model's:
49152 tokens instead of 128256, so the embedding is smaller and the output head cheaper than
the real model's). Its text is noise; its speed is the shape's. Needs gguf-py (llama.cpp's
tree) with numpy and pyyaml:

    python3 tests/bench/make-llama1b-gguf.py --gguf-py LLAMA_SRC/gguf-py \\
        --tokenizer-from ~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf out.f16.gguf

then `llama-quantize out.f16.gguf out.q4_k_m.gguf Q4_K_M` (the files of record: llama.cpp's own
presets, per tensor fallbacks included), or `tpslab quantize --type q4_k_m`;
tests/bench/cpu-vs-llamacpp.sh with MODEL=out.q4_k_m.gguf times it.
"""

import argparse
import sys

# (hidden, layers, query heads, KV heads, head dim, FFN, RoPE base) of each shape.
SHAPES = {
    "llama-3.2-1b": (2048, 16, 32, 8, 64, 8192, 500000.0),
    # Width 960, not a multiple of 256: llama-quantize's K-quant presets fall back to Q5_0 /
    # Q8_0 / IQ4_NL on most of its tensors, as on Qwen2.5-0.5B or Gemma 3 270M.
    "smollm2-360m": (960, 32, 15, 5, 64, 2560, 100000.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer.* keys to copy")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--layers", type=int, help="fewer layers than the shape's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out")
    a = ap.parse_args()
    hidden, layers, heads, kv_heads, head_dim, ffn, rope_base = SHAPES[a.shape]
    layers = a.layers or layers
    sys.path.insert(0, a.gguf_py)
    import gguf
    import numpy as np

    src = gguf.GGUFReader(a.tokenizer_from)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random {a.shape} shape")
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = None
    for field in src.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "tokenizer.ggml.tokens":
            vocab = len(value)
        w.add_key_value(field.name, value, kind, sub_type=sub)
    if vocab is None:
        sys.exit(f"{a.tokenizer_from}: no tokenizer.ggml.tokens")

    rng = np.random.default_rng(a.seed)

    def matrix(n_out: int, n_in: int) -> "np.ndarray":
        # Rows of n_in (GGUF's dim 0), scaled like a trained model's weights.
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> "np.ndarray":
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", matrix(vocab, hidden))
    w.add_tensor("output_norm.weight", ones(hidden))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(hidden))
        w.add_tensor(p + "attn_q.weight", matrix(heads * head_dim, hidden))
        w.add_tensor(p + "attn_k.weight", matrix(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_v.weight", matrix(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_output.weight", matrix(hidden, heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", ones(hidden))
        w.add_tensor(p + "ffn_gate.weight", matrix(ffn, hidden))
        w.add_tensor(p + "ffn_up.weight", matrix(ffn, hidden))
        w.add_tensor(p + "ffn_down.weight", matrix(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
