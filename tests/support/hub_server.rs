//! A small Hugging Face Hub on 127.0.0.1 for the download tests: real HTTP/1.1 over a socket
//! (std only, one thread per connection, `Connection: close`), serving the paths and headers the
//! Hub serves and hf-hub reads:
//! - `GET /api/models/{owner}/{name}[/revision/{rev}][?blobs=true]`: `sha`, `gated`, and
//!   `siblings` with `size` and, for LFS files, `lfs.sha256`;
//! - `GET /api/models?search=Q`: matching repo ids;
//! - `GET|HEAD /{owner}/{name}/resolve/{rev}/{file}` with `Range`: 206 with `Content-Range`,
//!   `ETag`, `X-Linked-Etag` (the LFS sha256), `X-Repo-Commit`, `Content-Length`;
//! - errors as the Hub sends them: 401/404 with `X-Error-Code: RepoNotFound`, 401/403 with
//!   `X-Error-Code: GatedRepo`.
//!
//! Faults for the tests: cut the connection mid-body once (at a range start), serve bytes that
//! differ from the listed sha256, or send slowly. Hostile modes ([`Hostile`]): a listing with
//! any `sha`, extra raw siblings, lying sizes, padding or no end; file answers with any headers
//! (`ETag`, `X-Linked-Etag`, `X-Repo-Commit`, `Location`), ignoring `Range`, with no end, or
//! stalling; redirects to a second server. Every request is logged, with whether it carried an
//! `Authorization` header.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Clone)]
pub struct File {
    pub name: String,
    pub bytes: Arc<Vec<u8>>,
    /// Stored with Git LFS on the Hub (weights): listed with its sha256.
    pub lfs: bool,
    sha: String,
}

impl File {
    pub fn new(name: &str, bytes: Arc<Vec<u8>>, lfs: bool) -> Self {
        Self {
            name: name.into(),
            sha: hex(&Sha256::digest(bytes.as_slice())),
            bytes,
            lfs,
        }
    }

    pub fn sha256(&self) -> String {
        self.sha.clone()
    }

    /// The git blob id the Hub lists: of the bytes for a plain file, of the LFS pointer file
    /// for an LFS one (as git stores it).
    pub fn blob_id(&self) -> String {
        let pointer;
        let bytes: &[u8] = if self.lfs {
            pointer = format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n",
                self.sha,
                self.bytes.len()
            );
            pointer.as_bytes()
        } else {
            &self.bytes
        };
        let mut h = sha1::Sha1::new();
        sha1::Digest::update(&mut h, format!("blob {}\0", bytes.len()).as_bytes());
        sha1::Digest::update(&mut h, bytes);
        hex(&sha1::Digest::finalize(h))
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone, Default)]
pub struct RepoData {
    pub files: Vec<File>,
    /// Gated: files need `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Serve this file with one byte changed (the listing keeps the true sha256).
    pub corrupt: Option<String>,
    /// Answer LFS files with a 302 to another host name (`localhost`), as the Hub sends them to
    /// its CDN; the CDN path serves the bytes with ranges.
    pub redirect: bool,
    /// Answer LFS files with a 302 that has no `Location` (a broken server).
    pub redirect_nowhere: bool,
    /// Answer LFS files with a 302 to `{this}/cdn/{repo}/{file}` (another server's base URL).
    pub redirect_to: Option<String>,
    pub hostile: Hostile,
}

/// What a hostile Hub does to the answers for one repo.
#[derive(Clone, Default)]
pub struct Hostile {
    /// The listing's `sha` in place of [`COMMIT`].
    pub sha: Option<String>,
    /// Siblings listed as they are, after the files' own.
    pub siblings: Vec<serde_json::Value>,
    /// Added to every listed size (the bytes served stay the true ones).
    pub size_delta: i64,
    /// Headers replacing (or added to) the Hub's on every file answer, redirects too.
    pub headers: Vec<(String, String)>,
    /// Answer every file request with 200 and the whole file, whatever its `Range`.
    pub ignore_range: bool,
    /// File bodies without `Content-Length` that never end (the file's bytes, over and over).
    pub endless: bool,
    /// Send this many bytes of a file body, then nothing for a minute.
    pub stall_after: Option<u64>,
    /// A listing padded with this many bytes (in a field the client ignores).
    pub listing_padding: usize,
    /// A listing without `Content-Length` that never ends.
    pub endless_listing: bool,
    /// A listing whose headers come, then nothing for a minute.
    pub stall_listing: bool,
}

/// One logged request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<(u64, Option<u64>)>,
    /// Whether the request carried an `Authorization` header.
    pub auth: bool,
}

