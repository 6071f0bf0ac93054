//! A loaded model bundle (weights, tokenizer, chat template) and the single-request generation
//! loop: the batch-of-one case of the engine, used by `tpslab generate` and the benchmarks.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tpslab_kernels::ThreadPool;

use crate::chat::{ChatError, ChatMessage, ChatTemplate};
use crate::kv::{Batch, KvCache, KvError};
use crate::model::{Model, ModelError, Workspace};
use crate::sampler::{Sampler, SamplingParams};
use crate::stop::{FinishReason, StopChecker, StopCriteria};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::detok::Detokenizer;

/// Prompt tokens computed per forward call during prefill: bounds activation memory.
pub const PREFILL_CHUNK: usize = 512;
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
    Kv(#[from] KvError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; the model's context holds {context}, leaving no room to generate")]
    PromptTooLong { prompt: usize, context: usize },
}

/// Everything needed to turn text into tokens and tokens into logits.
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Weight precision of the matrices, as in the file (e.g. "Q4_1").
    pub precision: String,
}

impl LoadedModel {
    pub fn load(path: &Path) -> Result<Self, GenerateError> {
        let (model, file) = Model::load(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file, &tokenizer)?;
        let precision = dominant_type(&file);
        Ok(Self { path: path.to_path_buf(), model, tokenizer, template, precision })
    }

    /// Prompt tokens for raw text: no template, BOS only if the model's metadata asks for it.
    pub fn raw_prompt(&self, text: &str) -> Result<Vec<u32>, GenerateError> {
        Ok(self.tokenizer.encode_prompt(text, false)?)
    }

    /// Prompt tokens for a conversation, through the model's chat template.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, GenerateError> {
        let text = self.template.render(messages, true)?;
        // The template writes BOS itself where the model wants one.
        Ok(self.tokenizer.encode(&text, true)?)
    }

    /// The stop criteria a plain request gets: the model's stop tokens and a token limit.
    pub fn default_stop(&self, max_tokens: Option<usize>) -> StopCriteria {
        StopCriteria::new(max_tokens, self.tokenizer.stop_token_ids())
    }
}

/// The type holding most matrix bytes: what a user calls the model's precision.
fn dominant_type(file: &crate::gguf::GgufFile) -> String {
    let mut by_type: Vec<(crate::gguf::GgmlType, u64)> = Vec::new();
    for t in file.tensors.iter().filter(|t| t.dims.len() >= 2) {
        match by_type.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, n)) => *n += t.size,
            None => by_type.push((t.ty, t.size)),
        }
    }
    by_type.iter().max_by_key(|(_, n)| *n).map_or("unknown".into(), |(ty, _)| ty.name().into())
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
}

/// Generates for one prompt, calling `on_text` with each piece of text as it becomes final.
pub fn generate(
    lm: &LoadedModel,
    pool: &ThreadPool,
    prompt: &[u32],
    sampling: &SamplingParams,
    stop: StopCriteria,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, GenerateError> {
    let start = Instant::now();
    let cfg = &lm.model.cfg;
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if prompt.len() >= cfg.context_len {
        return Err(GenerateError::PromptTooLong { prompt: prompt.len(), context: cfg.context_len });
    }
    let room = cfg.context_len - prompt.len();
    let max_new = stop.max_tokens.map_or(room, |m| m.min(room));
    let mut stop = stop;
    stop.max_tokens = Some(max_new);
    let total = prompt.len() + max_new;
    let table: Vec<u32> = (0..total.div_ceil(BLOCK_SIZE) as u32).collect();
    let mut kv = KvCache::new(cfg, BLOCK_SIZE, table.len())?;
    let mut ws = Workspace::default();
    let mut sampler = Sampler::new(sampling);
    let mut checker = StopChecker::new(stop);
    let mut detok = Detokenizer::new(true);

    let mut history: Vec<u32> = prompt.to_vec();
    let mut text = String::new();
    let mut first_token_at = None;
    let mut last_token_at = start;
    let mut pos = 0;
    let mut finish = None;
    let mut logits = Vec::new();
    while finish.is_none() {
        // Prefill in chunks, then one token per step; only the last position needs logits.
        let end = if pos < prompt.len() { (pos + PREFILL_CHUNK).min(prompt.len()) } else { pos + 1 };
        let mut batch = Batch::default();
        batch.push_seq(table.clone(), pos, &history[pos..end], end == history.len());
        let out = lm.model.forward(pool, &batch, &mut kv, &mut ws)?;
        pos = end;
        if pos < history.len() {
            continue;
        }
        logits.clear();
        logits.extend_from_slice(out);
        let tok = sampler.sample_with_prompt(&mut logits, &history, prompt.len());
        let now = Instant::now();
        first_token_at.get_or_insert(now);
        last_token_at = now;
        history.push(tok);
        let piece = detok.push(&lm.tokenizer, tok)?;
        let step = checker.push(tok, &piece);
        if !step.text.is_empty() {
            on_text(&step.text);
            text.push_str(&step.text);
        }
        finish = step.finish;
    }
    let tail = checker.flush(&detok.finish());
    if !tail.text.is_empty() {
        on_text(&tail.text);
        text.push_str(&tail.text);
    }
    let output = history[prompt.len()..].to_vec();
    let first = first_token_at.unwrap_or(last_token_at);
    let ttft = first.duration_since(start).as_secs_f64();
    let decode_s = last_token_at.duration_since(first).as_secs_f64();
    Ok(GenerateOutput {
        prompt_token_ids: prompt.to_vec(),
        ttft_ms: ttft * 1e3,
        prefill_tokens_per_s: prompt.len() as f64 / ttft.max(1e-9),
        decode_tokens_per_s: if output.len() > 1 && decode_s > 0.0 {
            (output.len() - 1) as f64 / decode_s
        } else {
            0.0
        },
        e2e_ms: last_token_at.duration_since(start).as_secs_f64() * 1e3,
        output_token_ids: output,
        text,
        finish_reason: finish.unwrap_or(FinishReason::Length),
    })
}
