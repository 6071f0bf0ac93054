//! The API key: where it comes from (`--api-key`, `--api-key-file`, `TPSLAB_API_KEY`), and the
//! middleware that asks for it, comparing in constant time.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request as HttpRequest, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clap::Args;
use sha2::{Digest, Sha256};

use super::errors::ApiError;
use super::state::ServerState;

/// The environment variable a key is read from when no flag gives one (the one `tpslab bench
/// --endpoint` and `tpslab tune --endpoint` send theirs from).
pub const KEY_ENV: &str = "TPSLAB_API_KEY";

/// Bytes of a key file read at most: a key is one short line, and the path may name anything.
const KEY_FILE_BYTES: u64 = 64 << 10;

/// Where the key comes from, as `tpslab serve` flags.
#[derive(Args, Debug, Clone, Default)]
pub struct KeyArgs {
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics (also read from
    /// TPSLAB_API_KEY when no flag gives a key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Read the key from the first line of FILE (spaces around it trimmed), so it stays out of
    /// the process list and the shell history.
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<PathBuf>,
}

/// A key that cannot be used, named with where it came from.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the API key file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the API key {from} is empty: write the key on its first line")]
    Empty { from: String },
    #[error("the API key {from} is not UTF-8 text")]
    NotText { from: String },
    #[error("the API key {from} holds control characters, which no HTTP header can carry")]
    Control { from: String },
}

impl KeyArgs {
    /// The key: `--api-key`, else `--api-key-file`'s first line, else `TPSLAB_API_KEY`
    /// (read through `env`), else none. A given key that is empty is refused, not dropped:
    /// a server believed to be keyed must not run open.
    pub fn key(&self, env: impl Fn(&str) -> Option<String>) -> Result<Option<String>, KeyError> {
        if let Some(k) = &self.api_key {
            return checked(k, "given with --api-key").map(Some);
        }
        if let Some(path) = &self.api_key_file {
            return read_key_file(path).map(Some);
        }
        match env(KEY_ENV) {
            Some(k) => checked(&k, &format!("in {KEY_ENV}")).map(Some),
            None => Ok(None),
        }
    }
}

fn read_key_file(path: &Path) -> Result<String, KeyError> {
    let unreadable = |source| KeyError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(KEY_FILE_BYTES).read_to_end(&mut bytes))
        .map_err(unreadable)?;
    let from = format!("file {}", path.display());
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let text = std::str::from_utf8(first).map_err(|_| KeyError::NotText { from: from.clone() })?;
    checked(text, &from)
}

/// The key trimmed; refused when empty or holding control characters.
fn checked(key: &str, from: &str) -> Result<String, KeyError> {
    let k = key.trim();
    if k.is_empty() {
        return Err(KeyError::Empty { from: from.into() });
    }
    if k.chars().any(char::is_control) {
        return Err(KeyError::Control { from: from.into() });
    }
    Ok(k.to_string())
}

/// The middleware: with a key set, a request without `Authorization: Bearer <key>` gets a 401.
pub async fn auth(State(st): State<Arc<ServerState>>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares keys in time independent of where they differ and of their lengths: the SHA-256
/// digests (always 32 bytes) are compared without an early exit.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    let (da, db) = (Sha256::digest(a), Sha256::digest(b));
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_by_content_whatever_their_lengths() {
        assert!(same_key(b"sesame", b"sesame"));
        assert!(!same_key(b"sesame", b"sesamE"));
        assert!(!same_key(b"sesame", b"sesame-and-more"));
        assert!(!same_key(b"", b"sesame"));
        assert!(same_key(b"", b""));
    }

    #[test]
    fn a_flag_beats_the_environment_and_empty_keys_are_refused() {
        let env = |k: &str| (k == KEY_ENV).then(|| " from-env \n".to_string());
        let none = |_: &str| None;
        let flag = KeyArgs {
            api_key: Some("flag".into()),
            api_key_file: None,
        };
        assert_eq!(flag.key(env).ok().flatten().as_deref(), Some("flag"));
        let plain = KeyArgs::default();
        assert_eq!(plain.key(env).ok().flatten().as_deref(), Some("from-env"));
        assert!(matches!(plain.key(none), Ok(None)));
        let blank = |_: &str| Some("  ".to_string());
        assert!(matches!(plain.key(blank), Err(KeyError::Empty { .. })));
        let empty = KeyArgs {
            api_key: Some(String::new()),
            api_key_file: None,
        };
        assert!(matches!(empty.key(none), Err(KeyError::Empty { .. })));
    }
}
