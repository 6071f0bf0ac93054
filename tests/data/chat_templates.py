#!/usr/bin/env python3
"""Writes tests/data/chat_templates.json: what jinja2 renders, set up as Hugging Face transformers
sets it up, for the real chat templates of llama.cpp's models/templates/ and a set of
conversations. tests/parity/chat_templates.rs holds TPS Lab's renders against it (no Python there).

The setup is transformers' `_compile_jinja_template` and `render_jinja_template`
(src/transformers/utils/chat_template_utils.py): jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension; `raise_exception` raising
TemplateError; `tojson` = json.dumps(x, ensure_ascii=False, indent=None, separators=None,
sort_keys=False); `strftime_now(format)` = datetime.now().strftime(format), here on a pinned
moment; rendered with messages, tools, documents, add_generation_prompt, the special tokens, and
`enable_thinking` only when a case passes it (a keyword argument of apply_chat_template).

One step is llama.cpp's, not transformers': a conversation that opens with a system message,
given to a template that does not read one, has it folded into the next message first
(common/chat.cpp `system_message_not_supported`, decided by the probe of common/jinja/caps.cpp:
render [system, user] with tools=[] and see whether messages[0].content was read). The folded
conversation is then rendered by jinja2 as above.

Usage: python3 tests/data/chat_templates.py [LLAMA_CPP_MODELS_DIR]
(default: $TPSLAB_FIXTURES/models or ~/.cache/tpslab/llama-cpp-0.3.36/models, the folder
tests/support/llamacpp.rs fetches). Needs jinja2 (pip install jinja2; written with 3.1.6).
"""

import datetime
import hashlib
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Wednesday 2026-03-04 14:30:00, UTC (the Rust side pins the same Unix time).
NOW = datetime.datetime(2026, 3, 4, 14, 30, 0, tzinfo=datetime.timezone.utc)

# Template name -> (bos_token, eos_token), as each model's tokenizer_config.json gives them.
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "HuggingFaceTB-SmolLM3-3B": ("", "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
]


def msg(role, content, **extra):
    m = {"role": role, "content": content}
    m.update(extra)
    return m


