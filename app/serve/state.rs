//! What every handler shares: the engine, the model, the key, the limits and the metrics.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::engine::EngineHandle;

use super::errors::ApiError;
use super::limits::Limits;
use super::metrics::ServerMetrics;
use super::openai::ModelShape;

/// Everything a handler needs; shared by all connections.
pub struct ServerState {
    pub engine: EngineHandle,
    pub lm: Arc<LoadedModel>,
    /// The id `/v1/models` lists; requests may name it or any alias.
    pub model_id: String,
    pub aliases: Vec<String>,
    pub api_key: Option<String>,
    /// `/metrics` without the key even when one is set.
    pub metrics_open: bool,
    pub limits: Limits,
    pub metrics: Arc<ServerMetrics>,
    pub created: u64,
    /// Requests parsing, rendering or tokenizing at once (each holds its prompt several times
    /// over, and a big one takes seconds): the rest wait for a slot without holding a thread.
    pub prepare: Arc<Semaphore>,
}

impl ServerState {
    /// State over a running engine; the model id is the file's stem.
    pub fn new(engine: EngineHandle, lm: Arc<LoadedModel>, api_key: Option<String>) -> Self {
        let model_id = lm
            .path
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
        Self {
            metrics: Arc::new(ServerMetrics::new(&model_id)),
            engine,
            lm,
            aliases: Vec::new(),
            model_id,
            api_key,
            metrics_open: false,
            limits: Limits::default(),
            created: unix_now(),
            prepare: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
            )),
        }
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
            Some(m) if m == self.model_id || self.aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
