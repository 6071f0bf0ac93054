//! Chat templates: turns a conversation into the prompt text a model was trained on, by rendering
//! the model's Jinja template with minijinja the way Hugging Face transformers renders it.
//!
//! transformers (`_compile_jinja_template` and `render_jinja_template`) uses jinja2's sandbox
//! with `trim_blocks`, `lstrip_blocks`, `keep_trailing_newline=False` and the `loopcontrols`
//! extension, a `raise_exception` global, a `strftime_now` global, a `tojson` filter built on
//! Python's `json.dumps`, and renders with `messages`, `tools`, `documents`,
//! `add_generation_prompt`, the special tokens and any extra keyword (`enable_thinking`). We set
//! up the same: same whitespace control and loop controls, pycompat methods from
//! minijinja-contrib, `tojson` as `json.dumps` writes (chat_json.rs), `strftime_now` on a clock
//! the caller gives (chat_time.rs), and messages and tools as ordered maps so key order matches
//! Python dicts (chat_message.rs).
//!
//! One departure, on purpose: a conversation that opens with a system message, given to a
//! template that never reads one (Gemma's refuses it), has it folded into the next message first,
//! as llama.cpp and LM Studio do ([`fold_system`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::formats::gguf::GgufFile;
pub use crate::text::chat_budget::{Overrun, RenderBudget};
use crate::text::chat_budget::{Rendered, isolated};
use crate::text::chat_json::tojson;
use crate::text::chat_message::MessageObject;
pub use crate::text::chat_message::{ChatMessage, RenderOptions, fold_system};
pub use crate::text::chat_time::{RenderTime, strftime_utc};
use crate::text::tokenizer::Tokenizer;

const KEY_TEMPLATE: &str = "tokenizer.chat_template";
const TEMPLATE_NAME: &str = "chat";

/// The ChatML template (Hugging Face's former default), used when a model ships no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Why a template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("'{KEY_TEMPLATE}' in the model file is not a string")]
    BadMetadata,
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    /// The template itself refused the conversation (`raise_exception(...)`), e.g. roles that
    /// do not alternate. The message is the template's own.
    #[error("the chat template rejected the conversation: {0}")]
    Rejected(String),
    #[error("rendering the chat template failed: {0}")]
    Render(String),
    /// The template ran past its [`RenderBudget`] and was stopped.
    #[error("the chat template of {model} was stopped: {overrun}")]
    OverBudget { model: String, overrun: Overrun },
}

/// A compiled chat template plus the special-token strings it may refer to.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    budget: RenderBudget,
    /// Whose template this is, for errors.
    model: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

