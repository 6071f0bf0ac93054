//! [`HubError`]: why a Hub operation failed, each naming the server and, for a download, the
//! file; and the mapping of the Hub's HTTP error answers onto it.

use tpslab_engine::library::index::IndexError;

use super::config::HubConfig;

/// Why a Hub operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("the endpoint '{0}' is not an http:// or https:// URL")]
    BadEndpoint(String),
    #[error("cannot reach {endpoint}: {detail}")]
    Network { endpoint: String, detail: String },
    #[error("{file} at {endpoint}: its GGUF header cannot be read: {detail}")]
    BadHeader {
        endpoint: String,
        file: String,
        detail: String,
    },
    #[error(
        "the connection to {endpoint} broke while downloading {file} ({detail}); run the same pull again to resume"
    )]
    Interrupted {
        endpoint: String,
        file: String,
        detail: String,
    },
    #[error(
        "repository {repo} not found at {endpoint} (check the name; a private repo needs --token or HF_TOKEN)"
    )]
    RepoNotFound { repo: String, endpoint: String },
    #[error("revision '{revision}' not found in {repo}")]
    RevisionNotFound { repo: String, revision: String },
    #[error("file {file} not found in {repo}")]
    FileNotFound { repo: String, file: String },
    #[error(
        "{repo} is a gated repository: accept its terms on its Hub page, then pass --token or set HF_TOKEN"
    )]
    GatedNoToken { repo: String },
    #[error(
        "access to {repo} was refused with the token given: accept the repository's terms on its Hub page, or check the token"
    )]
    Refused { repo: String },
    #[error("{url} answered HTTP {status}: {message}")]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{endpoint} sent an answer that is not the Hub's API: {detail}")]
    BadAnswer { endpoint: String, detail: String },
    /// A name, id or header that would lead a path (or the token) somewhere it must not go.
    #[error("refused what {endpoint} sent: {detail}; the library is unchanged")]
    Unsafe { endpoint: String, detail: String },
    #[error("{url}: {what} is larger than {limit_mib} MiB; refused")]
    TooLarge {
        url: String,
        what: &'static str,
        limit_mib: u64,
    },
    #[error("{url} did not finish {what} within {secs} s; gave up")]
    Timeout {
        url: String,
        secs: u64,
        what: String,
    },
    #[error("{url} redirected {detail}; refused")]
    Redirect { url: String, detail: String },
    #[error(
        "{endpoint} lists no checksum for {file} (neither an LFS sha256 nor a git blob id), so it cannot be verified; it was not downloaded"
    )]
    Unverifiable { endpoint: String, file: String },
    #[error("{0}")]
    Choose(String),
    #[error(
        "{file} from {endpoint} failed its checksum: the Hub lists {kind} {expected}, the download has {found}; it was discarded and the library is unchanged"
    )]
    Checksum {
        endpoint: String,
        file: String,
        kind: &'static str,
        expected: String,
        found: String,
    },
    #[error(
        "{file} from {endpoint}: the Hub lists {expected} bytes, the server sends {found}; it was discarded"
    )]
    Size {
        endpoint: String,
        file: String,
        expected: u64,
        found: String,
    },
    #[error(
        "{endpoint} sent more than the {expected} bytes it lists for {file}; the download was cut off there and discarded"
    )]
    TooLong {
        endpoint: String,
        file: String,
        expected: u64,
    },
    #[error("another pull is downloading {0} into this library now; wait for it to finish")]
    Busy(String),
    #[error("download cancelled; the library is unchanged")]
    Cancelled,
    #[error(transparent)]
    Library(#[from] IndexError),
}

/// The error and its sources on one line (reqwest's own text names only the outer layer).
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// Maps an HTTP error answer (status and the Hub's `X-Error-Code`) to a clear error.
pub(super) fn status_error(
    cfg: &HubConfig,
    repo: &str,
    revision: &str,
    url: &str,
    status: u16,
    code: &str,
    message: &str,
) -> HubError {
    let repo = repo.to_string();
    // The Hub refuses a gated repo with 401 (no token) or 403 (a token without access).
    if code == "GatedRepo" || status == 403 {
        return if cfg.token.is_none() {
            HubError::GatedNoToken { repo }
        } else {
            HubError::Refused { repo }
        };
    }
    match (status, code) {
        (_, "RevisionNotFound") => HubError::RevisionNotFound {
            repo,
            revision: revision.to_string(),
        },
        (_, "EntryNotFound") => HubError::FileNotFound {
            repo,
            file: url.rsplit('/').next().unwrap_or(url).to_string(),
        },
        (_, "RepoNotFound") | (404, _) => HubError::RepoNotFound {
            repo,
            endpoint: cfg.endpoint.clone(),
        },
        (401, _) if cfg.token.is_none() => HubError::RepoNotFound {
            repo,
            endpoint: cfg.endpoint.clone(),
        },
        _ => HubError::Http {
            url: url.to_string(),
            status,
            message: if message.is_empty() {
                "no message".into()
            } else {
                message.to_string()
            },
        },
    }
}
