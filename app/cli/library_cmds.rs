//! `tpslab models` (list the library, import by path, remove, search the Hub) and `tpslab pull`
//! (download from the Hub into the library with a progress bar).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::Result;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tpslab_engine::library::index::{Library, ModelEntry};

use crate::hub::{self, Choice, HubConfig, PullRequest, human_bytes};

#[derive(Args, Debug)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub action: Option<ModelsAction>,
    /// Print the list as one JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ModelsAction {
    /// Copy a GGUF file or a safetensors folder (config.json, tokenizer.json, *.safetensors)
    /// into the library; it is checked by reading its header first.
    Import { path: PathBuf },
    /// Remove a model (by its NAME in `tpslab models`) from the library.
    Rm { name: String },
    /// Search the Hub for model repositories.
    Search {
        query: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        hub: HubArgs,
    },
}

/// Where the Hub is and the token for gated repos.
#[derive(Args, Debug, Clone)]
pub struct HubArgs {
    /// The Hub's URL (default: $HF_ENDPOINT, else https://huggingface.co).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Access token for gated or private repos (default: $HF_TOKEN, else the saved login).
    #[arg(long, value_name = "T")]
    pub token: Option<String>,
}

impl HubArgs {
    fn config(&self) -> HubConfig {
        HubConfig::resolve(self.endpoint.clone(), self.token.clone())
    }
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The repository, `owner/name`.
    pub repo: String,
    /// The file to download (a GGUF, by its path in the repo). Without it and without
    /// --safetensors: the safetensors set, or the only GGUF file.
    #[arg(long, value_name = "F")]
    pub file: Option<String>,
    /// Download the safetensors set (config.json, tokenizer files, *.safetensors).
    #[arg(long, conflicts_with = "file")]
    pub safetensors: bool,
    /// Branch, tag or commit.
    #[arg(long, value_name = "R", default_value = "main")]
    pub revision: String,
    /// Only list the repo's files with their sizes.
    #[arg(long)]
    pub list: bool,
    /// Only describe each GGUF file from its header (read with range requests): quant type,
    /// size, architecture (whether this build runs it), memory needed at --ctx and --batch
    /// (weights + KV) and whether that fits this machine's RAM.
    #[arg(long, conflicts_with = "list")]
    pub fit: bool,
    /// Context length of the memory need shown by --fit.
    #[arg(long, default_value_t = 4096, requires = "fit")]
    pub ctx: usize,
    /// Sequences run at once for the memory need shown by --fit.
    #[arg(long, default_value_t = 1, requires = "fit")]
    pub batch: usize,
    #[command(flatten)]
    pub hub: HubArgs,
}

fn params(n: u64) -> String {
    match n {
        0 => "-".into(),
        _ if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

fn json_entry(m: &ModelEntry) -> serde_json::Value {
    let mut v = serde_json::to_value(m).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("path".into(), m.path.display().to_string().into());
        o.insert("source_text".into(), m.source.to_string().into());
    }
    v
}

pub fn run_models(a: &ModelsArgs) -> Result<()> {
    let lib = Library::open()?;
    match &a.action {
        None => list(&lib, a.json),
        Some(ModelsAction::Import { path }) => {
            let bar = bytes_bar();
            let never = AtomicBool::new(false);
            let r = lib.import(path, &never, &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            });
            bar.finish_and_clear();
            let m = r?;
            println!("imported {}", summary(&m));
            Ok(())
        }
        Some(ModelsAction::Rm { name }) => {
            lib.remove(name)?;
            println!("removed {name}");
            Ok(())
        }
        Some(ModelsAction::Search { query, limit, hub }) => {
            let hits = hub::search(&hub.config(), query, *limit)?;
            if hits.is_empty() {
                println!("no model repositories match '{query}'");
            }
            for h in hits {
                println!(
                    "{:<60} {:>10} downloads {:>6} likes",
                    h.id, h.downloads, h.likes
                );
            }
            Ok(())
        }
    }
}

