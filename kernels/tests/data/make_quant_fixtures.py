#!/usr/bin/env python3
"""Writes gguf_py_quants.bin: gguf-py's reference (de)quantization (`gguf.quants`) of small
inputs, for kernels/tests/reference.rs to compare with bit for bit.

For every weight type the kernels know: random but valid blocks (every byte random, the f16
scale fields replaced by random finite values of either sign) and the f32 values
`gguf.quants.dequantize` gives for them. For the types gguf-py can quantize (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, BF16, MXFP4): random f32 rows and the bytes `gguf.quants.quantize` writes for them.
MXFP4 (gpt-oss's experts; gguf >= 0.17) comes last, from its own generator, so the records
before it keep their bytes: its blocks' e8m0 exponent bytes are drawn from 100..150 (the whole
byte range overflows f32: 12 * 2^127).

Regenerate with gguf-py installed (`pip install 'gguf>=0.17'`, or llama.cpp's gguf-py):
    python3 kernels/tests/data/make_quant_fixtures.py

File format (little endian), a sequence of records: u16 name length, name (ASCII), u32 byte
count, bytes. Names: `deq/TYPE/blocks`, `deq/TYPE/values` (f32), `q/TYPE/input` (f32),
`q/TYPE/bytes`.
"""

import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# Byte offsets of each block's f16 fields, and block geometry, per type (ggml-common.h).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_XS": [0],
}
# MXFP4 is written last, by `mxfp4`.
TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q5_0", "Q5_1",
         "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]
QUANTIZABLE = ["BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
ELEMENTS = 1024


def random_f16(rng, n):
    """Finite f16 values of either sign, magnitudes from 2^-14 to about 2."""
    mag = np.exp2(rng.uniform(-14, 1, n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def random_blocks(rng, name):
    qt = T[name]
    block, size = quants.GGML_QUANT_SIZES[qt]
    n_blocks = ELEMENTS // block
    if name == "F16":
        return random_f16(rng, ELEMENTS).view(np.uint8)
    if name == "BF16":
        # The high halves of finite f32 values.
        f = (rng.standard_normal(ELEMENTS) * np.exp2(rng.uniform(-20, 4, ELEMENTS))).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        b[:, off:off + 2] = random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return b.reshape(-1)


def record(out, name, data):
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    out.write(struct.pack("<H", len(name)) + name.encode() + struct.pack("<I", len(raw)) + raw)


def main():
    rng = np.random.default_rng(16)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_py_quants.bin")
    with open(path, "wb") as out:
        for name in TYPES:
            blocks = random_blocks(rng, name)
            values = quants.dequantize(blocks, T[name]).astype(np.float32)
            assert values.size == ELEMENTS and np.isfinite(values).all(), name
            record(out, f"deq/{name}/blocks", blocks)
            record(out, f"deq/{name}/values", values)
        for name in QUANTIZABLE:
            # Rows of 256 with a spread of magnitudes, an outlier, a zero block and a constant
            # block.
            x = (rng.standard_normal(ELEMENTS) * 0.05).astype(np.float32)
            x[7] = 0.9
            x[64:96] = 0.0
            x[96:128] = 0.25
            x[128:160] *= 1e-4
            q = quants.quantize(x.reshape(-1, 256), T[name])
            record(out, f"q/{name}/input", x)
            record(out, f"q/{name}/bytes", q.reshape(-1))
        mxfp4(out)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def mxfp4(out):
    """MXFP4's records: random blocks with exponents in 100..150, and rows of 256 with the
    quantize cases above plus values on and between the grid's levels (ties go to the first
    index) and a block whose largest magnitude is a power of two."""
    rng = np.random.default_rng(39)
    n_blocks = ELEMENTS // 32
    b = rng.integers(0, 256, (n_blocks, 17), dtype=np.uint8)
    b[:, 0] = rng.integers(100, 150, n_blocks, dtype=np.uint8)
    blocks = b.reshape(-1)
    values = quants.dequantize(blocks, T.MXFP4).astype(np.float32)
    assert values.size == ELEMENTS and np.isfinite(values).all()
    record(out, "deq/MXFP4/blocks", blocks)
    record(out, "deq/MXFP4/values", values)
    x = (rng.standard_normal(ELEMENTS) * 0.05).astype(np.float32)
    x[7] = 0.9
    x[64:96] = 0.0
    x[96:128] = 0.25
    x[128:160] *= 1e-4
    # Levels of the grid at scale 2^-4 (amax 1.0 -> e = 125, d = 2^-3 / 2) and the midpoints
    # between them.
    x[160:192] = np.array([0, 0.25, 0.5, 0.75, 1.0, -1.0, 0.125, 0.375, 0.625, -0.625, 0.875,
                           -0.875, 0.0625, -0.0625, 0.1875, -0.1875] * 2, dtype=np.float32)
    x[192:224] *= 64.0
    q = quants.quantize(x.reshape(-1, 256), T.MXFP4)
    record(out, "q/MXFP4/input", x)
    record(out, "q/MXFP4/bytes", q.reshape(-1))


if __name__ == "__main__":
    main()
