#!/usr/bin/env python3
"""Records llama-server's embeddings for tests/api/embeddings.rs and
tests/python/openai_embed_check.py (which need neither llama.cpp nor this script).

Models:
  - qwen3: the tiny random Qwen3 of tpslab_engine::model::tiny (F32, the qwen2 vocabulary of
    llama.cpp's models/ folder), the shape of Qwen3-Embedding, pooled `last` as that model is;
  - default: SmolLM2-135M-Instruct Q4_1 (the bundled model), pooled `mean`, as llama.cpp's
    `--pooling mean` pools a decoder model.
For each: the inputs' token ids (llama-server /tokenize with BOS and EOS where the model adds
them) and the vectors of /v1/embeddings (unit length, as llama-server returns them).

Usage (llama.cpp built by ../shared/reference/build-llamacpp.sh):
  python3 tests/reference/make_embed_refs.py [LLAMA_CPP_BIN] > tests/data/embed_refs.json
($TINY_MODEL: a built `tiny_model` example, else the script builds it.)
Fixtures: the llama.cpp models/ folder as tests/support/llamacpp.rs caches it
($TPSLAB_FIXTURES/models, default ~/.cache/tpslab/llama-cpp-0.3.36/models); the default model
at $TPSLAB_MODEL (default ~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""
import json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server import free_port, post, wait_healthy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama-cpp-ref/llama.cpp/build/bin"
FIX = os.path.join(os.environ.get("TPSLAB_FIXTURES", os.path.expanduser("~/.cache/tpslab/llama-cpp-0.3.36")), "models")
DEFAULT = os.environ.get("TPSLAB_MODEL", os.path.expanduser(
    "~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
INPUTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors.",
    "A",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
]


def embed(model, pooling):
    port = free_port()
    p = subprocess.Popen([f"{BIN}/llama-server", "-m", model, "--port", str(port), "-t", "2",
                          "-c", "512", "-np", "1", "--no-webui", "-fa", "off", "--embeddings",
                          "--pooling", pooling],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, LD_LIBRARY_PATH=BIN))
    try:
        wait_healthy(port)
        tokens = [post(port, "/tokenize", {"content": t, "add_special": True})["tokens"]
                  for t in INPUTS]
        out = post(port, "/v1/embeddings", {"input": INPUTS, "encoding_format": "float"})
        vectors = [d["embedding"] for d in sorted(out["data"], key=lambda d: d["index"])]
        return tokens, vectors
    finally:
        p.terminate()
        p.wait()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        # $TINY_MODEL names one already built (a running build would hold cargo's lock).
        tool = os.environ.get("TINY_MODEL")
        if not tool:
            subprocess.run(["cargo", "build", "-j", "1", "-q", "-p", "tpslab-engine", "--example",
                            "tiny_model"], cwd=ROOT, check=True)
            tool = os.path.join(ROOT, "target/debug/examples/tiny_model")
        tiny = os.path.join(tmp, "qwen3.gguf")
        subprocess.run([tool, "--f32", "qwen3", os.path.join(FIX, "ggml-vocab-qwen2.gguf"), tiny],
                       check=True)
        models = {}
        for name, path, pooling in [("qwen3", tiny, "last"), ("default", DEFAULT, "mean")]:
            tokens, vectors = embed(path, pooling)
            models[name] = {"pooling": pooling, "tokens": tokens,
                            "vectors": [[round(x, 7) for x in v] for v in vectors]}
    json.dump({"llama_cpp": "llama-cpp-python 0.3.36 sdist (vendored llama.cpp), CPU build",
               "inputs": INPUTS, "models": models},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
