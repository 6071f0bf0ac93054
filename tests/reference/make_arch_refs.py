#!/usr/bin/env python3
"""Records llama.cpp's outputs on the tiny random model of each architecture, for
tests/parity/arch_reference.rs (which needs neither llama.cpp nor Python).

For each variant of tpslab_engine::model::tiny (written by the `tiny_model` example with the
tokenizer of one of llama.cpp's ggml-vocab-*.gguf files) it records:
  - the prompt's token ids (llama-server /tokenize, with BOS as the model adds it);
  - 32 greedy tokens and, at each step, the top-5 log-probabilities of the raw logits
    (llama-server /completion, temperature 0, n_probs 5, post_sampling_probs false);
  - llama-perplexity over the bundled text at -c 128 (every window, as `tpslab perplexity`).

Usage (llama.cpp built by ../shared/reference/build-llamacpp.sh):
  python3 tests/reference/make_arch_refs.py [LLAMA_CPP_BIN] > tests/data/arch_refs.json
  python3 tests/reference/make_arch_refs.py --moe [LLAMA_CPP_BIN] > tests/data/moe_refs.json
(--moe: the mixture-of-experts variants, kept in their own file: qwen3moe, Mixtral-style llama
and gpt-oss, with attention sinks and biases; its experts are F32 here, as every weight of
these files, while the released files' MXFP4 is checked against gguf-py elsewhere.)
Fixtures: the llama.cpp models/ folder as tests/support/llamacpp.rs caches it
($TPSLAB_FIXTURES/models, default ~/.cache/tpslab/llama-cpp-0.3.36/models).
"""
import json, os, re, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_server import free_port, post, wait_healthy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOE = "--moe" in sys.argv[1:]
ARGS = [a for a in sys.argv[1:] if a != "--moe"]
BIN = ARGS[0] if ARGS else "/tmp/llama-cpp-ref/llama.cpp/build/bin"
FIX = os.path.join(os.environ.get("TPSLAB_FIXTURES", os.path.expanduser("~/.cache/tpslab/llama-cpp-0.3.36")), "models")
TEXT = os.path.join(ROOT, "assets/perplexity/pride-and-prejudice-ch1.txt")
PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
# ONLY=NAME records that variant alone (merge it into the committed file by hand).
ONLY = os.environ.get("ONLY")
CTX = 128
STEPS = 32
TOP = 5


def server_run(model):
    port = free_port()
    p = subprocess.Popen([f"{BIN}/llama-server", "-m", model, "--port", str(port), "-t", "2",
                          "-c", "512", "-np", "1", "--no-webui", "-fa", "off"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port)
        prompt = post(port, "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
        out = post(port, "/completion", {"prompt": prompt, "n_predict": STEPS, "temperature": 0,
                                          "n_probs": TOP, "cache_prompt": False,
                                          "post_sampling_probs": False, "ignore_eos": True})
        steps = []
        for s in out["completion_probabilities"]:
            steps.append({"id": s["id"],
                          "top": [[t["id"], t["logprob"]] for t in s["top_logprobs"]]})
        return prompt, steps
    finally:
        p.terminate()
        p.wait()


def perplexity(model):
    out = subprocess.run([f"{BIN}/llama-perplexity", "-m", model, "-f", TEXT, "-c", str(CTX),
                          "-t", "2", "-b", str(CTX), "-fa", "off"], capture_output=True, text=True, check=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    return float(m.group(1))


def main():
    # The dev profile (optimized for the engine, see Cargo.toml): the example only writes files.
    # $TINY_MODEL names one already built (a running build would hold cargo's lock).
    tool = os.environ.get("TINY_MODEL")
    if not tool:
        subprocess.run(["cargo", "build", "-j", "1", "-q", "-p", "tpslab-engine", "--example",
                        "tiny_model"], cwd=ROOT, check=True)
        tool = os.path.join(ROOT, "target/debug/examples/tiny_model")
    # Variant -> the llama.cpp vocabulary it is written with, as each family's tiny spec says
    # (`tiny_model --list`: the variants llama.cpp runs, dense or with experts).
    listed = subprocess.run([tool, "--list"], capture_output=True, text=True, check=True).stdout
    variants = {}
    for line in listed.splitlines():
        arch, vocab, kind = line.split()
        if (kind == "moe") == MOE:
            variants[arch] = vocab
    refs = {"llama_cpp": "llama-cpp-python 0.3.36 sdist (vendored llama.cpp), CPU build",
            "prompt": PROMPT, "ctx": CTX, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for arch, vocab in variants.items():
            if ONLY and arch != ONLY:
                continue
            model = os.path.join(tmp, f"{arch}.gguf")
            # Every weight F32 (gpt-oss's experts too): see tiny::write_tiny_f32.
            subprocess.run([tool, "--f32", arch, os.path.join(FIX, f"ggml-vocab-{vocab}.gguf"), model],
                           check=True)
            prompt, steps = server_run(model)
            refs["variants"][arch] = {"vocab": vocab, "prompt_ids": prompt, "steps": steps,
                                      "perplexity": perplexity(model)}
            print(arch, "done", file=sys.stderr)
    json.dump(refs, sys.stdout, indent=1)
    print()


main()
