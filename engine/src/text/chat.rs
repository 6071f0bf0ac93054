//! Chat templates: turns a conversation into the prompt text a model was trained on, by rendering
//! the model's Jinja template with minijinja the way Hugging Face transformers renders it.
//!
//! transformers uses jinja2 with `trim_blocks`, `lstrip_blocks`, `keep_trailing_newline=False`,
//! a `raise_exception` global, a `tojson` filter built on Python's `json.dumps`, and Python's
//! string/dict methods. We set up the same: same whitespace control, pycompat methods from
//! minijinja-contrib, our own `tojson` that writes JSON the way `json.dumps` does (`", "` and
//! `": "` separators, no HTML escaping), and messages as ordered maps so key order matches
//! Python dicts.

use std::borrow::Cow;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::formats::gguf::GgufFile;
pub use crate::text::chat_budget::{Overrun, RenderBudget};
use crate::text::chat_budget::{Rendered, isolated};
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

/// One message of a conversation, in the OpenAI / Hugging Face shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
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
        env.add_function("strftime_now", strftime_now);
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
        let job = || {
            let job = RenderJob {
                source: Cow::Borrowed(&self.source),
                bos: Cow::Borrowed(&self.bos),
                eos: Cow::Borrowed(&self.eos),
                budget: self.budget,
                messages: Cow::Borrowed(messages),
                add_generation_prompt,
            };
            serde_json::to_vec(&job).unwrap_or_default()
        };
        match isolated(&self.budget, job, || {
            self.render_here(messages, add_generation_prompt)
        }) {
            Rendered::Text(t) => Ok(t),
            Rendered::Rejected(m) => Err(ChatError::Rejected(m)),
            Rendered::Failed(m) => Err(ChatError::Render(m)),
            Rendered::Over(overrun) => Err(ChatError::OverBudget {
                model: self.model.clone(),
                overrun,
            }),
        }
    }

    /// The render itself, in this process, with fuel and the output cap.
    fn render_here(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Rendered {
        let tmpl = match self.env.get_template(TEMPLATE_NAME) {
            Ok(t) => t,
            Err(e) => return Rendered::Failed(e.to_string()),
        };
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| Value::from_object(MessageObject(m.clone())))
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
            // transformers passes these as None; templates test `tools is not none`.
            tools => Value::from(()),
            documents => Value::from(()),
        };
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
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                Rendered::Over(Overrun::Fuel(self.budget.fuel))
            }
            // minijinja's own guard (its text is the only mark it leaves).
            Err(e)
                if e.kind() == ErrorKind::InvalidOperation
                    && e.to_string().contains("recursion limit exceeded") =>
            {
                Rendered::Over(Overrun::Depth(self.env.recursion_limit()))
            }
            Err(e) => {
                let mut source: Option<&(dyn std::error::Error + 'static)> =
                    std::error::Error::source(&e);
                while let Some(s) = source {
                    if let Some(r) = s.downcast_ref::<Raised>() {
                        return Rendered::Rejected(r.0.clone());
                    }
                    source = s.source();
                }
                Rendered::Failed(e.to_string())
            }
        }
    }
}

/// What the render server needs to render a template: everything [`ChatTemplate::render`] uses
/// (borrowed to send, owned when received).
#[derive(Serialize, Deserialize)]
struct RenderJob<'a> {
    source: Cow<'a, str>,
    bos: Cow<'a, str>,
    eos: Cow<'a, str>,
    budget: RenderBudget,
    messages: Cow<'a, [ChatMessage]>,
    add_generation_prompt: bool,
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
            .render_here(&job.messages, job.add_generation_prompt),
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

/// A message as the template sees it: a map with keys in Python-dict order (role, content).
#[derive(Debug)]
struct MessageObject(ChatMessage);

impl Object for MessageObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.0.role.as_str())),
            "content" => Some(Value::from(self.0.content.as_str())),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["role", "content"])
    }
}

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
}

/// `strftime_now(format)` as transformers provides it (Llama 3.x templates put today's date in
/// the system prompt). UTC; supports %d %m %Y %y %b %B %H %M %S %j %%.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime_utc(&format, secs)
}

/// Formats a Unix time (UTC) with a small strftime subset.
pub fn strftime_utc(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let is_leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[(m - 1) as usize] + d + i64::from(is_leap && m > 2);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ));
        }
        // Python's defaults: ", " without indent, "," with it (the newline separates items).
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let opts = JsonOpts {
        indent,
        ensure_ascii,
        sort_keys,
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

struct JsonOpts {
    indent: Option<usize>,
    ensure_ascii: bool,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
}

fn newline_indent(out: &mut String, opts: &JsonOpts, depth: usize) {
    if let Some(n) = opts.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

fn write_json(
    out: &mut String,
    v: &Value,
    opts: &JsonOpts,
    depth: usize,
) -> Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                out.push_str(&python_float(f64::try_from(v.clone())?));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, opts, depth, ('[', ']'), &items, |out, item, depth| {
                write_json(out, item, opts, depth)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            let entries: Vec<(Value, Value)> = keys
                .into_iter()
                .map(|k| v.get_item(&k).map(|val| (k, val)))
                .collect::<Result<_, _>>()?;
            write_container(
                out,
                opts,
                depth,
                ('{', '}'),
                &entries,
                |out, (k, val), depth| {
                    match k.as_str() {
                        Some(s) => write_json_str(out, s, opts.ensure_ascii),
                        None => write_json_str(out, &k.to_string(), opts.ensure_ascii),
                    }
                    out.push_str(&opts.key_sep);
                    write_json(out, val, opts, depth)
                },
            )?;
        }
        ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {}", v.kind()),
            ));
        }
        // ValueKind is non-exhaustive; anything new is refused rather than guessed.
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: unsupported value",
            ));
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    opts: &JsonOpts,
    depth: usize,
    (open, close): (char, char),
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), minijinja::Error>,
) -> Result<(), minijinja::Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline_indent(out, opts, depth + 1);
        write_item(out, item, depth + 1)?;
    }
    newline_indent(out, opts, depth);
    out.push(close);
    Ok(())
}

/// A string as Python's json module writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it (`1.0`, `0.1`, `1e+20`, `1e-07`, `NaN`, `Infinity`).
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let s = format!("{x:?}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let mantissa = mantissa.strip_suffix(".0").unwrap_or(mantissa);
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_matches_repr() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e20), "1e+20");
        assert_eq!(python_float(1e-7), "1e-07");
        assert_eq!(python_float(-2.5e-5), "-2.5e-05");
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            strftime_utc("%d %b %Y %H:%M:%S %j", 1_709_211_909),
            "29 Feb 2024 13:05:09 060"
        );
        assert_eq!(strftime_utc("%Y-%m-%d %B", 0), "1970-01-01 January");
    }

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
