//! The HTTP side of the Hub client: one reqwest client with a connect timeout and no automatic
//! redirects. [`Http::get`] follows at most [`MAX_REDIRECTS`] redirects itself, to http(s) URLs
//! only, and sends the token only to the configured endpoint's origin (the Hub redirects LFS
//! downloads to a CDN on another host, which gets no token); [`Http::read_capped`] reads a body
//! up to a size cap and a time limit, stopping as soon as either is passed.
//!
//! Why not hf-hub's client: it carries the token as a default header on every request, has no
//! timeouts and follows redirects on its own; its endpoint, token and URL shapes are still used
//! ([`super::HubConfig`], [`hf_hub::api::tokio::ApiRepo::url`], `info_request`).

use hf_hub::Cache;
use hf_hub::api::tokio::{Api, ApiBuilder};
use reqwest::header::{AUTHORIZATION, HeaderMap, LOCATION, RANGE, USER_AGENT};
use reqwest::{Response, StatusCode, Url};

use super::config::HubConfig;
use super::error::HubError;
use super::error::chain;
use super::meter::Meter;
use super::names::shown;

/// The most redirects one request follows (the Hub sends one, to its CDN).
pub(super) const MAX_REDIRECTS: usize = 5;

/// Checks each answer's headers (redirects too) before anything else looks at it.
pub(super) type HeaderCheck<'c> = dyn Fn(&Url, &HeaderMap) -> Result<(), HubError> + 'c;

/// The client, the endpoint it trusts with the token, and the time limits.
pub(super) struct Http {
    client: reqwest::Client,
    endpoint: Url,
    token: Option<String>,
    pub cfg: HubConfig,
}

/// scheme, host and port: where a URL's requests go.
fn origin(u: &Url) -> (&str, Option<&str>, Option<u16>) {
    (u.scheme(), u.host_str(), u.port_or_known_default())
}

/// `scheme://host:port` of a URL, to name a server in a message.
pub(super) fn server_of(u: &Url) -> String {
    let mut s = format!("{}://{}", u.scheme(), u.host_str().unwrap_or(""));
    if let Some(p) = u.port() {
        s.push_str(&format!(":{p}"));
    }
    s
}

impl Http {
    pub fn new(cfg: &HubConfig) -> Result<Self, HubError> {
        let bad = || HubError::BadEndpoint(cfg.endpoint.clone());
        let endpoint = Url::parse(&cfg.endpoint).map_err(|_| bad())?;
        if !matches!(endpoint.scheme(), "http" | "https")
            || endpoint.host_str().is_none_or(str::is_empty)
            || !endpoint.username().is_empty()
            || endpoint.password().is_some()
        {
            return Err(bad());
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(cfg.connect_timeout)
            .build()
            .map_err(|e| HubError::Network {
                endpoint: cfg.endpoint.clone(),
                detail: chain(&e),
            })?;
        Ok(Self {
            client,
            endpoint,
            token: cfg.token.clone(),
            cfg: cfg.clone(),
        })
    }

    /// GETs `url` (the bytes `range` when given, both ends inclusive), following redirects as
    /// the module doc says; `check` sees the headers of every answer first. Returns the final
    /// answer, whatever its status.
    pub async fn get(
        &self,
        meter: &mut Meter<'_>,
        mut url: Url,
        range: Option<(u64, u64)>,
        check: &HeaderCheck<'_>,
    ) -> Result<Response, HubError> {
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self
                .client
                .get(url.clone())
                .header(USER_AGENT, concat!("tpslab/", env!("CARGO_PKG_VERSION")));
            if let Some((a, b)) = range {
                req = req.header(RANGE, format!("bytes={a}-{b}"));
            }
            if let Some(t) = &self.token
                && origin(&url) == origin(&self.endpoint)
            {
                req = req.header(AUTHORIZATION, format!("Bearer {t}"));
            }
            let net = |e: &reqwest::Error| HubError::Network {
                endpoint: server_of(&url),
                detail: chain(e),
            };
            let resp = meter
                .wait(req.send(), self.cfg.read_timeout)
                .await?
                .ok_or_else(|| HubError::Timeout {
                    url: url.to_string(),
                    secs: self.cfg.read_timeout.as_secs(),
                    what: "answering".into(),
                })?
                .map_err(|e| net(&e))?;
            check(&url, resp.headers())?;
            if !matches!(
                resp.status(),
                StatusCode::MOVED_PERMANENTLY
                    | StatusCode::FOUND
                    | StatusCode::SEE_OTHER
                    | StatusCode::TEMPORARY_REDIRECT
                    | StatusCode::PERMANENT_REDIRECT
            ) {
                return Ok(resp);
            }
            url = self.next_hop(&url, resp.headers())?;
        }
        Err(HubError::Redirect {
            url: url.to_string(),
            detail: format!("more than {MAX_REDIRECTS} times"),
        })
    }

