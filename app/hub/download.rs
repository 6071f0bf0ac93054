//! One file of a pull into the library's hub cache, verified ([`fetch`]).
//!
//! Layout: `models/.hub-cache/blobs/<kind>-<hex>.part` while it arrives, `<kind>-<hex>` once
//! whole and verified, where `<kind>-<hex>` is the checksum the listing gives (`sha256-…` for
//! LFS files, `gitblob-…` for the others): hex digits checked by [`super::listing`], so no name
//! or header a server sends is ever part of a path. Every file there is opened only if it is a
//! plain file with one name ([`plain_file`]), created with `create_new`; a symlink planted there
//! is refused, never followed.
//!
//! The transfer: ranged GETs of `chunk_size` bytes appended to the partial file, so a cut one
//! resumes from the bytes on disk on the next pull. Each answer is checked before its body is
//! read (status, `Content-Range` against the range asked and the listed size, `Content-Length`,
//! the headers against the listing); the body is counted while it streams and cut off past what
//! was asked; a body that sends nothing for the stall timeout is cut (resumable). A server that
//! ignores `Range` and answers 200 with the whole file restarts the file from byte 0.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use hf_hub::api::tokio::ApiRepo;
use reqwest::header::HeaderMap;
use reqwest::{Response, Url};
use sha1::{Digest, Sha1};
use tpslab_engine::library;
use tpslab_engine::library::index::{HUB_CACHE_DIR, IndexError, Library, plain_file, write_error};

use super::error::chain;
use super::error::{HubError, status_error};
use super::http::{Http, header, server_of};
use super::listing::RepoFile;
use super::meter::Meter;
use super::names::{commit_id, entity_tag, hex_of_len, shown, url_path};

/// The cache's folder of downloads, inside [`HUB_CACHE_DIR`].
pub(super) const BLOBS: &str = "blobs";

/// The checksum a file is verified by.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Sum {
    /// sha256 of the bytes: LFS files (the weights).
    Sha256(String),
    /// git's blob id, sha1 of `blob {len}\0` + the bytes: the other files.
    GitBlob(String),
}

impl Sum {
    /// The checksum the listing gives for `f`, if any.
    pub fn of(f: &RepoFile) -> Option<Self> {
        match (&f.sha256, &f.blob_id) {
            (Some(h), _) => Some(Self::Sha256(h.clone())),
            (None, Some(h)) => Some(Self::GitBlob(h.clone())),
            (None, None) => None,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Sha256(_) => "sha256",
            Self::GitBlob(_) => "git blob id",
        }
    }

    fn expected(&self) -> &str {
        match self {
            Self::Sha256(h) | Self::GitBlob(h) => h,
        }
    }

    /// The cache name: made from the checked hex digits only.
    fn key(&self) -> String {
        match self {
            Self::Sha256(h) => format!("sha256-{h}"),
            Self::GitBlob(h) => format!("gitblob-{h}"),
        }
    }
}

/// Where a repo's files are read from, pinned to the listed commit: what a pull and a header
/// read ([`super::fit`]) share, and what every answer is checked against.
pub(super) struct Origin<'a> {
    pub http: &'a Http,
    /// hf-hub's repo at the listed commit: the download URLs (`ApiRepo::url`).
    pub repo: &'a ApiRepo,
    pub repo_id: &'a str,
    pub revision: &'a str,
    /// The listing's commit; an `X-Repo-Commit` header must name this one.
    pub commit: &'a str,
}

/// What fetching the files of one pull shares: the origin, and the library they go into.
pub(super) struct FileJob<'a> {
    pub origin: Origin<'a>,
    pub lib: &'a Library,
}

impl<'a> std::ops::Deref for FileJob<'a> {
    type Target = Origin<'a>;

    fn deref(&self) -> &Origin<'a> {
        &self.origin
    }
}

