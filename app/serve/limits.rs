//! The server's limits, as `tpslab serve` flags: what one request may ask for (stop strings,
//! prompt bytes, `logit_bias`, priority range, body size) and what one connection may take
//! (first-byte, header, body and idle timeouts) and how many connections are served at once, in
//! all and from one address; the context a request may hold and its default answer length.

use std::time::Duration;

use clap::Args;

use super::errors::ApiError;

/// The priority the window submits its own chats at (lower runs first under the Priority
/// policy). API clients are held at or below it by default, so none outranks the chat.
pub const WINDOW_CHAT_PRIORITY: i32 = 0;

/// What one scored token with its alternatives takes in an answer's JSON, about (a token's
/// text, its id or bytes, its log-probability and rank, with the keys around them).
pub const LOGPROB_JSON_BYTES: usize = 64;

/// Every limit the server enforces. `Default` is what `tpslab serve` and the window use.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Request bodies larger than this get a 413.
    pub max_body_bytes: usize,
    /// Prompt text (completions) or message text (chat: roles and contents) before tokenizing.
    pub max_prompt_bytes: usize,
    /// Stop strings per request, and bytes in each.
    pub max_stop: usize,
    pub max_stop_bytes: usize,
    /// Entries in `logit_bias`.
    pub max_logit_bias: usize,
    /// Choices per request (`n`): each is one more sequence in the batch.
    pub max_n: usize,
    /// The prompt log-probabilities one answer may carry (`prompt_logprobs`, `echo` with
    /// `logprobs`), in bytes of JSON as estimated before the request runs: choices × prompt
    /// tokens × (alternatives + 1) × [`LOGPROB_JSON_BYTES`].
    pub max_prompt_logprob_bytes: usize,
    /// The `priority` values an API client may ask for (inclusive); others get a 400.
    pub min_priority: i32,
    pub max_priority: i32,
    /// From a connection's opening to its first byte (a silent connection is closed).
    pub first_byte_timeout: Duration,
    /// From a request's first byte to the end of its headers.
    pub header_timeout: Duration,
    /// From the end of the headers to the end of the body.
    pub body_timeout: Duration,
    /// A kept-alive connection with no request in flight is closed after this; so is one whose
    /// client stopped reading a response for this long.
    pub idle_timeout: Duration,
    /// Connections served at once; a newcomer past it evicts an idle one, or waits.
    pub max_connections: usize,
    /// Connections served at once from one IP address.
    pub max_connections_per_address: usize,
    /// Sequences (choices) one client may have in flight, waiting or running.
    pub client_max_seqs: usize,
    /// Tokens one client may have in flight (choices x (prompt + max_tokens)); `None`: 32
    /// contexts of the model.
    pub client_max_tokens: Option<usize>,
    /// Tokens one request may hold, prompt and answer (`-c`/`--ctx-size`); `None`: the model's
    /// context. Past it a request gets `context_length_exceeded`.
    pub ctx_size: Option<usize>,
    /// Tokens generated for a request that names no `max_tokens` (`-n`/`--n-predict`), at most
    /// what fits; `None`: as many as fit the context and the KV pool.
    pub default_max_tokens: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            max_prompt_bytes: 1 << 20,
            max_stop: 16,
            max_stop_bytes: 256,
            max_logit_bias: 300,
            max_n: 16,
            max_prompt_logprob_bytes: 16 << 20,
            min_priority: WINDOW_CHAT_PRIORITY,
            max_priority: i32::MAX,
            first_byte_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_connections_per_address: 128,
            client_max_seqs: 128,
            client_max_tokens: None,
            ctx_size: None,
            default_max_tokens: None,
        }
    }
}

impl Limits {
    /// Refuses `bytes` of prompt text in `param` past `--max-prompt-bytes`, before tokenizing.
    pub fn check_prompt_bytes(&self, param: &str, bytes: usize) -> Result<(), ApiError> {
        if bytes > self.max_prompt_bytes {
            return Err(ApiError::over_cap(
                param,
                format!(
                    "the {param} text is {bytes} bytes; this server takes at most {} \
                     (--max-prompt-bytes)",
                    self.max_prompt_bytes
                ),
            ));
        }
        Ok(())
    }

