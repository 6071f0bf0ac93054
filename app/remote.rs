//! Remote endpoints: the load generator's target for any OpenAI-compatible server (vLLM, SGLang,
//! TGI, llama.cpp's server, `tpslab serve`).
//!
//! Each request is one streaming `POST {url}/v1/completions` with the prompt as token ids,
//! `max_tokens`, `ignore_eos`, the run's temperature (0 unless `--temperature`) and `stream_options.include_usage` (or, in the
//! [`RemoteShape::Chat`] shape, `/v1/chat/completions` with the prompt decoded as the user's
//! message; either with extra fields such as `response_format` or `tools`), timed on the
//! client side as vLLM's `benchmark_serving` does: every chunk that carries a choice is one
//! timestamp (TTFT at the first, ITL between them), and the token counts come from the final
//! `usage`. A cancelled request drops its connection, which a server takes as a cancel. What
//! comes back is untrusted: lines and error bodies are read up to a bound, each byte of the
//! stream is scanned once ([`SseLines`]), counts are checked before any arithmetic, and every
//! request has a connect, a read (between chunks) and an overall timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tpslab_engine::sched::RequestId;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{Event, Refusal, RefusalKind, Request, Usage};
use tpslab_engine::serving::loadgen::LoadTarget;

/// Longest SSE line or error body read from a server.
const MAX_LINE: usize = 1 << 20;

/// Time to open a connection, and the longest silence between two chunks of an answer (a
/// loaded server may take long to start a request: this is generous).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(300);
/// The most one request may take, start to end.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// Token counts a server reports past this are refused as implausible (no context is this
/// long), so sums over many requests cannot overflow.
const MAX_COUNT: u64 = 1 << 32;

/// Requests on their way, by id: the task streaming each one (to abort it) and where its events go.
type InFlight = HashMap<RequestId, (tokio::task::AbortHandle, Sender<Event>)>;

/// Turns a prompt's token ids back into text (for chat requests).
pub type Decode = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// Which endpoint each request goes to, and how its prompt is sent.
#[derive(Clone, Default)]
pub enum RemoteShape {
    /// `/v1/completions` with the prompt's token ids.
    #[default]
    Completions,
    /// `/v1/chat/completions` with the prompt decoded as one user message.
    Chat(Decode),
}

/// An OpenAI-compatible server as a load target.
pub struct RemoteTarget {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    /// Base URL without a trailing slash ("http://127.0.0.1:8080").
    url: String,
    api_key: Option<String>,
    model: String,
    next_id: AtomicU64,
    /// Requests in flight: their task (aborted on cancel) and their event channel.
    flying: Arc<Mutex<InFlight>>,
    shape: RemoteShape,
    /// Fields added to every request body (`response_format`, `tools`, `tool_choice`).
    extra: Map<String, Value>,
}

/// Base URL: trailing slashes and a trailing `/v1` removed (both spellings are common).
pub fn base_url(url: &str) -> Result<String, String> {
    let u = url.trim().trim_end_matches('/');
    let u = u.strip_suffix("/v1").unwrap_or(u);
    if !(u.starts_with("http://") || u.starts_with("https://")) {
        return Err(format!(
            "endpoint {url:?} must start with http:// or https://"
        ));
    }
    Ok(u.to_string())
}

impl RemoteTarget {
    /// A target at `url` serving `model` (`None`: the first model the server lists). Asks the
    /// server for `GET /v1/models` first, so a wrong URL, key or model name fails here, clearly.
    pub fn connect(
        url: &str,
        api_key: Option<String>,
        model: Option<&str>,
    ) -> Result<Self, String> {
        let url = base_url(url)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the HTTP client runtime: {e}"))?;
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let models = rt.block_on(list_models(&client, &url, api_key.as_deref()))?;
        let model = match model {
            Some(m) if models.iter().any(|x| x == m) => m.to_string(),
            Some(m) => {
                return Err(format!(
                    "{url} does not serve a model named {m:?} (it lists: {})",
                    models.join(", ")
                ));
            }
            None => models
                .first()
                .cloned()
                .ok_or_else(|| format!("{url}/v1/models lists no model"))?,
        };
        Ok(Self {
            rt,
            client,
            url,
            api_key,
            model,
            next_id: AtomicU64::new(1),
            flying: Arc::default(),
            shape: RemoteShape::Completions,
            extra: Map::new(),
        })
    }

