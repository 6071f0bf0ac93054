//! `--spec`: speculative decoding on the command line, shared by `generate`, `bench` and
//! `serve`: the method (`off`, `ngram`, `self`, `draft:MODEL`), proposed tokens per step and the
//! policy that pauses it.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::spec::{SpecConfig, SpecMethod};

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: off, ngram (prompt lookup: no extra weights), self (the model's
    /// first layers and its output head draft), or draft:MODEL (a library model or GGUF file that
    /// shares the tokenizer). Greedy outputs are the same tokens as without; sampled ones keep
    /// the model's distribution.
    #[arg(long, default_value = "off", value_name = "METHOD")]
    pub spec: String,
    /// Most tokens proposed per request per step.
    #[arg(long, value_name = "K", default_value_t = 4)]
    pub spec_tokens: usize,
    /// Self-drafting: layers run before the early exit (0 = half the model's).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub spec_layers: usize,
    /// Policy: no proposals while more than this many requests run.
    #[arg(long, value_name = "N")]
    pub spec_max_batch: Option<usize>,
    /// Policy: pause proposals while the recent acceptance rate is below this (0..1).
    #[arg(long, value_name = "RATE")]
    pub spec_min_acceptance: Option<f64>,
    /// Verify every proposal. By default a request's proposal is verified only when the
    /// tokens it can expect to keep pay for the longer step (measured step times, its own
    /// recent acceptance), so speculation does not slow a stream down.
    #[arg(long)]
    pub spec_always: bool,
}

impl SpecArgs {
    /// The knobs, and the draft model loaded when the method names one.
    pub fn resolve(&self) -> Result<(SpecConfig, Option<Arc<LoadedModel>>)> {
        let (method, draft) = match self.spec.split_once(':') {
            Some((m, model)) if m.trim() == "draft" => {
                if model.trim().is_empty() {
                    bail!("--spec draft:MODEL needs a model");
                }
                let path = crate::model_args::resolve(model.trim(), None)?;
                let lm = LoadedModel::load(&path)
                    .with_context(|| format!("cannot load draft model {}", path.display()))?;
                (SpecMethod::Draft, Some(Arc::new(lm)))
            }
            Some(_) => bail!(
                "unknown --spec '{}' (off, ngram, self or draft:MODEL)",
                self.spec
            ),
            None => match self
                .spec
                .parse::<SpecMethod>()
                .map_err(anyhow::Error::msg)?
            {
                SpecMethod::Draft => bail!("--spec draft needs a model: draft:MODEL"),
                m => (m, None),
            },
        };
        let cfg = SpecConfig {
            method,
            num_tokens: self.spec_tokens,
            self_layers: self.spec_layers,
            max_batch: self.spec_max_batch,
            min_acceptance: self.spec_min_acceptance,
            payoff: !self.spec_always,
            ..SpecConfig::default()
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok((cfg, draft))
    }
}
