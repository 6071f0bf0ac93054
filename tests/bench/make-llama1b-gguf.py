#!/usr/bin/env python3
"""A Llama-3.2-1B-shaped GGUF with random F16 weights, for timing the K-quant kernels against
llama.cpp on the shape users download (k a multiple of 256, which SmolLM2-135M's 576 is not).

Llama-3.2-1B's layers exactly (hidden 2048, 16 layers, 32 query and 8 KV heads of 64, FFN 8192,
RoPE base 500000, tied output), with the tokenizer of another GGUF (the default model's:
49152 tokens instead of 128256, so the embedding is smaller and the output head cheaper than
the real model's). Its text is noise; its speed is the shape's. Needs gguf-py (llama.cpp's
tree) with numpy and pyyaml:

    python3 tests/bench/make-llama1b-gguf.py --gguf-py LLAMA_SRC/gguf-py \\
        --tokenizer-from ~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf out.f16.gguf

then `tpslab quantize --type q4_k_m out.f16.gguf out.q4_k_m.gguf` (tests/bench/cpu-vs-llamacpp.sh
with MODEL=out.q4_k_m.gguf times it).
"""

import argparse
import sys

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 2048, 16, 32, 8, 64, 8192


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer.* keys to copy")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out")
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf
    import numpy as np

    src = gguf.GGUFReader(a.tokenizer_from)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("random Llama-3.2-1B shape")
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(500000.0)
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

    w.add_tensor("token_embd.weight", matrix(vocab, HIDDEN))
    w.add_tensor("output_norm.weight", ones(HIDDEN))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(HIDDEN))
        w.add_tensor(p + "attn_q.weight", matrix(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_k.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_v.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(p + "attn_output.weight", matrix(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", ones(HIDDEN))
        w.add_tensor(p + "ffn_gate.weight", matrix(FFN, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", matrix(FFN, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", matrix(HIDDEN, FFN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
