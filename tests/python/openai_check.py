"""Drives a running `tpslab serve` with the official OpenAI Python client, as an application
would, and checks what it gets back. Run by tests/api/openai_python.rs:

    python openai_check.py BASE_URL MODEL

Prints one line per check and exits non-zero at the first failure.
"""

import json
import math
import sys

import openai
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
# Not "What is the capital of France?": its greedy answer starts at a near-tie that llama.cpp
# answers "L'Étoile…"; this question llama.cpp and we both answer with Paris.
Q = [{"role": "user", "content": "Tell me the capital of France."}]


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok {name}", flush=True)


# Models: the id, and the extras vLLM's clients read.
models = client.models.list().data
check("models", any(m.id == model for m in models), [m.id for m in models])
extra = models[0].model_extra or {}
check("models.max_model_len", extra.get("max_model_len", 0) > 0, extra)
check("models.quantization", isinstance(extra.get("quantization"), str), extra)
# Retrieve: the model by its id; another name is the client's NotFoundError.
got = client.models.retrieve(model)
check("models.retrieve", got.id == model and got.object == "model", got)
try:
    client.models.retrieve("no-such-model")
    check("models.retrieve.missing", False, "no error")
except openai.NotFoundError as e:
    check("models.retrieve.missing", e.body and e.body.get("code") == "model_not_found", e.body)

# Whole and streamed agree (greedy), usage in the last chunk.
whole = client.chat.completions.create(model=model, messages=Q, temperature=0, max_tokens=12)
text = whole.choices[0].message.content
check("chat.whole", "Paris" in text, text)
stream = client.chat.completions.create(
    model=model, messages=Q, temperature=0, max_tokens=12, stream=True,
    stream_options={"include_usage": True})
parts, usage = [], None
for c in stream:
    if c.choices and c.choices[0].delta.content:
        parts.append(c.choices[0].delta.content)
    if c.usage:
        usage = c.usage
check("chat.stream", "".join(parts) == text, ("".join(parts), text))
check("chat.stream.usage", usage and usage.completion_tokens == whole.usage.completion_tokens, usage)

# Log-probabilities: one entry per token, alternatives in order, the greedy pick the top one.
r = client.chat.completions.create(
    model=model, messages=Q, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
check("chat.logprobs.count", len(content) == r.usage.completion_tokens, len(content))
for e in content:
    tops = [t.logprob for t in e.top_logprobs]
    check("chat.logprobs.top", len(tops) == 3 and tops == sorted(tops, reverse=True), tops)
    check("chat.logprobs.greedy", abs(e.logprob - tops[0]) < 1e-6, (e.logprob, tops))
    check("chat.logprobs.range", e.logprob <= 0 and math.isfinite(e.logprob), e.logprob)
    check("chat.logprobs.bytes", bytes(e.bytes).decode("utf-8", "replace") == e.token, e)
joined = "".join(bytes(b for e in content for b in e.bytes).decode("utf-8", "replace"))
check("chat.logprobs.text", joined.startswith(r.choices[0].message.content), joined)

# n choices, seeded.
r = client.chat.completions.create(
    model=model, messages=Q, temperature=1.0, seed=3, n=2, max_tokens=10)
check("chat.n", [c.index for c in r.choices] == [0, 1], r.choices)
again = client.chat.completions.create(
    model=model, messages=Q, temperature=1.0, seed=3, n=2, max_tokens=10)
check("chat.n.seeded", [c.message.content for c in r.choices]
      == [c.message.content for c in again.choices])

# Structured output: the JSON parses and keeps to the schema.
schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
          "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}, "required": ["city", "population"],
          "additionalProperties": False}
r = client.chat.completions.create(
    model=model, messages=Q, temperature=0, max_tokens=120,
    response_format={"type": "json_schema",
                     "json_schema": {"name": "city", "schema": schema, "strict": True}})
check("chat.json_schema.finish", r.choices[0].finish_reason == "stop", r.choices[0])
obj = json.loads(r.choices[0].message.content)
check("chat.json_schema", set(obj) == {"city", "population"}
      and isinstance(obj["population"], int), obj)

# Completions: echo, logprobs, logit_bias.
prompt = "The quick brown fox"
r = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, echo=True)
check("completions.echo", r.choices[0].text.startswith(prompt), r.choices[0].text)
r = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, logprobs=2)
lp = r.choices[0].logprobs
check("completions.logprobs", "".join(lp.tokens) == r.choices[0].text
      and len(lp.token_logprobs) == len(lp.tokens) and len(lp.text_offset) == len(lp.tokens), lp)
first = client.completions.create(
    model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=0,
    extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs.tokens[0]
banned = first.split(":")[1]
r = client.completions.create(
    model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=0,
    logit_bias={banned: -100}, extra_body={"return_tokens_as_token_ids": True})
check("completions.logit_bias", r.choices[0].logprobs.tokens[0] != first,
      (first, r.choices[0].logprobs.tokens))

# Tools: a named function and `required` are enforced, so even a small model's call parses;
# streamed, the deltas rebuild the same calls; the call and its result go back in.
INT = {"type": "integer", "minimum": -1000, "maximum": 1000}
ADD = {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": INT, "b": INT}, "required": ["a", "b"],
    "additionalProperties": False}}
