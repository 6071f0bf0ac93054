//! Fill-in-the-middle prompts: the gap a completions body asks to fill (`suffix`, or
//! llama-server's `input_prefix`, `input_suffix`, `input_extra` with an optional `prompt`), for
//! models whose vocabulary has FIM tokens, built as llama-server's `format_infill` builds it:
//!
//! ```text
//! [FIM_REP]myproject\n ([FIM_SEP]filename\n extra text)... [FIM_SEP]filename\n
//! [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]
//! ```
//!
//! the prefix cut to its last 3/4 of a batch, the suffix to its first 1/4 (less the prompt),
//! the extra context to what the context leaves; a model without the tokens gets a 400 naming
//! the ones it lacks.

use serde_json::Value;
use tpslab_engine::model::LoadedModel;

use super::errors::ApiError;
use super::limits::Limits;

/// llama-server's default batch (`n_batch`), which bounds the prefix and suffix it takes.
const FIM_BATCH: usize = 2048;

/// One file of `input_extra`: context placed before the prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtraChunk {
    pub filename: String,
    pub text: String,
}

/// What a request asks to fill: the gap between `prefix` (then `prompt`) and `suffix`.
#[derive(Debug, Clone, PartialEq)]
pub struct Infill {
    /// The field the request named it by, for errors (`suffix` or `input_prefix`).
    pub field: &'static str,
    pub prefix: String,
    pub prompt: String,
    pub suffix: String,
    pub extra: Vec<ExtraChunk>,
}

fn text_field(body: &Value, field: &str) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_param(
            field,
            format!("{field} must be a string"),
        )),
    }
}

fn extra_chunks(body: &Value) -> Result<Vec<ExtraChunk>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "input_extra",
            "input_extra must be a list of {\"filename\": string, \"text\": string}",
        )
    };
    match body.get("input_extra") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|c| {
                let s = |k: &str, default: &str| match c.get(k) {
                    None | Some(Value::Null) => Ok(default.to_string()),
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(_) => Err(bad()),
                };
                if !c.is_object() {
                    return Err(bad());
                }
                Ok(ExtraChunk {
                    filename: s("filename", "tmp")?,
                    text: s("text", "")?,
                })
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// The gap a completions body asks to fill, if any: llama-server's `input_prefix` (what
/// `/infill` sends, with `prompt` after the prefix), or OpenAI's `suffix` after the prompt text
/// (an empty `suffix` asks for nothing). Checked against the prompt byte cap.
pub fn asked(
    body: &Value,
    prompt_text: Option<&str>,
    limits: &Limits,
) -> Result<Option<Infill>, ApiError> {
    let infill = if let Some(prefix) = text_field(body, "input_prefix")? {
        Infill {
            field: "input_prefix",
            prefix,
            prompt: prompt_text.unwrap_or_default().to_string(),
            suffix: text_field(body, "input_suffix")?.unwrap_or_default(),
            extra: extra_chunks(body)?,
        }
    } else {
        match text_field(body, "suffix")? {
            Some(suffix) if !suffix.is_empty() => {
                let Some(prefix) = prompt_text else {
                    return Err(ApiError::bad_param(
                        "suffix",
                        "suffix needs the prompt as text (the part before the gap), not token ids",
                    ));
                };
                Infill {
                    field: "suffix",
                    prefix: prefix.to_string(),
                    prompt: String::new(),
                    suffix,
                    extra: Vec::new(),
                }
            }
            _ => return Ok(None),
        }
    };
    let bytes = [&infill.prefix, &infill.prompt, &infill.suffix]
        .iter()
        .map(|s| s.len())
        .chain(infill.extra.iter().map(|c| c.filename.len() + c.text.len()))
        .fold(0usize, usize::saturating_add);
    limits.check_prompt_bytes(infill.field, bytes)?;
    Ok(Some(infill))
}

/// The prompt tokens of `inf` for `lm` (llama-server's `format_infill`), under the server's
/// context, for an answer of `max_tokens` (`None`: llama-server's -1, unbounded).
pub fn prompt_tokens(
    lm: &LoadedModel,
    inf: &Infill,
    limits: &Limits,
    max_tokens: Option<usize>,
) -> Result<Vec<u32>, ApiError> {
    let n_ctx = limits.context(lm.model.cfg.context_len);
    let tok = &lm.tokenizer;
    let ids = tok.fim_ids();
    let (Some(pre), Some(suf), Some(mid)) = (ids.prefix, ids.suffix, ids.middle) else {
        let missing: Vec<&str> = [
            ("prefix", ids.prefix),
            ("suffix", ids.suffix),
            ("middle", ids.middle),
        ]
        .iter()
        .filter(|(_, id)| id.is_none())
        .map(|(n, _)| *n)
        .collect();
        return Err(ApiError::bad_param(
            inf.field,
            format!(
                "this model cannot fill in the middle: its vocabulary has no FIM {} token \
                 (tokenizer.ggml.fim_pre_token_id and the like, or <|fim_prefix|>-style \
                 tokens); serve a code model trained for it, such as Qwen2.5-Coder",
                missing.join(", ")
            ),
        ));
    };
    let enc = |t: &str| {
        tok.encode(t, false)
            .map_err(|e| ApiError::bad_param(inf.field, e.to_string()))
    };
    let mut extra = Vec::new();
    if let Some(rep) = ids.repo {
        extra.push(rep);
        extra.extend(enc("myproject\n")?);
    }
    for chunk in &inf.extra {
        match ids.file_sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(enc(&format!("{}\n", chunk.filename))?);
            }
            None => extra.extend(enc("\n\n--- snippet ---\n\n")?),
        }
        extra.extend(enc(&chunk.text)?);
    }
    if let Some(sep) = ids.file_sep {
        extra.push(sep);
        extra.extend(enc("filename\n")?);
    }
    let mut prefix = enc(&inf.prefix)?;
    let mut suffix = enc(&inf.suffix)?;
    let prompt = enc(&inf.prompt)?;
    let prefix_take = prefix.len().min(3 * (FIM_BATCH / 4));
    let suffix_take = suffix
        .len()
        .min((FIM_BATCH / 4).saturating_sub(2 + prompt.len()));
    // llama-server's max(0, n_ctx - n_batch - 2 * n_predict), its -1 (no limit) counting as -1.
    let room = match max_tokens {
        Some(n) => n_ctx
            .saturating_sub(FIM_BATCH)
            .saturating_sub(n.saturating_mul(2)),
        None => (n_ctx + 2).saturating_sub(FIM_BATCH),
    };
    let extra_take = room.min(extra.len());
    prefix.drain(..prefix.len() - prefix_take);
    suffix.truncate(suffix_take);
    let mut out = Vec::with_capacity(extra_take + prefix.len() + suffix.len() + prompt.len() + 4);
    out.extend_from_slice(&extra[extra.len() - extra_take..]);
    if tok.add_bos()
        && let Some(bos) = tok.bos_id()
    {
        out.push(bos);
    }
    out.push(pre);
    out.extend(prefix);
    out.extend(prompt);
    out.push(suf);
    out.extend(suffix);
    out.push(mid);
    Ok(out)
}