    /// The tokens one request may hold on a model of `model_ctx`: `--ctx-size`, at most that.
    pub fn context(&self, model_ctx: usize) -> usize {
        self.ctx_size.map_or(model_ctx, |c| c.min(model_ctx))
    }

    /// The answer's token budget for a prompt of `prompt` tokens: what was `asked`, else
    /// `--n-predict`, else (under `--ctx-size`) the rest of that context; `None` leaves it to
    /// the engine (as many as fit the model's context and the KV pool). `Err`, a message for
    /// `context_length_exceeded`, when prompt and answer do not fit `--ctx-size`.
    pub fn answer_tokens(
        &self,
        prompt: usize,
        asked: Option<usize>,
        model_ctx: usize,
    ) -> Result<Option<usize>, String> {
        let limit = self.context(model_ctx);
        let room = limit.saturating_sub(prompt);
        if self.ctx_size.is_none() {
            return Ok(asked.or(self.default_max_tokens.map(|n| n.min(room.max(1)))));
        }
        match asked {
            Some(m) if prompt.saturating_add(m) > limit => Err(format!(
                "this server's context holds {limit} tokens (--ctx-size), but the request asks \
                 for {}: {prompt} in the prompt and {m} to generate; shorten the prompt or \
                 lower max_tokens",
                prompt.saturating_add(m)
            )),
            Some(m) => Ok(Some(m)),
            None if room == 0 => Err(format!(
                "this server's context holds {limit} tokens (--ctx-size), and the prompt alone \
                 is {prompt}: none are left to generate"
            )),
            None => Ok(Some(self.default_max_tokens.map_or(room, |n| n.min(room)))),
        }
    }

    /// The priority of a request that names none: 0, moved into the allowed range.
    pub fn default_priority(&self) -> i32 {
        0.clamp(self.min_priority, self.max_priority.max(self.min_priority))
    }
}

/// Seconds as a flag value: a positive, finite number (fractions allowed).
fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s}: seconds must be in (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// The limits as `tpslab serve` flags (defaults: [`Limits::default`]).
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest request body, in bytes (413 past it).
    #[arg(long, default_value_t = Limits::default().max_body_bytes, value_parser = at_least_one)]
    pub max_body_bytes: usize,
    /// Largest prompt (or chat messages) in bytes, checked before tokenizing (400 past it).
    #[arg(long, default_value_t = Limits::default().max_prompt_bytes, value_parser = at_least_one)]
    pub max_prompt_bytes: usize,
    /// Most stop strings in one request.
    #[arg(long, default_value_t = Limits::default().max_stop)]
    pub max_stop: usize,
    /// Longest stop string, in bytes.
    #[arg(long, default_value_t = Limits::default().max_stop_bytes)]
    pub max_stop_bytes: usize,
    /// Most `logit_bias` entries in one request.
    #[arg(long, default_value_t = Limits::default().max_logit_bias)]
    pub max_logit_bias: usize,
    /// Most choices (`n`) in one request; each runs as its own sequence, sharing the prompt's
    /// KV blocks through the prefix cache.
    #[arg(long, default_value_t = Limits::default().max_n, value_parser = at_least_one)]
    pub max_n: usize,
    /// Most bytes of prompt log-probabilities (`prompt_logprobs`, `echo` with `logprobs`) one
    /// answer may carry, estimated before it runs (400 past it).
    #[arg(long, default_value_t = Limits::default().max_prompt_logprob_bytes, value_parser = at_least_one)]
    pub max_prompt_logprob_bytes: usize,
    /// Lowest (most urgent) `priority` an API client may ask for; the window's chat runs at 0,
    /// so the default lets no client outrank it. Requests outside the range get a 400.
    #[arg(long, default_value_t = Limits::default().min_priority, allow_hyphen_values = true)]
    pub min_priority: i32,
    /// Highest `priority` an API client may ask for.
    #[arg(long, default_value_t = Limits::default().max_priority, allow_hyphen_values = true)]
    pub max_priority: i32,
    /// Seconds a new connection may stay silent before it is closed.
    #[arg(long, default_value = "5", value_parser = seconds, value_name = "S")]
    pub first_byte_timeout: Duration,
    /// Seconds from a request's first byte to the end of its headers.
    #[arg(long, default_value = "10", value_parser = seconds, value_name = "S")]
    pub header_timeout: Duration,
    /// Seconds to receive a request body once its headers are in (408 past it).
    #[arg(long, default_value = "30", value_parser = seconds, value_name = "S")]
    pub body_timeout: Duration,
    /// Seconds a kept-alive connection may sit idle (or a client may stop reading) before it
    /// is closed.
    #[arg(long, default_value = "60", value_parser = seconds, value_name = "S")]
    pub idle_timeout: Duration,
    /// Connections served at once; a newcomer past it closes the longest idle one, or waits.
    #[arg(long, default_value_t = Limits::default().max_connections, value_parser = at_least_one)]
    pub max_connections: usize,
    /// Connections served at once from one IP address (past it: its idlest one is closed, or
    /// the newcomer gets a 503).
    #[arg(long, default_value_t = Limits::default().max_connections_per_address, value_parser = at_least_one)]
    pub max_connections_per_address: usize,
    /// Sequences (choices) one client (its bearer token, else its address) may have in flight;
    /// past it that client gets a 429.
    #[arg(long, default_value_t = Limits::default().client_max_seqs, value_parser = at_least_one)]
    pub client_max_seqs: usize,
    /// Tokens one client may have in flight, choices x (prompt + max_tokens), an omitted
    /// max_tokens counting as the rest of the context (default: 32 contexts of the model).
    #[arg(long, value_parser = at_least_one, value_name = "N")]
    pub client_max_tokens: Option<usize>,
    /// Tokens one request may hold, prompt and answer together (llama-server's `-c`); a request
    /// past it gets `context_length_exceeded`. Default: the model's context.
    #[arg(short = 'c', long, value_parser = at_least_one, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Tokens to generate when a request names no `max_tokens` (llama-server's `-n`), at most
    /// what fits its context. Default: as many as fit.
    #[arg(short = 'n', long, value_parser = at_least_one, value_name = "N")]
    pub n_predict: Option<usize>,
}