    /// The requests sent from now on: their endpoint, and fields added to every body.
    pub fn set_requests(&mut self, shape: RemoteShape, extra: Map<String, Value>) {
        self.shape = shape;
        self.extra = extra;
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

async fn list_models(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> Result<Vec<String>, String> {
    let mut rb = client
        .get(format!("{url}/v1/models"))
        .timeout(Duration::from_secs(30));
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    let resp = rb
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = resp.status();
    let body = read_bounded(resp).await?;
    if !status.is_success() {
        return Err(format!(
            "{url}/v1/models answered {status}: {}",
            error_message(&body)
        ));
    }
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{url}/v1/models did not answer JSON: {e}"))?;
    Ok(v["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

/// The whole body, refused past `MAX_LINE` bytes.
async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_LINE {
            return Err(format!("the answer is larger than {MAX_LINE} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `error.message` of an OpenAI-style error body, else the body's start.
fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(String::from))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned())
}

fn refusal_kind(status: reqwest::StatusCode, body: &[u8]) -> RefusalKind {
    let code = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(String::from));
    match status.as_u16() {
        429 => RefusalKind::Busy,
        _ if code.as_deref() == Some("context_length_exceeded") => RefusalKind::TooLong,
        500.. => RefusalKind::Unavailable,
        _ => RefusalKind::Invalid,
    }
}

impl LoadTarget for RemoteTarget {
    fn submit(&self, req: Request, events: Sender<Event>) -> RequestId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut body = json!({
            "model": self.model,
            "max_tokens": req.stop.max_tokens.unwrap_or(16),
            "temperature": req.sampling.temperature,
            "ignore_eos": req.stop.ignore_eos,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(seed) = req.sampling.seed {
            body["seed"] = json!(seed);
        }
        let path = match &self.shape {
            RemoteShape::Completions => {
                body["prompt"] = json!(req.prompt);
                "completions"
            }
            RemoteShape::Chat(decode) => {
                body["messages"] = json!([{"role": "user", "content": decode(&req.prompt)}]);
                "chat/completions"
            }
        };
        for (k, v) in &self.extra {
            body[k] = v.clone();
        }
        let mut rb = self
            .client
            .post(format!("{}/v1/{path}", self.url))
            .timeout(REQUEST_TIMEOUT)
            .json(&body);
        if let Some(k) = &self.api_key {
            rb = rb.bearer_auth(k);
        }
        let (tx, flying) = (events.clone(), Arc::clone(&self.flying));
        // Registered before the task can end, so its own removal always finds it.
        let mut map = self.flying.lock().unwrap_or_else(|e| e.into_inner());
        let task = self.rt.spawn(async move {
            let end = stream_one(rb, id, &tx).await;
            if flying
                .lock()
                .map(|mut m| m.remove(&id))
                .ok()
                .flatten()
                .is_some()
            {
                let _ = tx.send(end);
            }
        });
        map.insert(id, (task.abort_handle(), events));
        id
    }

    /// Drops the request's connection and ends it as aborted.
    fn cancel(&self, id: RequestId) {
        let entry = self.flying.lock().ok().and_then(|mut m| m.remove(&id));
        if let Some((task, events)) = entry {
            task.abort();
            let _ = events.send(Event::Finished {
                id,
                reason: FinishReason::Abort,
                usage: Usage::default(),
                text: String::new(),
                queue_time: Duration::ZERO,
            });
        }
    }
}

impl Drop for RemoteTarget {
    fn drop(&mut self) {
        let ids: Vec<RequestId> = self
            .flying
            .lock()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        for id in ids {
            self.cancel(id);
        }
    }
}

/// Sends `Started` and a `Token` per chunk, and returns the final event: `Finished`, or one
/// `Refused` saying what broke.
async fn stream_one(rb: reqwest::RequestBuilder, id: RequestId, tx: &Sender<Event>) -> Event {
    let refused = |message: String, kind| Event::Refused {
        id,
        reason: Refusal::Remote { kind, message },
    };
    let _ = tx.send(Event::Started { id });
    let mut resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return refused(format!("request failed: {e}"), RefusalKind::Unavailable),
    };
    let status = resp.status();
    if !status.is_success() {
        let body = read_bounded(resp).await.unwrap_or_default();
        return refused(
            format!("server answered {status}: {}", error_message(&body)),
            refusal_kind(status, &body),
        );
    }
    let mut reader = StreamReader::new();
    let mut texts = Vec::new();
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return refused(format!("the stream broke: {e}"), RefusalKind::Unavailable),
        };
        let done = reader.feed(&chunk, &mut texts);
        for text in texts.drain(..) {
            let _ = tx.send(Event::Token {
                id,
                token: 0,
                text,
                logprob: None,
            });
        }
        match done {
            Ok(false) => {}
            Ok(true) => break,
            Err(e) => return refused(e, RefusalKind::Unavailable),
        }
    }
    match reader.end() {
        Ok((reason, usage)) => finished(id, reason, usage),
        Err(e) => refused(e, RefusalKind::Unavailable),
    }
}

/// An SSE body cut into lines as its chunks arrive. Each byte is scanned for the newline once
/// (a line that comes in many chunks is not rescanned from its start), the consumed part is
/// dropped once per chunk, and a line longer than `max` is an error, not a growing buffer.
#[derive(Debug)]
pub struct SseLines {
    buf: Vec<u8>,
    /// Start of the first line not handed out yet.
    start: usize,
    /// Bytes before this (from `start`) hold no newline.
    scanned: usize,
    max: usize,
}

impl SseLines {
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole line (without `\n` or `\r\n`), `None` until one is complete.
    pub fn next_line(&mut self) -> Result<Option<&[u8]>, String> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(i) => {
                let end = self.scanned + i;
                let line = &self.buf[self.start..end];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                self.start = end + 1;
                self.scanned = self.start;
                if line.len() > self.max {
                    return Err(format!("a stream line is longer than {} bytes", self.max));
                }
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                if self.buf.len() - self.start > self.max {
                    return Err(format!("a stream line is longer than {} bytes", self.max));
                }
                Ok(None)
            }
        }
    }

    /// Bytes held: the unfinished line (at most `max`) and what the last chunk brought.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// A streamed choice's text: completions' `text`, or chat's `delta.content` and the argument
/// pieces of its `delta.tool_calls`.
fn choice_text(c: &Value) -> String {
    if let Some(t) = c["text"].as_str() {
        return t.to_string();
    }
    let delta = &c["delta"];
    let mut out = delta["content"].as_str().unwrap_or_default().to_string();
    for call in delta["tool_calls"].as_array().into_iter().flatten() {
        out.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
    }
    out
}

/// The client side of one completion stream, fed chunk by chunk: the text of each choice,
/// the finish reason and the usage. Pure (no I/O), so it is what the fuzz tests drive.
#[derive(Debug)]
pub struct StreamReader {
    lines: SseLines,
    usage: Usage,
    reason: Option<FinishReason>,
    done: bool,
}

impl Default for StreamReader {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamReader {
    pub fn new() -> Self {
        Self {
            lines: SseLines::new(MAX_LINE),
            usage: Usage::default(),
            reason: None,
            done: false,
        }
    }

    /// Reads a chunk: each choice's text is pushed to `texts`. `Ok(true)` once `[DONE]` came
    /// (anything after it is ignored); `Err` says what was wrong with the stream.
    pub fn feed(&mut self, chunk: &[u8], texts: &mut Vec<String>) -> Result<bool, String> {
        if self.done {
            return Ok(true);
        }
        self.lines.push(chunk);
        while let Some(line) = self.lines.next_line()? {
            let line = String::from_utf8_lossy(line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                self.done = true;
                return Ok(true);
            }
            let v: Value =
                serde_json::from_str(data).map_err(|_| format!("bad stream chunk: {data:.200}"))?;
            if let Some(e) = v.get("error") {
                let msg = e["message"].as_str().unwrap_or("error in the stream");
                return Err(format!("the server sent an error: {msg:.300}"));
            }
            if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
                // A chat chunk with nothing in it (vLLM's first, naming the role) is no token.
                let text = choice_text(c);
                if !text.is_empty() || c.get("text").is_some() {
                    texts.push(text);
                }
                match c["finish_reason"].as_str() {
                    Some("length") => self.reason = Some(FinishReason::Length),
                    Some(_) => self.reason = Some(FinishReason::Stop),
                    None => {}
                }
            }
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                self.usage = checked_usage(u)?;
            }
        }
        Ok(false)
    }

    /// The stream ended: its finish reason and usage. One without `[DONE]` counts if it said
    /// how it finished (some servers close at once); otherwise it broke off.
    pub fn end(self) -> Result<(FinishReason, Usage), String> {
        match (self.done, self.reason) {
            (true, r) => Ok((r.unwrap_or(FinishReason::Stop), self.usage)),
            (false, Some(r)) => Ok((r, self.usage)),
            (false, None) => {
                Err("the stream ended before the answer did (no finish_reason, no [DONE])".into())
            }
        }
    }
}

/// A `usage` object's counts, each at most [`MAX_COUNT`] and their total checked.
fn checked_usage(u: &Value) -> Result<Usage, String> {
    let n = |k: &str| -> Result<usize, String> {
        match &u[k] {
            Value::Null => Ok(0),
            v => v
                .as_u64()
                .filter(|&n| n <= MAX_COUNT)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("the server sent an implausible usage.{k}: {v:.40}")),
        }
    };
    let usage = Usage {
        prompt_tokens: n("prompt_tokens")?,
        completion_tokens: n("completion_tokens")?,
        ..Usage::default()
    };
    usage
        .prompt_tokens
        .checked_add(usage.completion_tokens)
        .ok_or("the server's usage counts overflow")?;
    Ok(usage)
}