TOOLS = [{"type": "function", "function": ADD}]
AQ = [{"role": "user", "content": "Add 2 and 3."}]


def int_args(text):
    args = json.loads(text)
    return set(args) == {"a", "b"} and all(type(v) is int for v in args.values())


# `required` with one call: a 135M model given parallel calls repeats its call until max_tokens.
for name, choice, parallel in [
        ("named", {"type": "function", "function": {"name": "add"}}, True),
        ("required", "required", False)]:
    kw = dict(model=model, messages=AQ, tools=TOOLS, tool_choice=choice, temperature=0,
              max_tokens=64, parallel_tool_calls=parallel)
    c = client.chat.completions.create(**kw).choices[0]
    calls = c.message.tool_calls or []
    check(f"tools.{name}.finish", c.finish_reason == "tool_calls", c)
    check(f"tools.{name}.call", len(calls) >= 1 and calls[0].type == "function"
          and calls[0].function.name == "add" and calls[0].id.startswith("call_"), calls)
    check(f"tools.{name}.arguments", int_args(calls[0].function.arguments), calls)
    got, finish = {}, None
    for ch in client.chat.completions.create(**kw, stream=True):
        if not ch.choices:
            continue
        for tc in ch.choices[0].delta.tool_calls or []:
            if tc.index not in got:
                got[tc.index] = [tc.id, tc.function.name, ""]
            got[tc.index][2] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    check(f"tools.{name}.stream", finish == "tool_calls" and all(g[0] for g in got.values())
          and [(g[1], g[2]) for g in got.values()]
          == [(x.function.name, x.function.arguments) for x in calls], (got, calls))
    if name == "named":
        follow = AQ + [c.message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": calls[0].id, "content": "5"}]
        r = client.chat.completions.create(model=model, messages=follow, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=8)
        check("tools.result", isinstance(r.choices[0].message.content, str)
              and r.usage.prompt_tokens > 0, r)

# The Responses API: whole as the chat answer, streamed deltas join to it, a function tool.
r = client.responses.create(model=model, input=Q[0]["content"], max_output_tokens=12,
                            temperature=0)
check("responses.whole", r.output_text == text and r.status in ("completed", "incomplete"),
      (r.output_text, text))
check("responses.usage", r.usage.input_tokens == whole.usage.prompt_tokens
      and r.usage.output_tokens == whole.usage.completion_tokens, r.usage)
deltas, final = [], None
for ev in client.responses.create(model=model, input=Q[0]["content"], max_output_tokens=12,
                                  temperature=0, stream=True):
    if ev.type == "response.output_text.delta":
        deltas.append(ev.delta)
    elif ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
check("responses.stream", final is not None and "".join(deltas) == r.output_text
      and final.output_text == r.output_text, (deltas, final))
r = client.responses.create(model=model, input=Q[0]["content"], max_output_tokens=12,
                            temperature=0, include=["message.output_text.logprobs"],
                            top_logprobs=2)
lps = r.output[0].content[0].logprobs or []
check("responses.logprobs", len(lps) == r.usage.output_tokens
      and all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in lps)
      and "".join(lp.token for lp in lps).startswith(r.output_text[:8]), lps)
fkw = dict(model=model, input="Add 2 and 3.", tools=[{"type": "function", **ADD}],
           tool_choice={"type": "function", "name": "add"}, max_output_tokens=64, temperature=0)
r = client.responses.create(**fkw)
calls = [o for o in r.output if o.type == "function_call"]
check("responses.function_call", len(calls) == 1 and calls[0].name == "add"
      and int_args(calls[0].arguments), r.output)
args = None
for ev in client.responses.create(**fkw, stream=True):
    if ev.type == "response.function_call_arguments.done":
        args = ev.arguments
check("responses.function_call.stream", args == calls[0].arguments, (args, calls))
for name, kwargs in [("previous_response_id", {"previous_response_id": "resp_123"}),
                     ("tools", {"tools": [{"type": "web_search"}]})]:
    try:
        client.responses.create(model=model, input="hi", max_output_tokens=4, **kwargs)
        check(f"responses.400.{name}", False, "accepted")
    except openai.BadRequestError as e:
        check(f"responses.400.{name}", e.body and e.body.get("param") == name, e.body)

# What cannot be honoured is a BadRequestError naming the parameter.
for name, kwargs in [
    ("n", {"n": 1000}),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}),
    ("messages[0].content[1]", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
]:
    args = {"model": model, "messages": Q, "max_tokens": 4, **kwargs}
    try:
        client.chat.completions.create(**args)
        check(f"400.{name}", False, "accepted")
    except openai.BadRequestError as e:
        check(f"400.{name}", e.body and e.body.get("param") == name, e.body)

print("all checks passed", flush=True)