fn list(lib: &Library, json: bool) -> Result<()> {
    let (models, bad) = lib.list_indexed()?;
    if json {
        let v: Vec<_> = models.iter().map(json_entry).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if models.is_empty() {
        println!(
            "no models in {} (tpslab pull REPO, or tpslab models import PATH)",
            lib.root().display()
        );
    } else {
        println!(
            "{:<40} {:<32} {:<14} {:>8} {:<9} {:>10} {:>7} SHA256",
            "NAME", "SOURCE", "ARCH", "PARAMS", "PRECISION", "SIZE", "CTX"
        );
        for m in &models {
            let mut source = m.source.to_string();
            if source.chars().count() > 32 {
                source = format!("{}…", source.chars().take(31).collect::<String>());
            }
            println!(
                "{:<40} {:<32} {:<14} {:>8} {:<9} {:>10} {:>7} {}",
                m.name,
                source,
                m.arch,
                params(m.params),
                m.precision,
                human_bytes(m.size),
                m.context_len.map_or("-".into(), |c| c.to_string()),
                m.sha_short()
            );
        }
        println!("library: {}", lib.root().display());
    }
    for b in bad {
        eprintln!("warning: not a usable model: {b}");
    }
    let partial = lib.partial_downloads();
    if !partial.is_empty() && !json {
        let bytes: u64 = partial.iter().map(|(_, n)| n).sum();
        println!(
            "{} partial download(s), {} in {} (the next pull of the same repo resumes them)",
            partial.len(),
            human_bytes(bytes),
            lib.hub_cache().display()
        );
    }
    Ok(())
}

fn summary(m: &ModelEntry) -> String {
    format!(
        "{} ({}, {} {} params, {}, {}) -> {}; sha256 {}",
        m.name,
        m.arch,
        params(m.params),
        m.precision,
        human_bytes(m.size),
        m.source,
        m.path.display(),
        m.sha_short()
    )
}

fn bytes_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// `tpslab pull REPO --fit`: one line per GGUF model of the repo.
fn print_fit(cfg: &hub::HubConfig, a: &PullArgs) -> Result<()> {
    let l = hub::list_files(cfg, &a.repo, &a.revision)?;
    let m = hub::Machine::this(None);
    println!(
        "{} @ {}: memory at context {} and batch {} against RAM {}",
        l.repo,
        l.revision,
        a.ctx,
        a.batch,
        m.ram.map_or("unknown".into(), human_bytes)
    );
    for fit in hub::read_ggufs(cfg, &l)? {
        let line = match &fit.needs {
            Err(e) => format!("unreadable: {e}"),
            Ok(n) => {
                let runs = if n.runs() {
                    "runs here"
                } else {
                    "not run by this build"
                };
                let need = fit.need(a.ctx, a.batch).map_or("-".into(), human_bytes);
                let (ram, _) = fit.verdict(&m, a.ctx, a.batch);
                format!(
                    "{:<7} {} ({runs})  needs {need}  RAM: {}",
                    n.quant,
                    n.arch,
                    ram.text()
                )
            }
        };
        println!("{:>12}  {}  {line}", human_bytes(fit.size), fit.file);
    }
    Ok(())
}

pub fn run_pull(a: &PullArgs) -> Result<()> {
    let cfg = a.hub.config();
    if a.fit {
        return print_fit(&cfg, a);
    }
    if a.list {
        let l = hub::list_files(&cfg, &a.repo, &a.revision)?;
        println!(
            "{} @ {} (commit {}){}",
            l.repo,
            l.revision,
            l.commit,
            if l.gated { ", gated" } else { "" }
        );
        for f in &l.files {
            println!(
                "{:>12}  {}  {}",
                human_bytes(f.size),
                f.sha256
                    .as_deref()
                    .or(f.blob_id.as_deref())
                    .map_or("-", |s| s.get(..12).unwrap_or(s)),
                f.name
            );
        }
        return Ok(());
    }
    let choice = match (&a.file, a.safetensors) {
        (Some(f), _) => Choice::File(f.clone()),
        (None, true) => Choice::Safetensors,
        (None, false) => Choice::Auto,
    };
    let req = PullRequest {
        repo: a.repo.clone(),
        revision: a.revision.clone(),
        choice,
    };
    let lib = Library::open()?;
    let bar = bytes_bar();
    let never = AtomicBool::new(false);
    let r = hub::pull(&cfg, &lib, &req, &never, &mut |p| {
        bar.set_length(p.total);
        bar.set_position(p.done);
        let eta = p.eta.map_or("-".into(), |e| format!("{}s", e.as_secs()));
        bar.set_message(format!(
            "{}/s eta {eta} {} {} ({}/{})",
            human_bytes(p.bytes_per_s as u64),
            p.stage,
            p.file,
            p.file_index,
            p.n_files
        ));
    });
    bar.finish_and_clear();
    let m = r?;
    println!("pulled {}", summary(&m));
    Ok(())
}
