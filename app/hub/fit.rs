//! Before a download: each GGUF file of a repo described from its header alone, read with
//! HTTP range requests ([`read_ggufs`]): its quant type, size, whether this build runs its
//! architecture, and what it will need (weights plus KV, [`GgufNeeds`]), for the fits / does not
//! fit verdict against this machine's RAM and VRAM ([`Machine`]).
//!
//! The header is untrusted: it is read in growing ranges (1 MiB, then as far as the parser says
//! it goes, at most [`MAX_HEADER_MIB`]), every answer checked as a download's is (status,
//! `Content-Range`, the headers against the listing), the body cut off at what was asked, and
//! parsed by the engine's validating GGUF reader, which allocates only what the bytes in hand
//! back. A header past the cap, or one the reader refuses, is that file's error; the other
//! files are still described.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use hf_hub::{Repo, RepoType};
use reqwest::Url;
use reqwest::header::HeaderMap;
use tpslab_engine::formats::gguf::{GgufError, GgufFile};
use tpslab_engine::library::fit::{GgufNeeds, Verdict};

use super::config::HubConfig;
use super::download::{Origin, Sum, accepted, check_headers};
use super::error::HubError;
use super::error::chain;
use super::http::{Http, server_of};
use super::http::{hub_api, runtime};
use super::listing::is_split_first;
use super::listing::{RepoFile, RepoListing};
use super::meter::Meter;
use super::names::url_path;

/// The first read of a header: enough for small vocabularies, and the tensor table of most.
const FIRST_READ: u64 = 1 << 20;
/// Range requests for one header at most: the reads grow fourfold, so 1 MiB reaches the cap in
/// four; a server that answers each with a few bytes is refused, not followed for ever.
const MAX_READS: usize = 8;
/// No real GGUF header comes near this (the largest vocabularies, 150-260k tokens with their
/// merges, make headers of 10-15 MiB); a header that goes on past it is refused.
pub const MAX_HEADER_MIB: u64 = 32;

/// One GGUF model of a repo: a file, or a split GGUF by its first part.
#[derive(Debug, Clone)]
pub struct GgufFit {
    /// The file (a split GGUF's first part).
    pub file: String,
    pub parts: usize,
    /// Bytes of every part, as listed.
    pub size: u64,
    /// What its header says it needs, or why it could not be read.
    pub needs: Result<GgufNeeds, String>,
}

/// The memory of the machine a model would run on.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Machine {
    /// Total RAM in bytes (`None`: unknown).
    pub ram: Option<u64>,
    /// Total VRAM of the GPU in use (`None`: no GPU).
    pub vram: Option<u64>,
}

impl Machine {
    /// This machine's RAM (Linux `/proc/meminfo`), with the VRAM the caller knows of.
    pub fn this(vram: Option<u64>) -> Self {
        Self {
            ram: crate::mem::ram_total_bytes(),
            vram,
        }
    }
}

impl GgufFit {
    /// Weights plus KV for `batch` sequences of `ctx` tokens (`None` when unknown).
    pub fn need(&self, ctx: usize, batch: usize) -> Option<u64> {
        self.needs.as_ref().ok()?.need_bytes(ctx, batch)
    }

    /// The verdicts against `m`'s RAM and VRAM.
    pub fn verdict(&self, m: &Machine, ctx: usize, batch: usize) -> (Verdict, Verdict) {
        let need = self.need(ctx, batch);
        (Verdict::of(need, m.ram), Verdict::of(need, m.vram))
    }
}

/// The GGUF models of `listing`, each described from its header (blocking; call it from a
/// worker thread). The order is the listing's.
pub fn read_ggufs(cfg: &HubConfig, listing: &RepoListing) -> Result<Vec<GgufFit>, HubError> {
    let http = Http::new(cfg)?;
    let api = hub_api(cfg)?;
    let repo = api.repo(Repo::with_revision(
        listing.repo.clone(),
        RepoType::Model,
        listing.commit.clone(),
    ));
    let origin = Origin {
        http: &http,
        repo: &repo,
        repo_id: &listing.repo,
        revision: &listing.revision,
        commit: &listing.commit,
    };
    let never = AtomicBool::new(false);
    let mut quiet = |_: &super::PullProgress| {};
    let mut meter = Meter::new(&never, &mut quiet);
    let rt = runtime()?;
    let mut out = Vec::new();
    for (first, parts) in models(listing) {
        let size = parts.iter().fold(0u64, |n, f| n.saturating_add(f.size));
        let needs = rt
            .block_on(read_header(&origin, &mut meter, first))
            .map(|h| GgufNeeds::of(&h, (parts.len() > 1).then_some(size)))
            .map_err(|e| e.to_string());
        out.push(GgufFit {
            file: first.name.clone(),
            parts: parts.len(),
            size,
            needs,
        });
    }
    Ok(out)
}