fn finished(id: RequestId, reason: FinishReason, usage: Usage) -> Event {
    Event::Finished {
        id,
        reason,
        usage,
        text: String::new(),
        queue_time: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            base_url("http://127.0.0.1:8000/v1/").as_deref(),
            Ok("http://127.0.0.1:8000")
        );
        assert_eq!(
            base_url(" https://h.example ").as_deref(),
            Ok("https://h.example")
        );
        assert!(base_url("127.0.0.1:8000").is_err());
    }

    #[test]
    fn error_bodies() {
        let body = br#"{"error":{"message":"slow down","code":"rate_limit_exceeded"}}"#;
        assert_eq!(error_message(body), "slow down");
        assert_eq!(
            refusal_kind(reqwest::StatusCode::TOO_MANY_REQUESTS, body),
            RefusalKind::Busy
        );
        let long = br#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#;
        assert_eq!(
            refusal_kind(reqwest::StatusCode::BAD_REQUEST, long),
            RefusalKind::TooLong
        );
        assert_eq!(error_message(b"plain text"), "plain text");
    }

    #[test]
    fn a_line_in_one_byte_chunks_is_scanned_once() {
        let mut lines = SseLines::new(64);
        for &b in b"data: x\r" {
            lines.push(&[b]);
            assert_eq!(lines.next_line(), Ok(None));
        }
        lines.push(b"\ndata: y\n");
        assert_eq!(lines.next_line(), Ok(Some(&b"data: x"[..])));
        assert_eq!(lines.next_line(), Ok(Some(&b"data: y"[..])));
        assert_eq!(lines.next_line(), Ok(None));
        lines.push(&[b'z'; 65]);
        assert!(lines.next_line().is_err());
    }

    #[test]
    fn usage_counts_are_checked() {
        let mut r = StreamReader::new();
        let mut texts = Vec::new();
        let huge = format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":1}}}}\n",
            u64::MAX
        );
        assert!(r.feed(huge.as_bytes(), &mut texts).is_err());
        let mut r = StreamReader::new();
        assert!(r.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\n", &mut texts) == Ok(false));
        assert!(r.end().is_err(), "no finish_reason, no [DONE]: broken");
    }
}
