#!/usr/bin/env python3
"""Writes llama_quantize_types.json: the type llama.cpp's `llama-quantize` gives every tensor of
the default model (SmolLM2-135M-Instruct, Q4_1) for each preset, from its `--dry-run` listing,
for engine/tests/formats/quantize.rs to compare `tpslab quantize`'s per-tensor rules with.

    python3 engine/tests/data/make_llama_quantize_types.py [LLAMA_QUANTIZE] [MODEL]

Defaults: the llama.cpp build at /tmp/llama-cpp-ref/llama.cpp/build/bin and the model library's
default model. No importance matrix; `--allow-requantize` because the source is Q4_1.
"""

import json
import os
import re
import subprocess
import sys

PRESETS = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_M", "Q2_K", "IQ4_XS",
           "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "F16", "BF16"]
LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+),(.*)$")


def types_for(binary, model, preset):
    out = subprocess.run([binary, "--dry-run", "--allow-requantize", model, preset],
                         capture_output=True, text=True, check=True)
    types = {}
    for line in (out.stdout + out.stderr).splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, src, rest = m.groups()
        dst = re.search(r"\((\w+)\)\s*$", rest)
        types[name] = (dst.group(1) if dst and "->" in rest else src).upper()
    assert types, f"no tensor lines in llama-quantize's output for {preset}"
    return types


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama-cpp-ref/llama.cpp/build/bin/llama-quantize"
    model = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser(
        "~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ref = {p: types_for(binary, model, p) for p in PRESETS}
    names = sorted(ref["Q8_0"])
    # Compact: the tensor names once, then per preset their types in that order.
    out = {"model": os.path.basename(model), "tensors": names,
           "types": {p: " ".join(t[n] for n in names) for p, t in ref.items()}}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_quantize_types.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(ref)} presets x {len(names)} tensors")


if __name__ == "__main__":
    main()