impl LimitArgs {
    pub fn limits(&self) -> Result<Limits, String> {
        if self.min_priority > self.max_priority {
            return Err(format!(
                "--min-priority {} is above --max-priority {}",
                self.min_priority, self.max_priority
            ));
        }
        Ok(Limits {
            max_body_bytes: self.max_body_bytes,
            max_prompt_bytes: self.max_prompt_bytes,
            max_stop: self.max_stop,
            max_stop_bytes: self.max_stop_bytes,
            max_logit_bias: self.max_logit_bias,
            max_n: self.max_n,
            max_prompt_logprob_bytes: self.max_prompt_logprob_bytes,
            min_priority: self.min_priority,
            max_priority: self.max_priority,
            first_byte_timeout: self.first_byte_timeout,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
            client_max_seqs: self.client_max_seqs,
            client_max_tokens: self.client_max_tokens,
            ctx_size: self.ctx_size,
            default_max_tokens: self.n_predict,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_positive_and_finite() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["0", "-1", "inf", "NaN", "x", "1e9"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_answer_fits_the_context_the_operator_set() {
        let mut l = Limits::default();
        assert_eq!(l.answer_tokens(10, None, 100), Ok(None));
        assert_eq!(l.answer_tokens(10, Some(500), 100), Ok(Some(500)));
        l.default_max_tokens = Some(5);
        assert_eq!(l.answer_tokens(10, None, 100), Ok(Some(5)));
        assert_eq!(l.answer_tokens(98, None, 100), Ok(Some(2)));
        l.ctx_size = Some(40);
        assert_eq!(l.answer_tokens(10, Some(30), 100), Ok(Some(30)));
        assert!(l.answer_tokens(10, Some(31), 100).is_err());
        assert_eq!(l.answer_tokens(38, None, 100), Ok(Some(2)));
        assert!(l.answer_tokens(40, None, 100).is_err());
        l.default_max_tokens = None;
        assert_eq!(l.answer_tokens(10, None, 100), Ok(Some(30)));
        // A context past the model's is the model's.
        l.ctx_size = Some(1000);
        assert_eq!(l.answer_tokens(10, None, 100), Ok(Some(90)));
    }

    #[test]
    fn the_default_priority_is_inside_the_range() {
        let mut l = Limits::default();
        assert_eq!(l.default_priority(), 0);
        l.min_priority = 5;
        assert_eq!(l.default_priority(), 5);
        l.min_priority = -10;
        l.max_priority = -3;
        assert_eq!(l.default_priority(), -3);
    }
}