/// `f` whole and verified in the hub cache: reused from an earlier pull when it is there, else
/// downloaded (resuming a partial file). Returns its path and sha256. A failure that a next
/// pull can resume from (a cut, a stall, a cancel) keeps the partial file; any other discards it.
pub(super) async fn fetch(
    job: &FileJob<'_>,
    meter: &mut Meter<'_>,
    f: &RepoFile,
) -> Result<(PathBuf, String), HubError> {
    let endpoint = &job.http.cfg.endpoint;
    let sum = Sum::of(f).ok_or_else(|| HubError::Unverifiable {
        endpoint: endpoint.clone(),
        file: f.name.clone(),
    })?;
    let dir = job.lib.subdir(&[HUB_CACHE_DIR, BLOBS])?;
    let whole = dir.join(sum.key());
    let part = dir.join(format!("{}.part", sum.key()));
    if plain_file(&whole)?.is_some() {
        meter.stage("verifying");
        match verify(job, f, &sum, &whole) {
            Ok(sha256) => {
                meter.start_file(f.size);
                meter.finish_file(f.size);
                return Ok((whole, sha256));
            }
            Err(_) => discard(&whole),
        }
    }
    let result = transfer(job, meter, f, &sum, &part).await;
    let keep = matches!(
        result,
        Err(HubError::Interrupted { .. }
            | HubError::Cancelled
            // Another pull's file: not ours to delete.
            | HubError::Busy(_)
            | HubError::Network { .. }
            | HubError::Timeout { .. })
    );
    if let Err(e) = result {
        if !keep
            || plain_file(&part)
                .ok()
                .flatten()
                .is_some_and(|m| m.len() == 0)
        {
            discard(&part);
        }
        return Err(e);
    }
    meter.stage("verifying");
    let sha256 = verify(job, f, &sum, &part).inspect_err(|_| discard(&part))?;
    std::fs::rename(&part, &whole).map_err(|e| {
        discard(&part);
        write_error(job.lib.root(), &f.name, &whole, e)
    })?;
    meter.finish_file(f.size);
    Ok((whole, sha256))
}

/// Deletes a file of the cache (only ever one that [`plain_file`] accepted: removing a link
/// would remove the link, not what it points at, but a link is refused before this anyway).
fn discard(path: &Path) {
    if plain_file(path).ok().flatten().is_some() {
        let _ = std::fs::remove_file(path);
    }
}

/// Downloads the rest of `f` into `part`, from the bytes already there.
async fn transfer(
    job: &FileJob<'_>,
    meter: &mut Meter<'_>,
    f: &RepoFile,
    sum: &Sum,
    part: &Path,
) -> Result<(), HubError> {
    let url = Url::parse(&job.repo.url(&url_path(&f.name)))
        .map_err(|_| HubError::BadEndpoint(job.http.cfg.endpoint.clone()))?;
    let mut pos = match plain_file(part)? {
        Some(md) if md.len() <= f.size => md.len(),
        // Longer than the file: not a partial download of it.
        Some(_) => {
            discard(part);
            0
        }
        None => 0,
    };
    meter.start_file(pos);
    let check = |u: &Url, h: &HeaderMap| check_headers(job, f, sum, u, h);
    let chunk = job.http.cfg.chunk_size.max(1 << 16) as u64;
    let mut out: Option<std::fs::File> = None;
    while pos < f.size {
        meter.check_cancel()?;
        let end = pos.saturating_add(chunk).min(f.size) - 1;
        let resp = job
            .http
            .get(meter, url.clone(), Some((pos, end)), &check)
            .await?;
        let (start, len) = accepted(job, f, &resp, pos, end)?;
        if start != pos {
            // The server ignored the Range and sends the whole file: start it over.
            meter.restart_file();
            pos = start;
            if let Some(file) = out.as_mut() {
                rewind(file, pos).map_err(|e| write_error(job.lib.root(), &f.name, part, e))?;
            }
        }
        if out.is_none() {
            // Opened (made) only now that an answer was checked: a refused one leaves nothing.
            out = Some(open_part(job.lib, &f.name, part, pos)?);
        }
        let Some(file) = out.as_mut() else {
            unreachable!("opened just above")
        };
        pos += stream(job, meter, f, resp, file, part, len).await?;
    }
    let file = match out {
        Some(file) => file,
        // Nothing to send (an empty file, or whole from an earlier pull).
        None => open_part(job.lib, &f.name, part, pos)?,
    };
    // Synced before it is renamed into place, so a full disk shows here.
    file.sync_all()
        .map_err(|e| write_error(job.lib.root(), &f.name, part, e).into())
}

/// Truncates `file` to `pos` bytes and moves its cursor there.
fn rewind(file: &mut std::fs::File, pos: u64) -> std::io::Result<()> {
    file.set_len(pos)?;
    file.seek(SeekFrom::Start(pos)).map(|_| ())
}