#[derive(Default)]
pub struct Faults {
    /// Cut the connection once, half-way through the body of the first GET of this file whose
    /// range starts at or after this offset.
    pub cut: Mutex<Option<(String, u64)>>,
    pub cut_done: AtomicBool,
    /// Sleep this many microseconds after each 64 KiB of body.
    pub slow_us: AtomicU64,
    /// Search answers without `Content-Length` that never end.
    pub endless_search: AtomicBool,
}

pub struct HubServer {
    pub url: String,
    pub repos: Arc<Mutex<HashMap<String, RepoData>>>,
    pub log: Arc<Mutex<Vec<Seen>>>,
    pub faults: Arc<Faults>,
    /// Body bytes sent for resolve requests (not counting the 1-byte metadata probes).
    pub body_bytes: Arc<AtomicU64>,
}

impl HubServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let s = Self {
            url,
            repos: Arc::default(),
            log: Arc::default(),
            faults: Arc::default(),
            body_bytes: Arc::default(),
        };
        let (repos, log, faults, body) = (
            s.repos.clone(),
            s.log.clone(),
            s.faults.clone(),
            s.body_bytes.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (repos, log, faults, body) =
                    (repos.clone(), log.clone(), faults.clone(), body.clone());
                std::thread::spawn(move || {
                    let _ = handle(conn, &repos, &log, &faults, &body);
                });
            }
        });
        s
    }

    pub fn add(&self, repo: &str, data: RepoData) {
        self.repos.lock().expect("repos").insert(repo.into(), data);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().expect("log").clone()
    }
}

struct Req {
    method: String,
    target: String,
    headers: HashMap<String, String>,
}

fn read_req(conn: &TcpStream) -> std::io::Result<Option<Req>> {
    let mut r = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Ok(Some(Req {
        method,
        target,
        headers,
    }))
}

fn respond(
    conn: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

fn hub_error(conn: &mut TcpStream, status: &str, code: &str, msg: &str) -> std::io::Result<()> {
    let body = serde_json::json!({ "error": msg }).to_string();
    respond(
        conn,
        status,
        &[
            ("x-error-code", code.into()),
            ("x-error-message", msg.into()),
            ("content-type", "application/json".into()),
        ],
        body.as_bytes(),
    )
}

fn parse_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()))
}

fn handle(
    mut conn: TcpStream,
    repos: &Mutex<HashMap<String, RepoData>>,
    log: &Mutex<Vec<Seen>>,
    faults: &Faults,
    body_bytes: &AtomicU64,
) -> std::io::Result<()> {
    let Some(req) = read_req(&conn)? else {
        return Ok(());
    };
    let (path, query) = req
        .target
        .split_once('?')
        .unwrap_or((req.target.as_str(), ""));
    let range = req.headers.get("range").and_then(|r| parse_range(r));
    let auth = req.headers.get("authorization").cloned();
    log.lock().expect("log").push(Seen {
        method: req.method.clone(),
        path: path.to_string(),
        range,
        auth: auth.is_some(),
    });
    let repos = repos.lock().expect("repos").clone();
    if path == "/api/models" {
        let q = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("search="))
            .unwrap_or("");
        let hits: Vec<_> = repos
            .keys()
            .filter(|k| k.contains(q))
            .map(|k| serde_json::json!({"id": k, "downloads": 7, "likes": 1}))
            .collect();
        if faults.endless_search.load(Ordering::Relaxed) {
            return endless(&mut conn, "200 OK", &[], b"[", b"{\"id\":\"a/b\"},");
        }
        let body = serde_json::to_vec(&hits)?;
        return respond(&mut conn, "200 OK", &[], &body);
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let repo = rest.split("/revision/").next().unwrap_or(rest);
        return api_info(&mut conn, repos.get(repo), repo, auth.is_some());
    }
    let file = Served {
        faults,
        body_bytes,
        head: req.method == "HEAD",
        range,
        auth,
    };
    serve_file(&mut conn, &repos, path, &file)
}

/// What a file request asks and the faults to apply.
struct Served<'a> {
    faults: &'a Faults,
    body_bytes: &'a AtomicU64,
    head: bool,
    range: Option<(u64, Option<u64>)>,
    auth: Option<String>,
}

