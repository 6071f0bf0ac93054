#!/usr/bin/env python3
"""Reference data for tests/parity/tokenizer_vocab.rs: llama.cpp's llama-tokenize over each of its
fixture vocabularies that TPS Lab claims, for prompts with special tokens and BOS (as
llama-server tokenizes a rendered chat prompt: BOS/EOS as the model says, special tokens
parsed) and without (no BOS, no special parsing), plus its end-of-generation set.

Usage: make_llamacpp_prompts.py LLAMA_BIN_DIR MODELS_DIR > llamacpp_prompts.json
(LLAMA_BIN_DIR: a llama.cpp build's bin/, e.g. /tmp/llama-cpp-ref/llama.cpp/build/bin;
MODELS_DIR: the models/ folder of the same tree, ggml-vocab-*.gguf). Needs only the standard
library; the test reads the JSON and needs neither llama.cpp nor Python.
"""
import ast
import json
import re
import subprocess
import sys

VOCABS = [
    "aquila", "baichuan", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
    "gpt-neox", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact",
    "starcoder",
]

TEXTS = [
    "Hello world",
    " Hello world",
    "<s>[INST] What is 2+2? [/INST]",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|user|>\nHi there <|end|>\n<|assistant|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>",
    "<｜begin▁of▁sentence｜>User: 你好 <｜end▁of▁sentence｜>",
    "<|endoftext|> after  </s> and <unk>",
    "\n\n\tindented    code():\n        return 42\n",
    "naïve café — 日本語 🦀 1234567 it's we're",
    "<0x41> ▁word ▁▁",
]


def tokenize(binary, model, text, prompt):
    args = [binary, "-m", model, "--ids", "--no-escape", "--log-disable", "-p", text]
    if not prompt:
        args += ["--no-bos", "--no-parse-special"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


def eog(binary, model):
    args = [binary, "-m", model, "--ids", "-v", "-p", "x"]
    log = subprocess.run(args, capture_output=True, text=True, timeout=120).stderr
    return sorted({int(m) for m in re.findall(r"EOG token\s+=\s+(\d+)", log)})


def main():
    bin_dir, models = sys.argv[1], sys.argv[2]
    binary = f"{bin_dir}/llama-tokenize"
    out = {}
    for name in VOCABS:
        model = f"{models}/ggml-vocab-{name}.gguf"
        cases = [
            {"text": t, "prompt": tokenize(binary, model, t, True),
             "plain": tokenize(binary, model, t, False)}
            for t in TEXTS
        ]
        out[name] = {"eog": eog(binary, model), "cases": cases}
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