/// The partial file at `part`, truncated to `pos` bytes and positioned there, locked against a
/// second pull appending to it at the same time: created with `create_new` when missing;
/// otherwise opened only if the file opened is the plain file that was checked (same device and
/// inode, one name), so a link swapped in meanwhile is not written through.
fn open_part(lib: &Library, name: &str, part: &Path, pos: u64) -> Result<std::fs::File, HubError> {
    let werr = |e| HubError::from(write_error(lib.root(), name, part, e));
    let mut file = match plain_file(part)? {
        None => std::fs::File::create_new(part).map_err(werr)?,
        Some(md) => {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(part)
                .map_err(werr)?;
            let opened = file.metadata().map_err(werr)?;
            if !same_file(&md, &opened) {
                return Err(IndexError::Link {
                    path: part.to_path_buf(),
                }
                .into());
            }
            file
        }
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(HubError::Busy(name.to_string()));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(werr(e)),
    }
    rewind(&mut file, pos).map_err(werr)?;
    Ok(file)
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino() && b.nlink() == 1
    }
    #[cfg(not(unix))]
    {
        a.is_file() && b.is_file()
    }
}

/// The headers of every answer for `f` (redirects too), against the listing: entity tags must
/// be plain tokens, an `X-Linked-Etag` sha256 must be the listed one, an `X-Repo-Commit` the
/// listed commit.
pub(super) fn check_headers(
    job: &Origin<'_>,
    f: &RepoFile,
    sum: &Sum,
    url: &Url,
    h: &HeaderMap,
) -> Result<(), HubError> {
    let refuse = |detail: String| HubError::Unsafe {
        endpoint: server_of(url),
        detail: format!("{detail} for {}", f.name),
    };
    let text = |k: &str| {
        h.get(k)
            .map(|v| {
                v.to_str()
                    .map_err(|_| refuse(format!("a {k} header that is not text")))
            })
            .transpose()
    };
    for (k, shown_k) in [("etag", "ETag"), ("x-linked-etag", "X-Linked-Etag")] {
        let Some(v) = text(k)? else { continue };
        let tag = entity_tag(v).ok_or_else(|| {
            refuse(format!(
                "an {shown_k} header {} that is not an entity tag",
                shown(v)
            ))
        })?;
        if let (Sum::Sha256(want), Some(tag), "x-linked-etag") = (sum, hex_of_len(tag, 64), k)
            && tag != *want
        {
            return Err(refuse(format!(
                "X-Linked-Etag sha256 {tag}, where the listing says {want},"
            )));
        }
    }
    if let Some(v) = text("x-repo-commit")? {
        match commit_id(v) {
            Some(c) if c == job.commit => {}
            Some(c) => {
                return Err(refuse(format!(
                    "X-Repo-Commit {c}, not the listed commit {},",
                    job.commit
                )));
            }
            None => {
                return Err(refuse(format!(
                    "an X-Repo-Commit header {} that is not a commit id",
                    shown(v)
                )));
            }
        }
    }
    Ok(())
}