/// Carried as the source of the error `raise_exception` returns, so a template's own refusal can
/// be told apart from a broken template.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// The model's own template (`tokenizer.chat_template`), or ChatML when it has none;
    /// BOS/EOS strings come from the tokenizer's vocabulary.
    pub fn from_gguf(gguf: &GgufFile, tokenizer: &Tokenizer) -> Result<Self, ChatError> {
        let source = match gguf.get(KEY_TEMPLATE) {
            None => CHATML_TEMPLATE,
            Some(v) => v.as_str().ok_or(ChatError::BadMetadata)?,
        };
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.id_to_token(id))
                .unwrap_or_default()
        };
        let model = gguf
            .get("general.name")
            .and_then(|v| v.as_str())
            .map_or_else(
                || "this model".to_string(),
                |n| n.chars().take(100).collect(),
            );
        Ok(Self::new(source, text(tokenizer.bos_id()), text(tokenizer.eos_id()))?.named(model))
    }

    /// Compiles `source`; `bos` and `eos` are what the template sees as `bos_token`/`eos_token`.
    pub fn new(
        source: &str,
        bos: impl Into<String>,
        eos: impl Into<String>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        let budget = RenderBudget::default();
        env.set_fuel(Some(budget.fuel));
        Ok(Self {
            env,
            source: source.to_string(),
            bos: bos.into(),
            eos: eos.into(),
            budget,
            model: "this model".into(),
        })
    }

    /// The same template under another budget.
    #[must_use]
    pub fn with_budget(mut self, budget: RenderBudget) -> Self {
        self.env.set_fuel(Some(budget.fuel));
        self.budget = budget;
        self
    }

    /// The same template, named after `model` in its errors.
    #[must_use]
    pub fn named(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    pub fn budget(&self) -> &RenderBudget {
        &self.budget
    }

    /// The default ChatML template.
    pub fn chatml() -> Self {
        match Self::new(CHATML_TEMPLATE, "", "<|im_end|>") {
            Ok(t) => t,
            // The constant is tested to compile; this arm only satisfies the type checker.
            Err(e) => unreachable!("built-in ChatML template: {e}"),
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation. With `add_generation_prompt`, the text ends with the opening of
    /// an assistant turn, so the model's next tokens are its answer. The render runs under the
    /// template's [`RenderBudget`] (see [`crate::text::chat_budget`]); may take up to its time limit, so
    /// call it off a UI thread.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with(messages, &RenderOptions::new(add_generation_prompt))
    }

    /// Renders the conversation with everything transformers' `apply_chat_template` takes
    /// (tools, documents, `enable_thinking`, the clock), under the template's budget.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        let job = || {
            let job = RenderJob {
                source: Cow::Borrowed(&self.source),
                bos: Cow::Borrowed(&self.bos),
                eos: Cow::Borrowed(&self.eos),
                budget: self.budget,
                messages: Cow::Borrowed(messages),
                opts: Cow::Borrowed(opts),
            };
            serde_json::to_vec(&job).unwrap_or_default()
        };
        match isolated(&self.budget, job, || self.render_here(messages, opts)) {
            Rendered::Text(t) => Ok(t),
            Rendered::Rejected(m) => Err(ChatError::Rejected(m)),
            Rendered::Failed(m) => Err(ChatError::Render(m)),
            Rendered::Over(overrun) => Err(ChatError::OverBudget {
                model: self.model.clone(),
                overrun,
            }),
        }
    }

    /// The render itself, in this process, with fuel and the output cap: a leading system
    /// message is folded first when the template does not read one.
    fn render_here(&self, messages: &[ChatMessage], opts: &RenderOptions) -> Rendered {
        let starts_with_system = messages.first().is_some_and(|m| m.role == "system");
        if starts_with_system && !self.reads_system_message(opts.now) {
            return self.render_once(&fold_system(messages), opts, None);
        }
        self.render_once(messages, opts, None)
    }

    /// llama.cpp's probe for `supports_system_role` (common/jinja/caps.cpp): render a system
    /// and a user message (tools an empty list, empty BOS/EOS, a generation prompt) and see
    /// whether the template read the system message's content at all, whether or not the
    /// render then succeeded. A template that refuses a system role raises before it reads it.
    fn reads_system_message(&self, now: RenderTime) -> bool {
        let read = Arc::new(AtomicBool::new(false));
        let probe = [
            ChatMessage::system("System message"),
            ChatMessage::user("User message"),
        ];
        let opts = RenderOptions {
            add_generation_prompt: true,
            tools: Some(Vec::new()),
            documents: None,
            enable_thinking: None,
            now,
            server_dates: true,
        };
        // A twentieth of the fuel: real templates render these two messages in a few thousand
        // steps, and a runaway one must not spend its whole budget twice.
        let mut prober = Self {
            bos: String::new(),
            eos: String::new(),
            ..self.clone()
        };
        prober.env.set_fuel(Some(self.budget.fuel / 20));
        let _ = prober.render_once(&probe, &opts, Some(&read));
        read.load(Ordering::Relaxed)
    }

    /// One render of `messages`; with `content_read`, the first message's content reports when
    /// the template reads it.
    fn render_once(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
        content_read: Option<&Arc<AtomicBool>>,
    ) -> Rendered {
        let tmpl = match self.env.get_template(TEMPLATE_NAME) {
            Ok(t) => t,
            Err(e) => return Rendered::Failed(e.to_string()),
        };
        let messages: Vec<Value> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| MessageObject::value(m.clone(), content_read.filter(|_| i == 0).cloned()))
            .collect();
        let now = opts.now;
        let optional = |v: &Option<Vec<serde_json::Value>>| {
            // transformers passes None when there are none; templates test `tools is not none`.
            v.as_ref().map_or(Value::from(()), Value::from_serialize)
        };
        let mut ctx = minijinja::context! {
            messages => messages,
            tools => optional(&opts.tools),
            documents => optional(&opts.documents),
            add_generation_prompt => opts.add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
            strftime_now => Value::from_function(move |format: String| now.strftime(&format)),
        };
        if opts.server_dates {
            ctx = minijinja::context! {
                date_string => now.strftime("%d %b %Y"),
                datetime => now.strftime("%b %d %Y"),
                ..ctx
            };
        }
        // Passed only when asked, as a keyword argument is: templates test `is defined`.
        if let Some(on) = opts.enable_thinking {
            ctx = minijinja::context! { enable_thinking => on, ..ctx };
        }
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap: self.budget.max_output,
            over: false,
        };
        let result = tmpl.render_captured_to(ctx, &mut out);
        if out.over {
            return Rendered::Over(Overrun::Output(self.budget.max_output));
        }
        match result {
            Ok(_) => match String::from_utf8(out.buf) {
                Ok(t) => Rendered::Text(t),
                Err(e) => Rendered::Failed(e.to_string()),
            },
            Err(e) => self.failure(&e),
        }
    }

    /// What a failed render means: over a budget, the template's own refusal, or broken.
    fn failure(&self, e: &minijinja::Error) -> Rendered {
        if e.kind() == ErrorKind::OutOfFuel {
            return Rendered::Over(Overrun::Fuel(self.budget.fuel));
        }
        // minijinja's own guard (its text is the only mark it leaves).
        if e.kind() == ErrorKind::InvalidOperation
            && e.to_string().contains("recursion limit exceeded")
        {
            return Rendered::Over(Overrun::Depth(self.env.recursion_limit()));
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(r) = s.downcast_ref::<Raised>() {
                return Rendered::Rejected(r.0.clone());
            }
            source = s.source();
        }
        Rendered::Failed(e.to_string())
    }
}