/// `GET /api/models/{repo}[/revision/{rev}]`.
fn api_info(
    conn: &mut TcpStream,
    data: Option<&RepoData>,
    repo: &str,
    auth: bool,
) -> std::io::Result<()> {
    let Some(data) = data else {
        let status = if auth {
            "404 Not Found"
        } else {
            "401 Unauthorized"
        };
        return hub_error(conn, status, "RepoNotFound", "Repository not found");
    };
    let h = &data.hostile;
    if h.endless_listing {
        let sib = br#"{"rfilename":"a.json","size":1,"blobId":"0123456789abcdef0123456789abcdef01234567"},"#;
        return endless(
            conn,
            "200 OK",
            &[],
            br#"{"sha":"0123456789abcdef0123456789abcdef01234567","siblings":["#,
            sib,
        );
    }
    if h.stall_listing {
        conn.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 100\r\n\r\n{")?;
        conn.flush()?;
        std::thread::sleep(Duration::from_secs(60));
        return Ok(());
    }
    let listed = |n: usize| (n as i64 + h.size_delta).max(0);
    let mut siblings: Vec<_> = data
        .files
        .iter()
        .map(|f| {
            let mut s = serde_json::json!({
                "rfilename": f.name,
                "size": listed(f.bytes.len()),
                "blobId": f.blob_id(),
            });
            if f.lfs {
                s["lfs"] = serde_json::json!({
                    "sha256": f.sha256(), "size": listed(f.bytes.len()), "pointerSize": 134
                });
            }
            s
        })
        .collect();
    siblings.extend(h.siblings.iter().cloned());
    let info = serde_json::json!({
        "id": repo, "modelId": repo, "sha": h.sha.as_deref().unwrap_or(COMMIT), "private": false,
        "gated": if data.token.is_some() { serde_json::json!("manual") } else { serde_json::json!(false) },
        "siblings": siblings,
        "padding": "x".repeat(h.listing_padding),
    });
    respond(conn, "200 OK", &[], &serde_json::to_vec(&info)?)
}

/// An answer without `Content-Length` that sends `head`, then `piece` over and over until the
/// client hangs up.
fn endless(
    conn: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    head: &[u8],
    piece: &[u8],
) -> std::io::Result<()> {
    let mut h = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    conn.write_all(h.as_bytes())?;
    conn.write_all(head)?;
    let block: Vec<u8> = piece.iter().copied().cycle().take(64 << 10).collect();
    // Bounded (4 GiB) so a client that never stops reading cannot keep a test alive forever.
    for _ in 0..(1 << 16) {
        conn.write_all(&block)?;
    }
    Ok(())
}

/// `headers` with the hostile ones put in place of (or beside) them.
fn with_hostile(mut headers: Vec<(&'static str, String)>, h: &Hostile) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    headers.retain(|(k, _)| !h.headers.iter().any(|(hk, _)| hk.eq_ignore_ascii_case(k)));
    out.extend(headers.into_iter().map(|(k, v)| (k.to_string(), v)));
    out.extend(h.headers.iter().cloned());
    out
}

/// `GET|HEAD /{owner}/{name}/resolve/{rev}/{file}`.
fn serve_file(
    conn: &mut TcpStream,
    repos: &HashMap<String, RepoData>,
    path: &str,
    req: &Served<'_>,
) -> std::io::Result<()> {
    // /{owner}/{name}/resolve/{rev}/{file}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let (owner, name, file, cdn) = match parts.as_slice() {
        [owner, name, "resolve", _rev, file] => (*owner, *name, *file, false),
        ["cdn", owner, name, file] => (*owner, *name, *file, true),
        _ => return hub_error(conn, "404 Not Found", "EntryNotFound", "not found"),
    };
    let repo = format!("{owner}/{name}");
    let Some(data) = repos.get(&repo) else {
        return hub_error(
            conn,
            "401 Unauthorized",
            "RepoNotFound",
            "Repository not found",
        );
    };
    if !cdn && !authorized(conn, data, &repo, req.auth.as_deref())? {
        return Ok(());
    }
    let Some(f) = data.files.iter().find(|f| f.name == *file) else {
        return hub_error(conn, "404 Not Found", "EntryNotFound", "Entry not found");
    };
    let sha = f.sha256();
    let h = &data.hostile;
    if data.redirect_nowhere && f.lfs {
        let headers = vec![
            ("x-repo-commit", COMMIT.to_string()),
            ("x-linked-etag", format!("\"{sha}\"")),
        ];
        return respond_owned(conn, "302 Found", &with_hostile(headers, h), b"");
    }
    let cdn_base = match (&data.redirect_to, data.redirect) {
        (Some(base), _) => Some(base.clone()),
        (None, true) => Some(format!("http://localhost:{}", conn.local_addr()?.port())),
        (None, false) => None,
    };
    if let Some(base) = cdn_base.filter(|_| f.lfs && !cdn) {
        let headers = vec![
            ("x-repo-commit", COMMIT.to_string()),
            ("etag", format!("\"{sha}\"")),
            ("x-linked-etag", format!("\"{sha}\"")),
            ("x-linked-size", f.bytes.len().to_string()),
            ("location", format!("{base}/cdn/{repo}/{file}")),
        ];
        return respond_owned(conn, "302 Found", &with_hostile(headers, h), b"");
    }
    serve_bytes(conn, data, f, req)
}

/// A file's bytes: the range asked (unless the repo ignores ranges), with the faults applied.
fn serve_bytes(
    conn: &mut TcpStream,
    data: &RepoData,
    f: &File,
    req: &Served<'_>,
) -> std::io::Result<()> {
    let (h, sha, file) = (&data.hostile, f.sha256(), f.name.as_str());
    let len = f.bytes.len() as u64;
    let mut headers = vec![
        ("x-repo-commit", COMMIT.to_string()),
        ("accept-ranges", "bytes".into()),
    ];
    if f.lfs {
        headers.push(("etag", format!("\"{sha}\"")));
        headers.push(("x-linked-etag", format!("\"{sha}\"")));
        headers.push(("x-linked-size", len.to_string()));
    } else {
        headers.push(("etag", format!("\"{}\"", f.blob_id())));
    }
    let range = req.range.filter(|_| !h.ignore_range);
    let (start, end, status) = match range {
        Some((a, _)) if a >= len => {
            headers.push(("content-range", format!("bytes */{len}")));
            return respond_owned(
                conn,
                "416 Range Not Satisfiable",
                &with_hostile(headers, h),
                b"",
            );
        }
        Some((a, b)) => (
            a,
            b.map_or(len - 1, |b| b.min(len - 1)),
            "206 Partial Content",
        ),
        None => (0, len.saturating_sub(1), "200 OK"),
    };
    if range.is_some() {
        headers.push(("content-range", format!("bytes {start}-{end}/{len}")));
    }
    let n = if len == 0 { 0 } else { end - start + 1 };
    let headers = with_hostile(headers, h);
    if h.endless && !req.head {
        let borrowed: Vec<(&str, String)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let from = f.bytes[start as usize..].to_vec();
        return endless(conn, status, &borrowed, &from, &f.bytes);
    }
    let mut head = format!("HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: {n}\r\n");
    for (k, v) in &headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    if req.head {
        return conn.flush();
    }
    let mut body = f.bytes[start as usize..start as usize + n as usize].to_vec();
    if data.corrupt.as_deref() == Some(file) && !body.is_empty() {
        let mid = (len / 2).clamp(start, end) - start;
        body[mid as usize] ^= 0x5a;
    }
    if let Some(k) = h.stall_after {
        conn.write_all(&body[..(k as usize).min(body.len())])?;
        conn.flush()?;
        std::thread::sleep(Duration::from_secs(60));
        return Ok(());
    }
    let cut = req.faults.cut.lock().expect("cut").clone();
    let cut_here = matches!(&cut, Some((cf, at)) if cf == file && start >= *at && n > 1)
        && !req.faults.cut_done.swap(true, Ordering::SeqCst);
    send_body(conn, &body, cut_here, req)
}

fn respond_owned(
    conn: &mut TcpStream,
    status: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let borrowed: Vec<(&str, String)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    respond(conn, status, &borrowed, body)
}

/// Sends `body` in 64 KiB pieces at the faults' pace (counted unless it is a 1-byte probe); with
/// `cut`, only its first half, then closes the connection.
fn send_body(
    conn: &mut TcpStream,
    body: &[u8],
    cut: bool,
    req: &Served<'_>,
) -> std::io::Result<()> {
    let send = if cut { body.len() / 2 } else { body.len() };
    for chunk in body[..send].chunks(64 << 10) {
        conn.write_all(chunk)?;
        if body.len() > 1 {
            req.body_bytes
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        let us = req.faults.slow_us.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }
    conn.flush()?;
    if cut {
        // Close mid-body: the client sees fewer bytes than Content-Length.
        let _ = conn.shutdown(std::net::Shutdown::Both);
    }
    Ok(())
}

/// Whether a gated repo's file may be served; answers 401 (no token) or 403 (a wrong one) if not.
fn authorized(
    conn: &mut TcpStream,
    data: &RepoData,
    repo: &str,
    auth: Option<&str>,
) -> std::io::Result<bool> {
    let Some(token) = &data.token else {
        return Ok(true);
    };
    let msg =
        format!("Access to model {repo} is restricted and you are not in the authorized list.");
    match auth {
        None => hub_error(conn, "401 Unauthorized", "GatedRepo", &msg)?,
        Some(a) if a != format!("Bearer {token}") => {
            hub_error(conn, "403 Forbidden", "GatedRepo", &msg)?;
        }
        Some(_) => return Ok(true),
    }
    Ok(false)
}
