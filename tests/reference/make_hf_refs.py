#!/usr/bin/env python3
"""Records what llama.cpp's convert_hf_to_gguf.py writes for the tiny Hugging Face folder of
each family, for tests/parity/hf_families.rs (which needs neither llama.cpp nor Python).

The folders are written by the test's own code (`cargo test --workspace --test parity -- --ignored
write_folders_for_the_reference_script`), converted with `--outtype f32`, and for each the
`{arch}.*` metadata and every tensor (ggml dims, sha256 of its bytes; the values of
`rope_freqs`) are recorded.

The tokenizer is not what is compared (tests/parity/tokenizer_vocab.rs holds tokenizers against
llama.cpp): the folders carry a small byte-level BPE whose pre-tokenizer hash the converter
does not know, so every family's vocabulary is set through the converter's own GPT-2 path with
the pre-tokenizer named `gpt-2`.

Usage (needs torch, transformers and gguf; the llama.cpp tree of the pinned sdist):
  python3 tests/reference/make_hf_refs.py [LLAMA_CPP_DIR] > tests/data/hf_refs.json
"""
import hashlib, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLAMA = sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama-cpp-ref/llama.cpp"
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3", "granite"]

sys.path.insert(0, LLAMA)
sys.path.insert(0, os.path.join(LLAMA, "gguf-py"))
import convert_hf_to_gguf as conv  # noqa: E402
import gguf  # noqa: E402
from conversion.base import TextModel  # noqa: E402


def gpt2_vocab(self):
    self._set_vocab_gpt2()


TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"


def patch_vocab():
    from conversion import get_model_class
    for name in ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "SmolLM3ForCausalLM",
                 "GraniteForCausalLM"]:
        get_model_class(name).set_vocab = gpt2_vocab


def convert(folder, out):
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outtype", "f32", "--outfile", out]
    try:
        conv.main()
    finally:
        sys.argv = argv


def record(path):
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    md = {}
    for k, f in r.fields.items():
        if k.startswith(arch + "."):
            md[k] = f.contents()
    tensors = {}
    for t in r.tensors:
        data = bytes(t.data.tobytes())
        e = {"dims": [int(d) for d in t.shape], "type": t.tensor_type.name,
             "sha256": hashlib.sha256(data).hexdigest()}
        if t.name == "rope_freqs.weight":
            e["values"] = [float(x) for x in t.data.reshape(-1)]
        tensors[t.name] = e
    return {"arch": arch, "metadata": md, "tensors": tensors}


def main():
    patch_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TPSLAB_HF_FOLDERS=tmp)
        subprocess.run(["cargo", "test", "-j", "1", "-q", "--workspace", "--test", "parity", "--",
                        "--ignored", "write_folders_for_the_reference_script"],
                       cwd=ROOT, env=env, check=True, stdout=sys.stderr)
        refs = {"converter": "convert_hf_to_gguf.py of llama-cpp-python 0.3.36 sdist (vendored llama.cpp), --outtype f32",
                "families": {}}
        for fam in FAMILIES:
            out = os.path.join(tmp, fam + ".gguf")
            convert(os.path.join(tmp, fam), out)
            refs["families"][fam] = record(out)
            print(fam, "done", file=sys.stderr)
    json.dump(refs, sys.stdout, indent=1, sort_keys=True)
    print()


main()
