//! Chat template rendering against Hugging Face's reference renderer.
//!
//! The expected strings below were produced by Python jinja2 3.1.6 set up exactly as
//! transformers' `render_jinja_template` does:
//! `jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//! extensions=[jinja2.ext.loopcontrols])`, a `raise_exception` global raising TemplateError,
//! `tojson` = `json.dumps(x, ensure_ascii=False, indent=indent, ...)`, rendered with
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools=None`, `documents=None`.
//! The SmolLM template was read from the model file with `gguf.GGUFReader`
//! (`tokenizer.chat_template`); the other two are written here to exercise `.strip()`,
//! `.startswith()`, `trim`, `raise_exception`, `loop.first`/`loop.last`/`loop.index0`,
//! `namespace`, filtered loops, negative indexing, slicing, `tojson` (with and without indent)
//! and block whitespace control.

use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::text::chat::{ChatError, ChatMessage, ChatTemplate};
use tpslab_engine::text::tokenizer::Tokenizer;

fn conversation(name: &str) -> Vec<ChatMessage> {
    match name {
        "user_only" => vec![ChatMessage::user("What is the capital of France?")],
        "with_system" => vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("Hello!"),
            ChatMessage::user("Bye"),
        ],
        "unicode" => vec![
            ChatMessage::user("Héllo 🦀 日本語\nline two\n"),
            ChatMessage::assistant("  spaced \"quoted\" \\ back  "),
        ],
        other => panic!("unknown conversation {other}"),
    }
}

fn check(template: &ChatTemplate, expected: &[(&str, bool, &str)]) {
    for &(conv, gen_prompt, want) in expected {
        let got = template
            .render(&conversation(conv), gen_prompt)
            .expect("render");
        assert_eq!(
            got, want,
            "conversation {conv}, add_generation_prompt {gen_prompt}"
        );
    }
}

fn smollm() -> (GgufFile, Tokenizer) {
    let path =
        tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model");
    let gguf = GgufFile::open(path).expect("open model");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    (gguf, tok)
}

#[test]
fn smollm_template_matches_transformers() {
    let (gguf, tok) = smollm();
    let template = ChatTemplate::from_gguf(&gguf, &tok).expect("template");
    assert!(
        template
            .source()
            .contains("You are a helpful AI assistant named SmolLM")
    );
    check(&template, EXPECTED_SMOL);
}

#[test]
fn rendered_prompt_tokenizes_like_llama_cpp() {
    // The llama.cpp reference ChatML prompt (refs/llamacpp_greedy.json) is exactly what the
    // model's template renders for this question.
    let (gguf, tok) = smollm();
    let template = ChatTemplate::from_gguf(&gguf, &tok).expect("template");
    let text = template
        .render(&conversation("user_only"), true)
        .expect("render");
    let ids = tok.encode(&text, true).expect("encode");
    let llama_cpp: [u32; 37] = [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
        520, 9531, 198,
    ];
    assert_eq!(ids, llama_cpp);
}

#[test]
fn llama3_style_template_matches_jinja2() {
    let t = ChatTemplate::new(LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>").expect("compile");
    check(&t, EXPECTED_LLAMA3);
}

#[test]
fn block_template_matches_jinja2() {
    let t = ChatTemplate::new(BLOCKS_TEMPLATE, "<s>", "</s>").expect("compile");
    check(&t, EXPECTED_BLOCKS);
}

#[test]
fn raise_exception_rejects_with_the_templates_message() {
    let t = ChatTemplate::new(LLAMA3_TEMPLATE, "", "").expect("compile");
    let bad = [ChatMessage::user("a"), ChatMessage::user("b")];
    match t.render(&bad, true) {
        // jinja2: "Conversation roles must alternate user/assistant/user/assistant/..."
        Err(ChatError::Rejected(msg)) => {
            assert_eq!(
                msg,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            )
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let unknown = [ChatMessage::new("tool", "x")];
    let t = ChatTemplate::new(BLOCKS_TEMPLATE, "", "").expect("compile");
    match t.render(&unknown, false) {
        Err(ChatError::Rejected(msg)) => assert_eq!(msg, "Unknown role: tool"),
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[test]
fn broken_templates_are_errors_not_panics() {
    match ChatTemplate::new("{% for m in messages %}", "", "") {
        Err(ChatError::Syntax(_)) => {}
        other => panic!("expected Syntax, got {other:?}"),
    }
    let t = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}", "", "").expect("compile");
    match t.render(&[ChatMessage::user("x")], false) {
        Err(ChatError::Render(_)) => {}
        other => panic!("expected Render, got {other:?}"),
    }
}

#[test]
fn no_template_falls_back_to_chatml() {
    let t = ChatTemplate::chatml();
    let got = t
        .render(&conversation("with_system"), true)
        .expect("render");
    // Same as the SmolLM template when a system message is given.
    assert_eq!(got, EXPECTED_SMOL[2].2);
}

#[test]
fn messages_deserialize_from_openai_json() {
    let msgs: Vec<ChatMessage> =
        serde_json::from_str(r#"[{"role":"user","content":"hi"}]"#).expect("json");
    assert_eq!(msgs, vec![ChatMessage::user("hi")]);
}

/// `smol` template: (conversation, add_generation_prompt, expected jinja2 output).
const EXPECTED_SMOL: &[(&str, bool, &str)] = &[
    (
        "user_only",
        true,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "user_only",
        false,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    ),
    (
        "with_system",
        true,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "with_system",
        false,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n",
    ),
    (
        "unicode",
        true,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHéllo 🦀 日本語\nline two\n<|im_end|>\n<|im_start|>assistant\n  spaced \"quoted\" \\ back  <|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "unicode",
        false,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHéllo 🦀 日本語\nline two\n<|im_end|>\n<|im_start|>assistant\n  spaced \"quoted\" \\ back  <|im_end|>\n",
    ),
];

/// `llama3` template: (conversation, add_generation_prompt, expected jinja2 output).
const EXPECTED_LLAMA3: &[(&str, bool, &str)] = &[
    (
        "user_only",
        true,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    (
        "user_only",
        false,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>",
    ),
    (
        "with_system",
        true,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    (
        "with_system",
        false,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>",
    ),
    (
        "unicode",
        true,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHéllo 🦀 日本語\nline two<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nspaced \"quoted\" \\ back<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    (
        "unicode",
        false,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHéllo 🦀 日本語\nline two<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nspaced \"quoted\" \\ back<|eot_id|>",
    ),
];

/// `blocks` template: (conversation, add_generation_prompt, expected jinja2 output).
const EXPECTED_BLOCKS: &[(&str, bool, &str)] = &[
    (
        "user_only",
        true,
        "<s>\n[INST] What is the capital of France? [/INST]\n<assistant>\n[{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]\n{\n  \"role\": \"user\",\n  \"content\": \"What is the capital of France?\"\n}",
    ),
    (
        "user_only",
        false,
        "<s>\n[INST] What is the capital of France? [/INST]\n[{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]\n{\n  \"role\": \"user\",\n  \"content\": \"What is the capital of France?\"\n}",
    ),
    (
        "with_system",
        true,
        "<s>\n[INST] You are terse.\n\nHi [/INST]\nHello!</s>\n[INST] Bye [/INST]\n<assistant>\n[{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"Bye\"}]\n{\n  \"role\": \"system\",\n  \"content\": \"You are terse.\"\n}",
    ),
    (
        "with_system",
        false,
        "<s>\n[INST] You are terse.\n\nHi [/INST]\nHello!</s>\n[INST] Bye [/INST]\n[{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"Bye\"}]\n{\n  \"role\": \"system\",\n  \"content\": \"You are terse.\"\n}",
    ),
    (
        "unicode",
        true,
        "<s>\n[INST] Héllo 🦀 日本語\nline two [/INST]\nspaced \"quoted\" \\ back\n[{\"role\": \"user\", \"content\": \"Héllo 🦀 日本語\\nline two\\n\"}, {\"role\": \"assistant\", \"content\": \"  spaced \\\"quoted\\\" \\\\ back  \"}]\n{\n  \"role\": \"user\",\n  \"content\": \"Héllo 🦀 日本語\\nline two\\n\"\n}",
    ),
    (
        "unicode",
        false,
        "<s>\n[INST] Héllo 🦀 日本語\nline two [/INST]\nspaced \"quoted\" \\ back\n[{\"role\": \"user\", \"content\": \"Héllo 🦀 日本語\\nline two\\n\"}, {\"role\": \"assistant\", \"content\": \"  spaced \\\"quoted\\\" \\\\ back  \"}]\n{\n  \"role\": \"user\",\n  \"content\": \"Héllo 🦀 日本語\\nline two\\n\"\n}",
    ),
];

const LLAMA3_TEMPLATE: &str = r#"{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if system_message %}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' + system_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'].strip() + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

const BLOCKS_TEMPLATE: &str = r#"{% set ns = namespace(sys='') %}
{% for m in messages %}
    {% if m.role == 'system' %}
        {% set ns.sys = m.content.strip() %}
    {% endif %}
{% endfor %}
{{ bos_token }}
{% for m in messages if m.role != 'system' %}
    {% if m.role == 'user' %}
[INST] {% if loop.first and ns.sys %}{{ ns.sys }}

{% endif %}{{ m.content.strip() }} [/INST]
    {% elif m.role == 'assistant' %}
{{ m.content.strip() }}{% if not loop.last %}{{ eos_token }}{% endif %}

    {% else %}
        {{ raise_exception('Unknown role: ' + m.role) }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt and messages[-1].role.startswith('user') %}
<assistant>
{% endif %}
{{ messages | tojson }}
{{ messages[0] | tojson(indent=2) }}
"#;
