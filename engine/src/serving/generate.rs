//! A loaded model bundle (weights, tokenizer, chat template) and the single-request generation
//! loop: the batch-of-one case of the engine, used by `tpslab generate` and the benchmarks.

use std::sync::{Arc, mpsc};
use std::time::Instant;

use serde::Serialize;

use crate::device::DeviceChoice;
use crate::kv::KvTypes;
use crate::model::ModelError;
use crate::model::loaded::{LoadError, LoadedModel};
use crate::sched::ClientId;
use crate::sched::stop::{FinishReason, StopCriteria};
use crate::serving::admission::Admission;
use crate::serving::engine::{
    EngineConfig, EngineError, EngineHandle, Event, Knobs, KvSettings, Refusal, Request,
};
use crate::serving::sampler::SamplingParams;
use crate::serving::spec_metrics::SpecUsage;
use crate::spec::SpecConfig;
use crate::text::chat::ChatError;
use crate::text::tokenizer::TokenizerError;

/// KV block size of the single-request path (the engine's default too).
pub const BLOCK_SIZE: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Chat(#[from] ChatError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The request's refusal, as the window and the server show it too.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A prompt refused before it was tokenized (past the context by its bytes alone).
    #[error(transparent)]
    Prompt(LoadError),
}

impl From<LoadError> for GenerateError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Model(e) => Self::Model(e),
            LoadError::Tokenizer(e) => Self::Tokenizer(e),
            LoadError::Chat(e) => Self::Chat(e),
            e @ LoadError::PastContext { .. } => Self::Prompt(e),
        }
    }
}

/// The stop rule a plain request gets (here, since stop rules are the scheduler's and the model
/// bundle sits below it).
impl LoadedModel {
    /// The stop criteria a plain request gets: the model's stop tokens and a token limit.
    pub fn default_stop(&self, max_tokens: Option<usize>) -> StopCriteria {
        StopCriteria::new(max_tokens, self.tokenizer.stop_token_ids())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GenerateOutput {
    pub prompt_token_ids: Vec<u32>,
    pub output_token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Request start (tokens in hand) to the first generated token.
    pub ttft_ms: f64,
    /// Prompt tokens over the prefill time (the TTFT).
    pub prefill_tokens_per_s: f64,
    /// 1 / TPOT: (output tokens - 1) over the time from first to last token; 0 with < 2 tokens.
    pub decode_tokens_per_s: f64,
    pub e2e_ms: f64,
    /// Speculative decoding's proposals (zeros without).
    pub spec: SpecUsage,
    /// The element types the KV cache held K and V in (every figure carries its precision).
    pub kv_types: KvTypes,
}

/// Where and how a single request runs: the device, CPU threads, speculative decoding.
#[derive(Debug, Clone, Default)]
pub struct GenerateSetup {
    pub device: DeviceChoice,
    pub threads: usize,
    pub spec: SpecConfig,
    /// The draft model of [`crate::spec::SpecMethod::Draft`].
    pub draft: Option<Arc<LoadedModel>>,
    /// See [`EngineConfig::cpu_moe_layers`].
    pub cpu_moe_layers: usize,
    /// The KV cache's element types (`--cache-type-k/-v`).
    pub kv_types: KvTypes,
}

/// Generates for one prompt on the CPU, calling `on_text` with each piece of text as it becomes
/// final: the batch-of-one case of the engine (an engine thread is started for the request).
pub fn generate(
    lm: &Arc<LoadedModel>,
    threads: usize,
    prompt: &[u32],
    sampling: &SamplingParams,
    stop: StopCriteria,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, GenerateError> {
    generate_on(
        lm,
        DeviceChoice::Cpu,
        threads,
        prompt,
        sampling,
        stop,
        on_text,
    )
}

/// As [`generate`], on `device`.
pub fn generate_on(
    lm: &Arc<LoadedModel>,
    device: DeviceChoice,
    threads: usize,
    prompt: &[u32],
    sampling: &SamplingParams,
    stop: StopCriteria,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, GenerateError> {
    let setup = GenerateSetup {
        device,
        threads,
        ..GenerateSetup::default()
    };
    generate_with(lm, &setup, prompt, sampling, stop, on_text)
}

/// As [`generate`], as `setup` says.
pub fn generate_with(
    lm: &Arc<LoadedModel>,
    setup: &GenerateSetup,
    prompt: &[u32],
    sampling: &SamplingParams,
    stop: StopCriteria,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, GenerateError> {
    let req = Request {
        prompt: prompt.to_vec(),
        sampling: sampling.clone(),
        stop,
        priority: 0,
        client: ClientId::LOCAL,
        constraint: None,
        logprobs: None,
        prompt_logprobs: None,
        embed: None,
    };
    generate_request(lm, setup, req, on_text)
}

/// As [`generate_with`], for a whole request (a structured-output constraint, a priority).
pub fn generate_request(
    lm: &Arc<LoadedModel>,
    setup: &GenerateSetup,
    req: Request,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, GenerateError> {
    let cfg = &lm.model.cfg;
    let prompt = req.prompt.clone();
    // The engine's own admission, asked before there is a pool, sizes one that holds exactly
    // this request (the engine then admits it against that pool).
    let max_new = Admission::for_model(cfg).check(&req)?.max_tokens;
    let types = setup.kv_types;
    let kv = KvSettings {
        budget_bytes: types.budget_for_tokens(cfg, BLOCK_SIZE, prompt.len() + max_new),
        block_size: BLOCK_SIZE,
        types,
    };
    let knobs = Knobs {
        kv,
        spec: setup.spec.clone(),
        ..Knobs::default()
    };
    let config = EngineConfig {
        threads: setup.threads,
        knobs,
        device: setup.device,
        gpu_kv_fraction: 0.0,
        cpu_moe_layers: setup.cpu_moe_layers,
        draft: setup.draft.clone(),
    };
    let engine = EngineHandle::start(Arc::clone(lm), config, None)?;
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    engine.submit(req, tx);
    let mut output = Vec::new();
    let mut text = String::new();
    let (mut first, mut last) = (None, start);
    let mut emit = |t: &str, text: &mut String| {
        if !t.is_empty() {
            on_text(t);
            text.push_str(t);
        }
    };
    let spec;
    let finish_reason = loop {
        match rx.recv() {
            Ok(Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. }) => {}
            Ok(Event::Token { token, text: t, .. }) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                output.push(token);
                emit(&t, &mut text);
            }
            Ok(Event::Finished {
                reason,
                text: t,
                usage,
                ..
            }) => {
                emit(&t, &mut text);
                spec = usage.spec;
                break reason;
            }
            Ok(Event::Refused { reason, .. }) => return Err(reason.into()),
            Err(_) => return Err(Refusal::Stopped.into()),
        }
    };
    let first = first.unwrap_or(last);
    let ttft = first.duration_since(start).as_secs_f64();
    let decode_s = last.duration_since(first).as_secs_f64();
    Ok(GenerateOutput {
        prompt_token_ids: prompt.to_vec(),
        ttft_ms: ttft * 1e3,
        prefill_tokens_per_s: prompt.len() as f64 / ttft.max(1e-9),
        decode_tokens_per_s: if output.len() > 1 && decode_s > 0.0 {
            (output.len() - 1) as f64 / decode_s
        } else {
            0.0
        },
        e2e_ms: last.duration_since(start).as_secs_f64() * 1e3,
        output_token_ids: output,
        text,
        finish_reason,
        spec,
        kv_types: types,
    })
}
