//! What every handler shares: the engine, the model, the key, the limits and the metrics; and
//! whom a request counts against ([`client_of`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::pooling::Pooling;
use tpslab_engine::sched::ClientId;
use tpslab_engine::serving::engine::EngineHandle;

use super::browser::BrowserPolicy;
use super::errors::ApiError;
use super::limits::Limits;
use super::metrics::ServerMetrics;
use super::openai::ModelShape;
use super::share::{Share, Shares};

/// Everything a handler needs; shared by all connections.
pub struct ServerState {
    pub engine: EngineHandle,
    pub lm: Arc<LoadedModel>,
    /// The id `/v1/models` lists first; requests may name it or any alias.
    pub model_id: String,
    /// Names the model is listed and accepted under besides `model_id` (`--alias`).
    pub listed_aliases: Vec<String>,
    /// Names requests may use that are not listed (what `--model` was given as).
    pub aliases: Vec<String>,
    pub api_key: Option<String>,
    /// `/metrics` without the key even when one is set.
    pub metrics_open: bool,
    pub limits: Limits,
    /// Which web pages may call the server (the `Host` and `Origin` guards, CORS).
    pub browser: BrowserPolicy,
    pub metrics: Arc<ServerMetrics>,
    pub created: u64,
    /// What each client holds in flight (its share, [`super::share`]).
    pub shares: Arc<Shares>,
    /// Requests parsing, rendering or tokenizing at once (each holds its prompt several times
    /// over, and a big one takes seconds): the rest wait for a slot without holding a thread.
    pub prepare: Arc<Semaphore>,
    /// How `/v1/embeddings` pools a prompt's states (`--pooling`, else the file's rule, else
    /// `last`).
    pub pooling: Pooling,
}

/// What a front end chooses for its server (`tpslab serve`'s flags, the window's API server
/// settings): the names it lists besides the model id, which web pages may call it, and its
/// limits.
#[derive(Default)]
pub struct ServerChoices {
    pub listed_aliases: Vec<String>,
    pub browser: BrowserPolicy,
    pub limits: Limits,
    /// `--pooling`: the embedding rule over the file's.
    pub pooling: Option<Pooling>,
}

impl ServerState {
    /// State over a running engine as a front end chose it.
    pub fn configured(
        engine: EngineHandle,
        lm: Arc<LoadedModel>,
        api_key: Option<String>,
        c: ServerChoices,
    ) -> Self {
        let pooling = pooling_rule(c.pooling, &lm);
        Self {
            listed_aliases: c.listed_aliases,
            browser: c.browser,
            limits: c.limits,
            pooling,
            ..Self::new(engine, lm, api_key)
        }
    }

    /// State over a running engine; the model id is the file's stem.
    pub fn new(engine: EngineHandle, lm: Arc<LoadedModel>, api_key: Option<String>) -> Self {
        let model_id = lm
            .path
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
        Self {
            metrics: Arc::new(ServerMetrics::new(&model_id)),
            engine,
            aliases: Vec::new(),
            listed_aliases: Vec::new(),
            model_id,
            api_key,
            metrics_open: false,
            limits: Limits::default(),
            browser: BrowserPolicy::default(),
            created: unix_now(),
            shares: Arc::new(Shares::default()),
            prepare: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
            )),
            pooling: pooling_rule(None, &lm),
            lm,
        }
    }

    /// A client's share of what is in flight, under the limits.
    pub fn share(&self) -> Share {
        Share {
            seqs: self.limits.client_max_seqs,
            tokens: self
                .limits
                .client_max_tokens
                .unwrap_or_else(|| self.context_len().saturating_mul(32)),
        }
    }

    /// The tokens one request may hold, prompt and answer: the model's context, or less under
    /// `--ctx-size`.
    pub fn context_len(&self) -> usize {
        self.limits.context(self.lm.model.cfg.context_len)
    }

    /// Every name `/v1/models` lists: the model id, then each alias not already listed.
    pub fn listed_names(&self) -> impl Iterator<Item = &str> {
        let mut seen: Vec<&str> = Vec::new();
        std::iter::once(self.model_id.as_str())
            .chain(self.listed_aliases.iter().map(String::as_str))
            .filter(move |n| {
                let new = !seen.contains(n);
                seen.push(n);
                new
            })
    }

    /// What the request checks need to know of the model.
    pub fn shape(&self) -> ModelShape {
        ModelShape {
            context_len: self.lm.model.cfg.context_len,
            vocab: self.lm.model.cfg.vocab,
        }
    }

    pub(crate) fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        match asked {
            None => Ok(()),
            Some(m)
                if self.listed_names().any(|n| n == m) || self.aliases.iter().any(|a| a == m) =>
            {
                Ok(())
            }
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }
}

/// The embedding rule a server uses: the one asked for, else the file's, else `last`.
fn pooling_rule(asked: Option<Pooling>, lm: &LoadedModel) -> Pooling {
    asked
        .or(lm.model.cfg.extras.pooling)
        .unwrap_or(Pooling::Last)
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The address a request came from, put on it by the connection layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub IpAddr);

/// Whom a request counts against for its fair share of the batch: the bearer token it sent
/// (checked or not: minting tokens only splits a client's own share), else its address; never
/// [`ClientId::LOCAL`], the window's own user.
pub fn client_of(headers: &HeaderMap, peer: Option<Peer>) -> ClientId {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let mut h = Sha256::new();
    match (token, peer) {
        (Some(t), _) => {
            h.update(b"key:");
            h.update(t.as_bytes());
        }
        (None, Some(Peer(ip))) => {
            h.update(b"ip:");
            h.update(ip.to_string().as_bytes());
        }
        (None, None) => h.update(b"anonymous"),
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    ClientId(u64::from_le_bytes(b).max(1))
}
