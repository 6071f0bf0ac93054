#!/usr/bin/env python3
"""Writes llama_quantize_digests.json: for a few presets, the SHA-256 (first 16 hex digits) of
every tensor llama.cpp's `llama-quantize` writes when re-quantizing the default model
(SmolLM2-135M-Instruct, Q4_1; no importance matrix), so engine/tests/formats/quantize.rs can check that
`tpslab quantize` writes the same bytes, tensor by tensor.

    python3 engine/tests/data/make_llama_quantize_digests.py [LLAMA_QUANTIZE] [MODEL]
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile

from gguf import GGUFReader

PRESETS = ["Q8_0", "Q4_K_M", "Q5_K_S", "IQ4_XS", "Q3_K_M", "Q2_K"]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama-cpp-ref/llama.cpp/build/bin/llama-quantize"
    model = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser(
        "~/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    digests = {}
    with tempfile.TemporaryDirectory() as d:
        for p in PRESETS:
            path = os.path.join(d, f"{p}.gguf")
            subprocess.run([binary, "--allow-requantize", model, path, p, "2"],
                           capture_output=True, check=True)
            r = GGUFReader(path)
            digests[p] = {t.name: hashlib.sha256(t.data.tobytes()).hexdigest()[:16]
                          for t in r.tensors}
            os.remove(path)
    # Compact: the tensor names once, then per preset their digests in that order.
    names = sorted(digests[PRESETS[0]])
    out = {"model": os.path.basename(model), "tensors": names,
           "digests": {p: " ".join(d[n] for n in names) for p, d in digests.items()}}
    dst = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_quantize_digests.json")
    with open(dst, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
