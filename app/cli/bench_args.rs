//! `tpslab bench`'s arguments (both modes) and what both modes report with: `--goodput`'s
//! objectives and the report's date.

use clap::Args;

use crate::kv_args::KvArgs;
use crate::model_args::ModelArgs;
use crate::spec_args::SpecArgs;

/// Two modes: the serving benchmark (default: many concurrent requests through the engine,
/// vLLM's figures), or single-stream prompt/decode speed when `--pp` or `--tg` is given.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The prompts: `free` (windows of the bundled text: free writing) or `copy` (a passage
    /// and then its start again, so the continuation repeats it: editing and quoting work).
    #[arg(long, default_value = "free", value_parser = ["free", "copy"])]
    pub workload: String,
    /// Sampling temperature of the requests (0: greedy). Sampled text repeats itself less
    /// than greedy text, so speculation's proposals are kept less often.
    #[arg(long, visible_alias = "temp", default_value_t = 0.0)]
    pub temperature: f32,
    /// Concurrency levels to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Poisson arrivals at this many requests per second (default: all at once).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Requests per level (default: as many as the concurrency, so all start together).
    #[arg(long)]
    pub num_requests: Option<usize>,
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Scheduler cap on sequences per step (default: at least the concurrency).
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Scheduler token budget per step.
    #[arg(long)]
    pub max_batched_tokens: Option<usize>,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Single-stream mode: prompt lengths to measure prompt processing at (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub pp: Option<Vec<usize>>,
    /// Single-stream mode: tokens to decode (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub tg: Option<Vec<usize>>,
    /// Single-stream mode: repetitions of each test; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// Also write every figure and the settings as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Drive a remote OpenAI-compatible server instead of the in-process engine (vLLM, SGLang,
    /// TGI, llama.cpp's server, `tpslab serve`): http(s)://host:port. `--model` then names the
    /// served model (default: the first one the server lists); prompts are token ids cut from
    /// the bundled text by `--tokenizer`'s tokenizer.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Bearer token for --endpoint (also read from TPSLAB_API_KEY).
    #[arg(long, value_name = "K", env = "TPSLAB_API_KEY", requires = "endpoint")]
    pub api_key: Option<String>,
    /// Service-level objectives for goodput, as vLLM's: `ttft:MS tpot:MS e2el:MS` (any of them);
    /// requests per second that meet all of them are reported as `request_goodput`.
    #[arg(long, value_name = "KEY:MS", num_args = 1.., value_parser = parse_slo_part)]
    pub goodput: Vec<(String, f64)>,
    /// With --endpoint: the model file (or `default`) whose tokenizer cuts the prompts.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "default",
        requires = "endpoint"
    )]
    pub tokenizer: String,
    /// Structured output's cost: each level runs twice in the same run, plain and with every
    /// request constrained to the JSON schema in FILE, and the ratio is printed (with
    /// --endpoint: sent as `response_format` json_schema).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// With --endpoint: each level again as chat requests (the prompt decoded as the user's
    /// message) carrying the OpenAI tools in FILE (a JSON list) with `tool_choice: "required"`.
    #[arg(long, value_name = "FILE", requires = "endpoint")]
    pub tools: Option<std::path::PathBuf>,
}

/// The current UTC time as `YYYY-MM-DD HH:MM:SS UTC` (for reports).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    tpslab_engine::text::chat::strftime_utc("%Y-%m-%d %H:%M:%S UTC", secs)
}

/// One `KEY:MS` of `--goodput`: ttft, tpot or e2el, and a positive number of milliseconds.
fn parse_slo_part(v: &str) -> Result<(String, f64), String> {
    let (k, ms) = v
        .split_once(':')
        .ok_or_else(|| format!("{v:?}: expected KEY:MS, e.g. ttft:500"))?;
    let k = k.trim().to_ascii_lowercase();
    if !["ttft", "tpot", "e2el"].contains(&k.as_str()) {
        return Err(format!("{k:?}: the objectives are ttft, tpot and e2el"));
    }
    let ms: f64 = ms
        .trim()
        .parse()
        .map_err(|_| format!("{ms:?} is not a number of milliseconds"))?;
    if !(ms.is_finite() && ms > 0.0) {
        return Err(format!(
            "{k}:{ms}: the objective must be a positive number of milliseconds"
        ));
    }
    Ok((k, ms))
}

/// `--goodput`'s objectives (`None` when none was given).
pub fn slo(parts: &[(String, f64)]) -> Option<tpslab_engine::serving::metrics::Slo> {
    let get = |key: &str| parts.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v);
    (!parts.is_empty()).then(|| tpslab_engine::serving::metrics::Slo {
        ttft_ms: get("ttft"),
        tpot_ms: get("tpot"),
        e2el_ms: get("e2el"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goodput_objectives_parse_as_vllm_spells_them() {
        assert_eq!(parse_slo_part("ttft:500"), Ok(("ttft".into(), 500.0)));
        assert_eq!(parse_slo_part("TPOT: 50.5"), Ok(("tpot".into(), 50.5)));
        assert!(parse_slo_part("itl:5").is_err());
        assert!(parse_slo_part("ttft").is_err());
        assert!(parse_slo_part("e2el:-3").is_err());
        assert!(parse_slo_part("e2el:NaN").is_err());
        let s = slo(&[("ttft".into(), 500.0), ("e2el".into(), 9000.0)]).expect("slo");
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2el_ms),
            (Some(500.0), None, Some(9000.0))
        );
        assert!(slo(&[]).is_none());
    }
}