/// What an answer to the range `pos..=end` of `f` carries: `(first byte, length)`, checked
/// against the range asked and the listed size before any of its body is read. A 200 is the
/// whole file (a server that ignores `Range`).
pub(super) fn accepted(
    job: &Origin<'_>,
    f: &RepoFile,
    resp: &Response,
    pos: u64,
    end: u64,
) -> Result<(u64, u64), HubError> {
    let endpoint = server_of(resp.url());
    let bad = |detail: String| HubError::BadAnswer {
        endpoint: endpoint.clone(),
        detail: format!("{detail} for {}", f.name),
    };
    let size_lie = |found: String| HubError::Size {
        endpoint: endpoint.clone(),
        file: f.name.clone(),
        expected: f.size,
        found,
    };
    match resp.status().as_u16() {
        206 => {
            let cr = header(resp.headers(), "content-range");
            let (a, b, total) = content_range(&cr)
                .ok_or_else(|| bad(format!("a 206 answer with Content-Range {}", shown(&cr))))?;
            if let Some(t) = total.filter(|t| *t != f.size) {
                return Err(size_lie(t.to_string()));
            }
            if a != pos || b < a || b > end {
                return Err(bad(format!("bytes {a}-{b} where {pos}-{end} were asked")));
            }
            let len = b - a + 1;
            if let Some(n) = resp.content_length().filter(|n| *n != len) {
                return Err(bad(format!("{n} bytes for a range of {len}")));
            }
            Ok((pos, len))
        }
        200 => {
            if let Some(n) = resp.content_length().filter(|n| *n != f.size) {
                return Err(size_lie(n.to_string()));
            }
            Ok((0, f.size))
        }
        status => {
            let cfg = &job.http.cfg;
            let code = header(resp.headers(), "x-error-code");
            let msg = header(resp.headers(), "x-error-message");
            Err(match status {
                404 => HubError::FileNotFound {
                    repo: job.repo_id.to_string(),
                    file: f.name.clone(),
                },
                401 | 403 => status_error(
                    cfg,
                    job.repo_id,
                    job.revision,
                    &f.name,
                    status,
                    "GatedRepo",
                    "",
                ),
                _ => status_error(
                    cfg,
                    job.repo_id,
                    job.revision,
                    resp.url().as_str(),
                    status,
                    &code,
                    &msg,
                ),
            })
        }
    }
}

/// `bytes a-b/total` (total `None` for `*`).
pub(super) fn content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let total = match total {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((a.parse().ok()?, b.parse().ok()?, total))
}

/// Appends the body of `resp` (which must be exactly `len` bytes) to `file`; returns `len`.
/// More than `len` is cut off as an error; fewer, or a stall, is an interruption.
async fn stream(
    job: &FileJob<'_>,
    meter: &mut Meter<'_>,
    f: &RepoFile,
    mut resp: Response,
    file: &mut std::fs::File,
    part: &Path,
    len: u64,
) -> Result<u64, HubError> {
    let endpoint = server_of(resp.url());
    let stall = job.http.cfg.stall_timeout;
    let cut = |detail: String| HubError::Interrupted {
        endpoint: endpoint.clone(),
        file: f.name.clone(),
        detail,
    };
    let mut got = 0u64;
    loop {
        let chunk = meter
            .wait(resp.chunk(), stall)
            .await?
            .ok_or_else(|| cut(format!("no data for {} s", stall.as_secs())))?
            .map_err(|e| cut(chain(&e)))?;
        let Some(chunk) = chunk else { break };
        if got + chunk.len() as u64 > len {
            return Err(HubError::TooLong {
                endpoint: endpoint.clone(),
                file: f.name.clone(),
                expected: f.size,
            });
        }
        file.write_all(&chunk)
            .map_err(|e| write_error(job.lib.root(), &f.name, part, e))?;
        got += chunk.len() as u64;
        meter.add(chunk.len() as u64);
    }
    if got < len {
        return Err(cut(format!("the answer ended after {got} of {len} bytes")));
    }
    Ok(got)
}

/// Checks the whole file at `path` against the listing (size, then checksum); returns its
/// sha256 (the library's manifest records it for every file).
fn verify(job: &FileJob<'_>, f: &RepoFile, sum: &Sum, path: &Path) -> Result<String, HubError> {
    let endpoint = job.http.cfg.endpoint.clone();
    let len = plain_file(path)?.map_or(0, |m| m.len());
    if len != f.size {
        return Err(HubError::Size {
            endpoint,
            file: f.name.clone(),
            expected: f.size,
            found: len.to_string(),
        });
    }
    let sha256 = library::sha256_file(path).map_err(IndexError::from)?;
    let found = match sum {
        Sum::Sha256(_) => sha256.clone(),
        Sum::GitBlob(_) => git_blob_id(path, len).map_err(|err| IndexError::Io {
            path: path.to_path_buf(),
            err,
        })?,
    };
    if found != sum.expected() {
        return Err(HubError::Checksum {
            endpoint,
            file: f.name.clone(),
            kind: sum.kind(),
            expected: sum.expected().to_string(),
            found,
        });
    }
    Ok(sha256)
}

/// git's blob id of the file at `path` (`len` bytes): sha1 of `blob {len}\0` + its bytes.
pub(super) fn git_blob_id(path: &Path, len: u64) -> std::io::Result<String> {
    let mut h = Sha1::new();
    h.update(format!("blob {len}\0").as_bytes());
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