/// What the render server needs to render a template: everything [`ChatTemplate::render_with`]
/// uses (borrowed to send, owned when received).
#[derive(Serialize, Deserialize)]
struct RenderJob<'a> {
    source: Cow<'a, str>,
    bos: Cow<'a, str>,
    eos: Cow<'a, str>,
    budget: RenderBudget,
    messages: Cow<'a, [ChatMessage]>,
    opts: Cow<'a, RenderOptions>,
}

/// The render server's runner: a job's bytes to its answer.
fn run_job(bytes: &[u8]) -> Rendered {
    let job: RenderJob<'static> = match serde_json::from_slice(bytes) {
        Ok(j) => j,
        Err(e) => return Rendered::Failed(format!("bad render job: {e}")),
    };
    match ChatTemplate::new(&job.source, job.bos, job.eos) {
        Ok(t) => t
            .with_budget(job.budget)
            .render_here(&job.messages, &job.opts),
        Err(e) => Rendered::Failed(e.to_string()),
    }
}

/// Starts the process's chat-template render server (Linux): call it first thing in `main`,
/// before any model is loaded, so that each render forks from a small process (a fork costs in
/// proportion to the memory of the process it copies). Without it, renders fork from the
/// process itself. Returns whether the server runs.
pub fn start_render_server() -> bool {
    crate::text::chat_budget::start_server(run_job)
}

/// The render's output, refusing to grow past `cap` (the write fails, which ends the render).
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.cap {
            self.over = true;
            return Err(std::io::Error::other("chat template output over its cap"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_compiles() {
        let t = ChatTemplate::chatml();
        let out = t.render(&[ChatMessage::user("hi")], true);
        assert_eq!(
            out.ok().as_deref(),
            Some("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        );
    }
}
