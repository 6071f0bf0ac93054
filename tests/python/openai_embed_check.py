"""Drives `tpslab serve` serving an embedding model with the official OpenAI Python client and
holds its vectors against llama-server's (tests/data/embed_refs.json). Run by
tests/api/embeddings.rs:

    python openai_embed_check.py BASE_URL MODEL REFS_JSON REFS_MODEL

Prints one line per check and exits non-zero at the first failure.
"""

import base64
import json
import math
import struct
import sys

import openai
from openai import OpenAI

base, model, refs_path, which = sys.argv[1:5]
refs = json.load(open(refs_path))
inputs, ref = refs["inputs"], refs["models"][which]
client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok {name}", flush=True)


def cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# A batch, as the client sends it by default (base64, decoded by the client).
r = client.embeddings.create(model=model, input=inputs)
check("batch.count", len(r.data) == len(inputs), len(r.data))
check("batch.order", [d.index for d in r.data] == list(range(len(inputs))), r.data)
for i, (d, want) in enumerate(zip(r.data, ref["vectors"])):
    c = cos(d.embedding, want)
    check(f"batch[{i}].matches_llama_cpp", len(d.embedding) == len(want) and c >= 1 - 1e-4,
          f"cosine {c}")
    norm = math.sqrt(sum(x * x for x in d.embedding))
    check(f"batch[{i}].unit_length", abs(norm - 1) < 1e-4, norm)
tokens = sum(len(t) for t in ref["tokens"])
check("usage.prompt_tokens", r.usage.prompt_tokens == tokens, (r.usage, tokens))
check("usage.total_tokens", r.usage.total_tokens == tokens, r.usage)
check("model", r.model == model, r.model)

# One string as floats: the same vector as in the batch (the engine batches without changing
# what a row computes).
one = client.embeddings.create(model=model, input=inputs[0], encoding_format="float")
check("float.single", cos(one.data[0].embedding, r.data[0].embedding) >= 1 - 1e-6,
      cos(one.data[0].embedding, r.data[0].embedding))

# base64 on the wire: little-endian f32s.
raw = client.embeddings.with_raw_response.create(model=model, input=inputs[1],
                                                 encoding_format="base64")
b64 = json.loads(raw.text)["data"][0]["embedding"]
check("base64.is_string", isinstance(b64, str), type(b64))
floats = struct.unpack(f"<{len(base64.b64decode(b64)) // 4}f", base64.b64decode(b64))
check("base64.decodes", cos(floats, ref["vectors"][1]) >= 1 - 1e-4, cos(floats, ref["vectors"][1]))

# Token ids in, as llama-server tokenized the text: the same vector.
ids = client.embeddings.create(model=model, input=[ref["tokens"][3]], encoding_format="float")
check("token_ids", cos(ids.data[0].embedding, ref["vectors"][3]) >= 1 - 1e-4,
      cos(ids.data[0].embedding, ref["vectors"][3]))

# What is refused is a BadRequestError naming the parameter.
for name, kwargs in [("dimensions", {"input": "x", "dimensions": 7}),
                     ("input", {"input": []}),
                     ("encoding_format", {"input": "x", "encoding_format": "int8"})]:
    try:
        client.embeddings.create(model=model, **kwargs)
        check(f"400.{name}", False, "accepted")
    except openai.BadRequestError as e:
        check(f"400.{name}", e.body and e.body.get("param") == name, e.body)

print("all checks passed", flush=True)
