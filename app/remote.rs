//! Remote endpoints: the load generator's target for any OpenAI-compatible server (vLLM, SGLang,
//! TGI, llama.cpp's server, `tpslab serve`).
//!
//! Each request is one streaming `POST {url}/v1/completions` with the prompt as token ids,
//! `max_tokens`, `ignore_eos`, temperature 0 and `stream_options.include_usage`, timed on the
//! client side as vLLM's `benchmark_serving` does: every chunk that carries a choice is one
//! timestamp (TTFT at the first, ITL between them), and the token counts come from the final
//! `usage`. A cancelled request drops its connection, which a server takes as a cancel. What
//! comes back is untrusted: lines and error bodies are read up to a bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tpslab_engine::engine::{Event, RefusalKind, Request, Usage};
use tpslab_engine::loadgen::LoadTarget;
use tpslab_engine::scheduler::RequestId;
use tpslab_engine::stop::FinishReason;

/// Longest SSE line or error body read from a server.
const MAX_LINE: usize = 1 << 20;

/// Requests on their way, by id: the task streaming each one (to abort it) and where its events go.
type InFlight = HashMap<RequestId, (tokio::task::AbortHandle, Sender<Event>)>;

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
            .connect_timeout(Duration::from_secs(10))
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
        })
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
            "prompt": req.prompt,
            "max_tokens": req.stop.max_tokens.unwrap_or(16),
            "temperature": req.sampling.temperature,
            "ignore_eos": req.stop.ignore_eos,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(seed) = req.sampling.seed {
            body["seed"] = json!(seed);
        }
        let mut rb = self
            .client
            .post(format!("{}/v1/completions", self.url))
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

/// Sends `Started` and a `Token` per chunk, and returns the final event.
async fn stream_one(rb: reqwest::RequestBuilder, id: RequestId, tx: &Sender<Event>) -> Event {
    let refused = |reason: String, kind| Event::Refused { id, reason, kind };
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
    let mut buf: Vec<u8> = Vec::new();
    let (mut usage, mut reason) = (Usage::default(), FinishReason::Stop);
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return refused(format!("the stream broke: {e}"), RefusalKind::Unavailable),
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                return finished(id, reason, usage);
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                return refused(
                    format!("bad stream chunk: {data:.200}"),
                    RefusalKind::Unavailable,
                );
            };
            if let Some(e) = v.get("error") {
                let msg = e["message"].as_str().unwrap_or("error in the stream");
                return refused(msg.to_string(), RefusalKind::Unavailable);
            }
            if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
                let text = c["text"].as_str().unwrap_or_default().to_string();
                let _ = tx.send(Event::Token { id, token: 0, text });
                match c["finish_reason"].as_str() {
                    Some("length") => reason = FinishReason::Length,
                    Some(_) => reason = FinishReason::Stop,
                    None => {}
                }
            }
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
                usage = Usage {
                    prompt_tokens: n("prompt_tokens"),
                    completion_tokens: n("completion_tokens"),
                };
            }
        }
        if buf.len() > MAX_LINE {
            return refused(
                format!("a stream line is longer than {MAX_LINE} bytes"),
                RefusalKind::Unavailable,
            );
        }
    }
    // Some servers close without [DONE]: what arrived stands.
    finished(id, reason, usage)
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
}