    /// Where a redirect from `from` leads: its `Location`, resolved against `from`, which must
    /// be an http(s) URL without user info.
    fn next_hop(&self, from: &Url, headers: &HeaderMap) -> Result<Url, HubError> {
        let refuse = |detail: String| HubError::Redirect {
            url: from.to_string(),
            detail,
        };
        let loc = headers.get(LOCATION).ok_or_else(|| HubError::BadAnswer {
            endpoint: self.cfg.endpoint.clone(),
            detail: format!("a redirect without a Location header for {from}"),
        })?;
        let loc = loc
            .to_str()
            .map_err(|_| refuse("to a Location that is not text".into()))?;
        let next = from
            .join(loc)
            .map_err(|e| refuse(format!("to {} ({e})", shown(loc))))?;
        if !matches!(next.scheme(), "http" | "https") {
            return Err(refuse(format!(
                "to {}, which is not an http:// or https:// URL",
                shown(loc)
            )));
        }
        if !next.username().is_empty() || next.password().is_some() {
            return Err(refuse(format!(
                "to {}, a URL with a user name or password in it",
                shown(loc)
            )));
        }
        Ok(next)
    }

    /// The whole body of `resp`, refused past `cap_mib` MiB (by its `Content-Length` before
    /// reading, or while reading) or when it takes longer than the read timeout.
    pub async fn read_capped(
        &self,
        meter: &mut Meter<'_>,
        mut resp: Response,
        cap_mib: u64,
        what: &'static str,
    ) -> Result<Vec<u8>, HubError> {
        let url = resp.url().to_string();
        let cap = cap_mib << 20;
        let too_large = || HubError::TooLarge {
            url: url.clone(),
            what,
            limit_mib: cap_mib,
        };
        if resp.content_length().is_some_and(|n| n > cap) {
            return Err(too_large());
        }
        let deadline = std::time::Instant::now() + self.cfg.read_timeout;
        let mut body = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let chunk = meter
                .wait(resp.chunk(), left)
                .await?
                .ok_or_else(|| HubError::Timeout {
                    url: url.clone(),
                    secs: self.cfg.read_timeout.as_secs(),
                    what: format!("sending {what}"),
                })?
                .map_err(|e| HubError::Network {
                    endpoint: self.cfg.endpoint.clone(),
                    detail: format!("{url}: {}", chain(&e)),
                })?;
            let Some(chunk) = chunk else {
                return Ok(body);
            };
            if (body.len() + chunk.len()) as u64 > cap {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
    }
}

/// A header's value as text ("" when absent or not text).
pub(super) fn header(h: &HeaderMap, k: &str) -> String {
    h.get(k)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// hf-hub's API, for its URL shapes only (requests go through [`Http`]). Its cache folder is
/// never written: nothing is downloaded through it.
pub(super) fn hub_api(cfg: &HubConfig) -> Result<Api, HubError> {
    ApiBuilder::from_cache(Cache::new(std::env::temp_dir()))
        .with_endpoint(cfg.endpoint.trim_end_matches('/').to_string())
        .with_progress(false)
        .with_user_agent("tpslab", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|_| HubError::BadEndpoint(cfg.endpoint.clone()))
}

/// A small runtime of its own for each blocking call.
pub(super) fn runtime() -> Result<tokio::runtime::Runtime, HubError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HubError::Network {
            endpoint: String::new(),
            detail: format!("cannot start the async runtime: {e}"),
        })
}