def call(arguments):
    # Mistral's template wants 9-character alphanumeric ids.
    return {
        "id": "call12345",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


SYSTEM_MULTI = [
    msg("system", "You are terse."),
    msg("user", "Hi"),
    msg("assistant", "Hello! How can I help?"),
    msg("user", "Tell me a joke."),
]
WEATHER_Q = msg("user", "What is the weather in Paris?")
TOOL_ANSWER = msg("tool", '{"temperature": 18}', tool_call_id="call12345", name="get_weather")

# name -> (messages, options)
CASES = {
    "user_only": ([msg("user", "What is the capital of France?")], {"add_generation_prompt": True}),
    "user_only_no_prompt": ([msg("user", "What is the capital of France?")], {}),
    "system_multi": (SYSTEM_MULTI, {"add_generation_prompt": True}),
    "system_multi_no_prompt": (SYSTEM_MULTI, {"add_generation_prompt": False}),
    "system_only": ([msg("system", "Be brief.")], {"add_generation_prompt": True}),
    "multi_no_system": (SYSTEM_MULTI[1:], {"add_generation_prompt": True}),
    "unicode_whitespace": (
        [
            msg("user", "  Héllo 🦀 日本語\nline two\n  "),
            msg("assistant", '  spaced "quoted" \\ back  '),
            msg("user", "ok"),
        ],
        {"add_generation_prompt": True},
    ),
    "tools_offered": (
        [msg("system", "You can call tools."), WEATHER_Q],
        {"add_generation_prompt": True, "tools": TOOLS},
    ),
    "tool_call_object_args": (
        [
            WEATHER_Q,
            msg("assistant", None, tool_calls=[call({"location": "Paris", "unit": "celsius"})]),
            TOOL_ANSWER,
        ],
        {"add_generation_prompt": True, "tools": TOOLS},
    ),
    "tool_call_string_args": (
        [
            WEATHER_Q,
            msg("assistant", None, tool_calls=[call('{"location": "Paris", "unit": "celsius"}')]),
            TOOL_ANSWER,
        ],
        {"add_generation_prompt": True, "tools": TOOLS},
    ),
    "tool_call_answered": (
        [
            msg("system", "You can call tools."),
            WEATHER_Q,
            msg("assistant", "", tool_calls=[call({"location": "Paris"})]),
            TOOL_ANSWER,
            msg("assistant", "It is 18 °C in Paris."),
            msg("user", "Thanks!"),
        ],
        {"add_generation_prompt": True, "tools": TOOLS},
    ),
    "thinking_on": ([msg("user", "What is 2+2?")], {"add_generation_prompt": True, "enable_thinking": True}),
    "thinking_off": ([msg("user", "What is 2+2?")], {"add_generation_prompt": True, "enable_thinking": False}),
    "thinking_off_system": (
        [msg("system", "Answer in one word."), msg("user", "What is 2+2?")],
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
    "reasoning_history": (
        [
            msg("user", "What is 2+2?"),
            msg("assistant", "4", reasoning_content="Two and two make four."),
            msg("user", "And 3+3?"),
        ],
        {"add_generation_prompt": True},
    ),
    "think_in_content": (
        [
            msg("user", "What is 2+2?"),
            msg("assistant", "<think>\nTwo and two.\n</think>\n\nThe answer is 4."),
            msg("user", "And 3+3?"),
        ],
        {"add_generation_prompt": True, "enable_thinking": True},
    ),
    "documents": (
        [msg("user", "Summarize the document.")],
        {"add_generation_prompt": True, "documents": [{"title": "Note", "text": "Paris is in France."}]},
    ),
}


def environment():
    """transformers' `_compile_jinja_template`, with the pinned clock."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class Tracked(dict):
    """A message that notes when its content is read (llama.cpp's `stats.used`)."""

    read = False

    def __getitem__(self, key):
        if key == "content":
            Tracked.read = True
        return super().__getitem__(key)


def reads_system_message(template):
    """llama.cpp's `supports_system_role` probe (common/jinja/caps.cpp)."""
    Tracked.read = False
    probe = [Tracked(role="system", content="System message"), {"role": "user", "content": "User message"}]
    try:
        template.render(messages=probe, tools=[], documents=None, add_generation_prompt=True, bos_token="", eos_token="")
    except Exception:  # noqa: BLE001 - llama.cpp ignores the probe's failures too
        pass
    return Tracked.read


def fold_system(messages):
    """llama.cpp's `system_message_not_supported` (common/chat.cpp)."""
    if not messages or messages[0]["role"] != "system":
        return messages
    if len(messages) == 1:
        return []
    second = dict(messages[1])
    second["content"] = (messages[0]["content"] or "") + "\n" + (second["content"] or "")
    return [second] + messages[2:]


def render(template, bos, eos, messages, opts):
    if messages and messages[0]["role"] == "system" and not reads_system_message(template):
        messages = fold_system(messages)
    kwargs = {"bos_token": bos, "eos_token": eos}
    if "enable_thinking" in opts:
        kwargs["enable_thinking"] = opts["enable_thinking"]
    try:
        return {
            "text": template.render(
                messages=json.loads(json.dumps(messages)),
                tools=opts.get("tools"),
                documents=opts.get("documents"),
                add_generation_prompt=opts.get("add_generation_prompt", False),
                **kwargs,
            )
        }
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises the base class; its subclasses are the template's own faults.
        if type(e) is jinja2.exceptions.TemplateError:
            return {"rejected": str(e)}
        return {"failed": f"{type(e).__name__}: {e}"}
    except Exception as e:  # noqa: BLE001 - a Python error inside the template (str + dict)
        return {"failed": f"{type(e).__name__}: {e}"}


def main():
    default = os.path.join(
        os.environ.get("TPSLAB_FIXTURES", os.path.expanduser("~/.cache/tpslab/llama-cpp-0.3.36")), "models"
    )
    models = sys.argv[1] if len(sys.argv) > 1 else default
    env = environment()
    out = {
        "generator": "tests/data/chat_templates.py",
        "jinja2": jinja2.__version__,
        "now_unix": int(NOW.timestamp()),
        "cases": {name: {"messages": m, "options": o} for name, (m, o) in CASES.items()},
        "templates": {},
    }
    for name, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(models, "templates", name + ".jinja"), encoding="utf-8", newline="") as f:
            source = f.read()
        template = env.from_string(source)
        out["templates"][name] = {
            "sha256": hashlib.sha256(source.encode()).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "reads_system_message": reads_system_message(template),
            "renders": {case: render(template, bos, eos, m, o) for case, (m, o) in CASES.items()},
        }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
