//! A JSON response whose largest parts are written while the body goes out, not built whole
//! first: a prompt's log-probabilities (vLLM's `prompt_logprobs`, completions' `echo` with
//! `logprobs`) are thousands of positions of `k` alternatives each, which as a `serde_json`
//! tree took several times their text in memory, for every choice, before the first byte left.
//!
//! The response is built as a [`Value`] with a placeholder string where each deferred part
//! goes ([`JsonBody::defer`]); [`JsonBody::into_response`] serializes that value and streams it
//! with each placeholder replaced by its part's [`Pieces`], written about [`PIECE_BYTES`] at a
//! time as the client reads. A placeholder carries a random nonce, so no text of the answer
//! can stand for one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// About how much JSON one piece of the body carries.
pub const PIECE_BYTES: usize = 64 << 10;

/// A JSON value written piece by piece.
pub trait Pieces: Send {
    /// Appends the next part of the value's JSON to `out`; false once the value is complete
    /// (nothing more to write).
    fn write_next(&mut self, out: &mut String) -> bool;
}

/// A response body under construction: the deferred parts, by placeholder.
pub struct JsonBody {
    nonce: u64,
    parts: Vec<Box<dyn Pieces>>,
}

impl Default for JsonBody {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonBody {
    pub fn new() -> Self {
        Self {
            nonce: RandomState::new().hash_one(std::time::SystemTime::now()),
            parts: Vec::new(),
        }
    }

    /// The placeholder to put where `part` goes in the response's value.
    pub fn defer(&mut self, part: Box<dyn Pieces>) -> Value {
        let m = marker(self.nonce, self.parts.len());
        self.parts.push(part);
        Value::String(m)
    }

    /// A 200 with `value` as its JSON body, each placeholder streamed as its part. A part
    /// whose placeholder is not in `value` is dropped.
    pub fn into_response(self, value: &Value) -> Response {
        let text = value.to_string();
        let mut segments = VecDeque::new();
        let mut rest = 0;
        let mut found: Vec<(usize, usize, Box<dyn Pieces>)> = Vec::new();
        for (i, part) in self.parts.into_iter().enumerate() {
            let quoted = Value::String(marker(self.nonce, i)).to_string();
            if let Some(at) = text.find(&quoted) {
                found.push((at, quoted.len(), part));
            }
        }
        found.sort_by_key(|(at, ..)| *at);
        for (at, len, part) in found {
            segments.push_back(Segment::Text(Bytes::copy_from_slice(
                &text.as_bytes()[rest..at],
            )));
            segments.push_back(Segment::Part(part));
            rest = at + len;
        }
        segments.push_back(Segment::Text(Bytes::copy_from_slice(
            &text.as_bytes()[rest..],
        )));
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from_stream(Stream { segments }),
        )
            .into_response()
    }
}

/// The placeholder of part `i` (a control character first: JSON escapes it as `\u0001`).
fn marker(nonce: u64, i: usize) -> String {
    format!("\u{1}tpslab-deferred-{nonce:016x}-{i}")
}

enum Segment {
    Text(Bytes),
    Part(Box<dyn Pieces>),
}

/// The body: text between placeholders, and each part as it is written.
struct Stream {
    segments: VecDeque<Segment>,
}

impl futures_core::Stream for Stream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.segments.front_mut() {
                None => return Poll::Ready(None),
                Some(Segment::Text(_)) => {
                    let Some(Segment::Text(b)) = self.segments.pop_front() else {
                        unreachable!("front was text")
                    };
                    if !b.is_empty() {
                        return Poll::Ready(Some(Ok(b)));
                    }
                }
                Some(Segment::Part(p)) => {
                    let mut out = String::with_capacity(PIECE_BYTES + PIECE_BYTES / 4);
                    let mut more = true;
                    while more && out.len() < PIECE_BYTES {
                        more = p.write_next(&mut out);
                    }
                    if !more {
                        self.segments.pop_front();
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Bytes::from(out))));
                    }
                }
            }
        }
    }
}

/// Writes a whole value of `pieces` into one string (what a streamed chunk or a test holds).
pub fn write_all(pieces: &mut dyn Pieces) -> String {
    let mut out = String::new();
    while pieces.write_next(&mut out) {}
    out
}
