//! Tool calls through the real chat templates (llama.cpp's models/templates/, the ones
//! tests/data/chat_templates.json was made from, plus Mistral Small 3.2 for the newer
//! `[TOOL_CALLS]name[ARGS]` form): for each family a conversation whose last assistant message
//! has tool calls is rendered, the part the template wrote for that message is cut out (the
//! render minus the render of the conversation before it with the generation prompt, minus the
//! end-of-turn token), and the parser the template's source picks must get the same calls back,
//! whole and when fed one character at a time, with no piece of a marker in the text.

use serde_json::{Value, json};
use tpslab_engine::text::chat::{ChatMessage, ChatTemplate, RenderOptions};
use tpslab_engine::text::tool_calls::{ToolCallParser, ToolFormat, collect};

use crate::llamacpp;

const REFERENCE: &str = include_str!("../../../tests/data/chat_templates.json");

struct Family {
    template: &'static str,
    format: ToolFormat,
    /// The template renders several calls in one message (Llama 3.1's refuses).
    several: bool,
    /// Text beside the calls (templates that drop it get an empty content).
    content: &'static str,
}

const FAMILIES: &[Family] = &[
    Family {
        template: "Qwen-Qwen2.5-7B-Instruct",
        format: ToolFormat::Hermes,
        several: true,
        content: "Let me check.",
    },
    Family {
        template: "Qwen-Qwen3-0.6B",
        format: ToolFormat::Hermes,
        several: true,
        content: "Let me check.",
    },
    Family {
        template: "meta-llama-Llama-3.1-8B-Instruct",
        format: ToolFormat::Llama3Json,
        several: false,
        content: "",
    },
    Family {
        template: "meta-llama-Llama-3.2-3B-Instruct",
        format: ToolFormat::Llama3Json,
        several: false,
        content: "",
    },
    Family {
        template: "meta-llama-Llama-3.3-70B-Instruct",
        format: ToolFormat::Llama3Json,
        several: false,
        content: "",
    },
    Family {
        template: "mistralai-Mistral-Nemo-Instruct-2407",
        format: ToolFormat::Mistral,
        several: true,
        content: "",
    },
    Family {
        template: "Mistral-Small-3.2-24B-Instruct-2506",
        format: ToolFormat::Mistral,
        several: true,
        content: "",
    },
];

fn reference() -> Value {
    serde_json::from_str(REFERENCE).expect("reference JSON")
}

