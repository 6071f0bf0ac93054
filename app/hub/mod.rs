//! Downloading models from the Hugging Face Hub (or any server that speaks its API) into the
//! model library. Everything a server sends is untrusted (design: "Untrusted input").
//!
//! Why here and not in the engine: the engine has no async runtime and no network; the app
//! already carries tokio, and the download is a front-end concern (the CLI's `tpslab pull` and
//! the Models panel). The engine's [`Library`] does the part both share: staging, verifying and
//! installing files into the library folder, and keeping writes inside it.
//!
//! What hf-hub gives: the endpoint and token settings ([`HubConfig`], `HF_ENDPOINT` /
//! `HF_TOKEN`, the saved login) and the API's URL shapes (`ApiRepo::url`, `info_request`).
//! What this module does itself, because hf-hub builds cache paths from the `ETag`,
//! `X-Linked-Etag` and `X-Repo-Commit` headers unchecked and its client has no timeouts:
//! - the plain types ([`config`]): [`HubConfig`], [`PullProgress`];
//! - every name and id from a server is checked before use ([`names`], [`listing`]): commits
//!   are 40 hex digits, file names safe relative paths, checksums well-formed; headers are
//!   checked against the listing;
//! - HTTP ([`http`]): connect, read and stall timeouts on every request; listing and search
//!   bodies capped (16 MiB, 4 MiB); at most 5 redirects, to http(s) only, the token only to the
//!   endpoint's own origin;
//! - the download ([`download`]): ranged GETs into `models/.hub-cache/blobs/<checksum>.part`
//!   (names made from validated checksums only, never through a symlink), sizes checked while
//!   streaming (a server that ignores `Range` restarts the file from 0; one that sends more than
//!   it lists is cut off), resumed from the partial file on the next pull, each whole file
//!   verified: sha256 for LFS files, the git blob id for the others;
//! - the pull ([`pull`]): choosing the files (one GGUF, or the safetensors set), progress with
//!   speed and ETA, cancel, the move into the library only when every file is whole and
//!   verified and the engine can load the model, and clear errors naming file and server.
//!
//! - the resolver ([`resolve`]): a model reference (`owner/name:QUANT`, `-hf`) found in the
//!   library or the Hugging Face cache, else pulled; the one way every command names a model.
//!
//! - the fit ([`fit`]): each GGUF of a repo read from its header alone (range requests,
//!   bounded), for its quant type, architecture and memory need before a download.
//!
//! API for a UI worker thread (all blocking; each call runs its own small tokio runtime):
//! - [`list_files`]`(&HubConfig, repo, revision) -> RepoListing`: files with sizes and checksums.
//! - [`search`]`(&HubConfig, query, limit) -> Vec<SearchHit>`.
//! - [`read_ggufs`]`(&HubConfig, &RepoListing) -> Vec<GgufFit>`: each GGUF's needs from its
//!   header; [`GgufFit::verdict`] against a [`Machine`] at a context and batch.
//! - [`pull`]`(&HubConfig, &Library, &PullRequest, &AtomicBool, &mut dyn FnMut(&PullProgress))
//!   -> ModelEntry`: downloads, verifies and registers the model; setting the flag cancels
//!   within ~0.1 s, leaving nothing in the library (partial files, and whole verified ones of a
//!   set not yet complete, stay in the hub cache for the next pull).

#[cfg(doc)]
use tpslab_engine::library::index::Library;

mod config;
mod download;
mod error;
mod fit;
mod http;
mod listing;
mod meter;
mod names;
mod pull;
mod resolve;

pub use config::{DEFAULT_ENDPOINT, HubConfig, PullProgress};
pub use error::HubError;
pub use fit::{GgufFit, MAX_HEADER_MIB, Machine, read_ggufs};
pub use listing::{Choice, RepoFile, RepoListing, SearchHit, list_files, search};
pub use meter::human_bytes;
pub use pull::{PullRequest, pull};
pub use resolve::resolve_model;