/// Each GGUF model of the listing: a file on its own, or a split GGUF's first part with all its
/// parts (later parts are not models of their own).
fn models(listing: &RepoListing) -> Vec<(&RepoFile, Vec<&RepoFile>)> {
    let ggufs = listing.ggufs();
    let split: Vec<(&RepoFile, Vec<&RepoFile>)> = ggufs
        .iter()
        .filter(|f| is_split_first(&f.name))
        .filter_map(|f| Some((*f, listing.with_split_parts(f).ok()?)))
        .collect();
    ggufs
        .iter()
        .filter_map(|f| {
            if let Some((first, parts)) = split.iter().find(|(first, _)| first.name == f.name) {
                return Some((*first, parts.clone()));
            }
            let later = split
                .iter()
                .any(|(_, parts)| parts.iter().any(|p| p.name == f.name));
            (!later).then(|| (*f, vec![*f]))
        })
        .collect()
}

/// `f`'s GGUF header, read in growing ranges from its first byte up to [`MAX_HEADER_MIB`].
async fn read_header(
    origin: &Origin<'_>,
    meter: &mut Meter<'_>,
    f: &RepoFile,
) -> Result<GgufFile, HubError> {
    let endpoint = origin.http.cfg.endpoint.clone();
    let bad = |detail: String| HubError::BadHeader {
        endpoint: endpoint.clone(),
        file: f.name.clone(),
        detail,
    };
    // Checked as a download is: a file the listing gives no checksum for is not read.
    let sum = Sum::of(f).ok_or_else(|| HubError::Unverifiable {
        endpoint: endpoint.clone(),
        file: f.name.clone(),
    })?;
    if f.size == 0 {
        return Err(bad("the file is empty (0 bytes)".into()));
    }
    let cap = MAX_HEADER_MIB << 20;
    let mut buf: Vec<u8> = Vec::new();
    let mut want = FIRST_READ.min(f.size);
    for _ in 0..MAX_READS {
        let (start, bytes) = read_range(origin, meter, f, &sum, buf.len() as u64, want - 1).await?;
        if start == 0 {
            buf = bytes;
        } else {
            buf.extend_from_slice(&bytes);
        }
        match GgufFile::from_prefix(Path::new(&f.name), &buf, f.size) {
            Ok(h) => return Ok(h),
            Err(GgufError::Incomplete { upto, .. }) => {
                if upto > cap {
                    return Err(bad(format!(
                        "it goes on past {MAX_HEADER_MIB} MiB (to byte {upto} at least), \
                         more than any model's header"
                    )));
                }
                // Grow geometrically so a long header takes a few requests, not hundreds.
                want = upto.max(want.saturating_mul(4)).min(cap).min(f.size);
            }
            Err(e) => return Err(bad(e.to_string())),
        }
    }
    Err(bad(format!(
        "the server sent {} bytes of it in {MAX_READS} answers, without its end",
        buf.len()
    )))
}

/// The bytes `pos..=end` of `f`: `(first byte, bytes)`, where the first byte is 0 when the server
/// ignored the range and sent the file from its start (then only up to `end` is kept). The body
/// is cut off at what was asked, and must arrive within the read timeout.
async fn read_range(
    origin: &Origin<'_>,
    meter: &mut Meter<'_>,
    f: &RepoFile,
    sum: &Sum,
    pos: u64,
    end: u64,
) -> Result<(u64, Vec<u8>), HubError> {
    let http = origin.http;
    let url = Url::parse(&origin.repo.url(&url_path(&f.name)))
        .map_err(|_| HubError::BadEndpoint(http.cfg.endpoint.clone()))?;
    let check = |u: &Url, h: &HeaderMap| check_headers(origin, f, sum, u, h);
    let mut resp = http.get(meter, url, Some((pos, end)), &check).await?;
    let (start, len) = accepted(origin, f, &resp, pos, end)?;
    // A 200 is the whole file: only its first bytes up to `end` are wanted.
    let keep = if start == pos { len } else { end + 1 };
    let server = server_of(resp.url());
    let cut = |detail: String| HubError::Interrupted {
        endpoint: server.clone(),
        file: f.name.clone(),
        detail,
    };
    let limit = http.cfg.read_timeout;
    let deadline = std::time::Instant::now() + limit;
    let mut body = Vec::new();
    while (body.len() as u64) < keep {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let chunk = meter
            .wait(resp.chunk(), left)
            .await?
            .ok_or_else(|| cut(format!("the header took over {} s", limit.as_secs())))?
            .map_err(|e| cut(chain(&e)))?;
        let Some(chunk) = chunk else {
            return Err(cut(format!(
                "the answer ended after {} of {keep} bytes",
                body.len()
            )));
        };
        let room = (keep - body.len() as u64) as usize;
        if chunk.len() > room && start == pos {
            return Err(HubError::TooLong {
                endpoint: server.clone(),
                file: f.name.clone(),
                expected: f.size,
            });
        }
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok((start, body))
}
