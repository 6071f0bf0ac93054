//! `tpslab generate`: one prompt's text streamed to stdout (or one JSON object with `--json`).

use std::io::Write;

use anyhow::{Context, Result};
use clap::Args;
use tpslab_engine::sched::ClientId;
use tpslab_engine::serving::constraint::{Grammar, compiler_for};
use tpslab_engine::serving::engine::{Refusal, Request};
use tpslab_engine::serving::generate::{GenerateSetup, generate_request};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::ChatMessage;

use crate::kv_args::KvTypeArgs;
use crate::model_args::ModelArgs;
use crate::spec_args::SpecArgs;

/// `tpslab generate`'s arguments: the prompt, sampling and stopping.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat (otherwise the template's default applies).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate (`-n`/`--n-predict` as llama.cpp spells it).
    #[arg(short = 'n', long, visible_alias = "n-predict", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[arg(
        long,
        visible_alias = "temp",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop generating at this string (repeatable); it is not included in the output.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Don't stop at end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (token ids, text, finish reason, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Structured output: the text is JSON valid against the schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["grammar", "regex"])]
    pub json_schema: Option<std::path::PathBuf>,
    /// Structured output: the text follows the grammar in FILE (GBNF when it has `::=` rules,
    /// llguidance's Lark otherwise).
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    pub grammar: Option<std::path::PathBuf>,
    /// Structured output: the text matches this regular expression.
    #[arg(long, value_name = "R")]
    pub regex: Option<String>,
    #[command(flatten)]
    pub kv: KvTypeArgs,
}

/// The constraint the flags ask for, read and checked before the model loads.
fn asked_grammar(a: &GenerateArgs) -> Result<Option<Grammar>> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
    };
    Ok(if let Some(p) = &a.json_schema {
        let schema = serde_json::from_str(&read(p)?)
            .with_context(|| format!("{} is not valid JSON", p.display()))?;
        Some(Grammar::json_schema(schema))
    } else if let Some(p) = &a.grammar {
        Some(Grammar::from_grammar_text(&read(p)?))
    } else {
        a.regex.clone().map(Grammar::Regex)
    })
}

pub fn run(a: &GenerateArgs) -> Result<()> {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        frequency_penalty: a.frequency_penalty,
        presence_penalty: a.presence_penalty,
        seed: a.seed,
        logit_bias: Vec::new(),
    };
    sampling.validate()?;
    let grammar = asked_grammar(a)?;
    if a.prompt.is_empty() {
        // Before the model loads; the engine's admission says it the same way for tokens.
        return Err(Refusal::EmptyPrompt.into());
    }
    let lm = a.model.load()?;
    if lm.is_synthetic() {
        eprintln!(
            "note: {} has random weights; the text is noise",
            lm.path.display()
        );
    }
    let prompt = if a.chat {
        let mut messages = Vec::new();
        if let Some(s) = &a.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(a.prompt.clone()));
        lm.chat_prompt(&messages)?
    } else {
        lm.raw_prompt(&a.prompt)?
    };
    let mut stop = lm.default_stop(Some(a.max_tokens as usize));
    stop.stop_strings = a.stop.clone();
    stop.ignore_eos = a.ignore_eos;
    let stdout = std::io::stdout();
    let json = a.json;
    let mut on_text = |t: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        }
    };
    let constraint = match &grammar {
        Some(g) => Some(compiler_for(&lm.tokenizer)?.compile(g)?),
        None => None,
    };
    let req = Request {
        prompt,
        sampling,
        stop,
        priority: 0,
        client: ClientId::LOCAL,
        constraint,
        logprobs: None,
        prompt_logprobs: None,
        embed: None,
    };
    let (spec, draft) = a.spec.resolve()?;
    let setup = GenerateSetup {
        device: a.model.device,
        threads: a.model.threads,
        spec,
        draft,
        cpu_moe_layers: a.model.cpu_moe_layers(),
        kv_types: a.kv.types(),
    };
    let out = generate_request(&lm, &setup, req, &mut on_text)?;
    if json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {}; TTFT {:.1} ms, decode {:.1} tok/s; {} threads, {}]",
            out.prompt_token_ids.len(),
            out.output_token_ids.len(),
            out.finish_reason,
            out.ttft_ms,
            out.decode_tokens_per_s,
            a.model.n_threads(),
            lm.precision,
        );
        if let Some(rate) = out.spec.acceptance_rate() {
            eprintln!(
                "[speculation {}: {} of {} proposed tokens accepted ({:.0}%), {:.2} tokens per step, propose {:.2} ms and verify {:.2} ms a verified step]",
                setup.spec.method,
                out.spec.accepted_tokens,
                out.spec.draft_tokens,
                rate * 100.0,
                out.spec.mean_acceptance_length().unwrap_or(1.0),
                out.spec.propose_ms_per_draft().unwrap_or(0.0),
                out.spec.verify_ms_per_draft().unwrap_or(0.0),
            );
        }
    }
    Ok(())
}