fn template(name: &str, reference: &Value) -> ChatTemplate {
    let t = &reference["templates"][name];
    let bos = t["bos_token"].as_str().unwrap_or("<s>");
    let eos = t["eos_token"].as_str().unwrap_or("</s>");
    ChatTemplate::new(&llamacpp::template(name), bos, eos).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn calls(several: bool, string_args: bool) -> Vec<(String, Value)> {
    let mut c = vec![(
        "get_weather".to_string(),
        json!({"location": "Paris", "unit": "celsius"}),
    )];
    if several {
        c.push(("add".into(), json!({"a": 2, "b": 3.5})));
    }
    let _ = string_args;
    c
}

/// The assistant message of `calls`, in OpenAI's shape (arguments as an object, as the server
/// gives them to templates, or as a JSON string).
fn assistant(content: &str, calls: &[(String, Value)], string_args: bool) -> ChatMessage {
    let ids = ["call12345", "call67890"];
    let tool_calls = calls
        .iter()
        .zip(ids)
        .map(|((name, args), id)| {
            let arguments = if string_args {
                json!(args.to_string())
            } else {
                args.clone()
            };
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    ChatMessage {
        tool_calls: Some(tool_calls),
        ..ChatMessage::assistant(content)
    }
}

/// What the template wrote for the last assistant message.
fn cut(t: &ChatTemplate, tools: &[Value], last: ChatMessage, eos: &str) -> String {
    let user = ChatMessage::user("What is the weather in Paris?");
    let opts = |generation: bool| RenderOptions {
        tools: Some(tools.to_vec()),
        ..RenderOptions::new(generation)
    };
    let before = t
        .render_with(std::slice::from_ref(&user), &opts(true))
        .expect("render before");
    let whole = t
        .render_with(&[user, last], &opts(false))
        .expect("render whole");
    let rest = whole.strip_prefix(&before).unwrap_or_else(|| {
        panic!("the whole render does not start with the prompt:\n{whole}\n---\n{before}")
    });
    let mut rest = rest.trim_end();
    for end in [eos, "<|im_end|>", "<|eot_id|>", "</s>"] {
        rest = rest.strip_suffix(end).unwrap_or(rest).trim_end();
    }
    rest.to_string()
}

fn check(f: &Family, text: &str, want: &[(String, Value)]) {
    let (content, got) = ToolCallParser::parse_all(f.format, text);
    assert_eq!(
        got.len(),
        want.len(),
        "{}: calls of {text:?}: {got:?}",
        f.template
    );
    for (g, (name, args)) in got.iter().zip(want) {
        assert_eq!(&g.name, name, "{}", f.template);
        let a: Value = serde_json::from_str(&g.arguments).expect("arguments are JSON");
        assert_eq!(&a, args, "{}: arguments of {name}", f.template);
    }
    assert!(
        content.trim().ends_with(f.content),
        "{}: content {content:?}",
        f.template
    );
    for marker in [
        "tool_call",
        "TOOL_CALLS",
        "python_tag",
        "[ARGS]",
        "\"name\"",
    ] {
        assert!(
            !content.contains(marker),
            "{}: {marker} in {content:?}",
            f.template
        );
    }
    // One character at a time: the same text, the same calls, names before arguments.
    let mut p = ToolCallParser::new(f.format);
    let (mut streamed, mut deltas) = (String::new(), Vec::new());
    for (i, c) in text.char_indices() {
        let step = p.push(&text[i..i + c.len_utf8()]);
        streamed.push_str(&step.content);
        deltas.extend(step.calls);
    }
    let last = p.finish();
    streamed.push_str(&last.content);
    deltas.extend(last.calls);
    assert_eq!(streamed, content, "{}: streamed text", f.template);
    for (i, _) in want.iter().enumerate() {
        let first = deltas
            .iter()
            .find(|d| d.index == i)
            .expect("a delta per call");
        assert!(
            first.name.is_some(),
            "{}: call {i} starts without its name",
            f.template
        );
    }
    assert_eq!(collect(deltas), got, "{}: streamed calls", f.template);
}

#[test]
fn real_templates_calls_parse_back() {
    let reference = reference();
    let tools: Vec<Value> = reference["cases"]["tools_offered"]["options"]["tools"]
        .as_array()
        .expect("tools")
        .clone();
    let mut checked = 0;
    for f in FAMILIES {
        let t = template(f.template, &reference);
        assert_eq!(
            ToolFormat::for_template(t.source()),
            f.format,
            "{}: format from the template",
            f.template
        );
        let eos = reference["templates"][f.template]["eos_token"]
            .as_str()
            .unwrap_or("</s>");
        for string_args in [false, true] {
            // Mistral Nemo's and Qwen's templates write a string argument as it is; the server
            // gives templates objects (chat_input), so strings are only checked where the
            // template re-encodes them.
            if string_args && f.format != ToolFormat::Llama3Json {
                continue;
            }
            let want = calls(f.several, string_args);
            let text = cut(&t, &tools, assistant(f.content, &want, string_args), eos);
            assert!(
                !text.is_empty(),
                "{}: the template wrote no call",
                f.template
            );
            check(f, &text, &want);
            checked += 1;
        }
    }
    assert_eq!(checked, FAMILIES.len() + 3);
}

/// SmolLM3's template in llama.cpp's tree renders no tools and no tool calls (the assistant
/// turn comes out empty); its format is then the default, Hermes, which SmolLM3 was trained on.
#[test]
fn smollm3_template_renders_no_calls_and_gets_hermes() {
    let reference = reference();
    let name = "HuggingFaceTB-SmolLM3-3B";
    let t = template(name, &reference);
    assert_eq!(ToolFormat::for_template(t.source()), ToolFormat::Hermes);
    let want = calls(false, false);
    let eos = reference["templates"][name]["eos_token"]
        .as_str()
        .unwrap_or("");
    let text = cut(&t, &[], assistant("", &want, false), eos);
    assert_eq!(text, "", "SmolLM3's template now renders calls: test them");
}
