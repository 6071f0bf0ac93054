//! What a web browser may do with the server: the DNS-rebinding guard on `Host` and the
//! cross-origin guard on `Origin`, with CORS for the origins the user names.
//!
//! A page the user visits can send a "simple" cross-origin request (a `text/plain` POST needs
//! no preflight) to `http://127.0.0.1:8080`, and a page on a name that resolves to 127.0.0.1
//! (DNS rebinding) can even read the answers. So, as llama.cpp's server and Ollama do:
//! - a request whose `Host` is not an IP address, `localhost` (or `*.localhost`) or a name
//!   given with `--allowed-host` is refused (403): a rebound name is none of these;
//! - a request with an `Origin` that is neither its own (`http://` + its `Host`) nor one given
//!   with `--cors-origin` is refused (403) before it reaches a handler, preflight or not;
//! - the named origins get CORS: preflights answered, `Access-Control-Allow-Origin` on every
//!   response. With no `--cors-origin` there is no CORS at all.
//!
//! Clients that are not browsers send no `Origin` and an IP or `localhost` `Host`, so they never
//! meet either guard.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clap::Args;

use super::ServerState;
use super::errors::ApiError;

/// Which browsers' requests are served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrowserPolicy {
    /// Origins (`scheme://host[:port]`, compared without case) given CORS; `*` for any.
    pub cors_origins: Vec<String>,
    /// Host names accepted in `Host` besides IP addresses and `localhost`; `*` for any.
    pub allowed_hosts: Vec<String>,
}

/// The policy as `tpslab serve` flags.
#[derive(Args, Debug, Clone, Default)]
pub struct BrowserArgs {
    /// Let web pages from ORIGIN (e.g. `http://localhost:3000`) call the server (CORS);
    /// repeatable; `*` allows every origin. Without it, cross-origin requests are refused.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Accept requests addressed to NAME (the `Host` header) besides IP addresses and
    /// `localhost`: the server's own DNS name when clients use it; repeatable; `*` turns the
    /// DNS-rebinding guard off.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_hosts: Vec<String>,
}

impl BrowserArgs {
    pub fn policy(&self) -> BrowserPolicy {
        let lower = |v: &[String]| {
            v.iter()
                .map(|s| s.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect()
        };
        BrowserPolicy {
            cors_origins: lower(&self.cors_origins),
            allowed_hosts: lower(&self.allowed_hosts),
        }
    }
}

/// The host part of a `Host` header value (`name`, `name:port`, `1.2.3.4:80`, `[::1]:80`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        // `[v6]` or `[v6]:port`; an unclosed bracket is no address.
        return rest.split_once(']').map_or(host, |(v6, _)| v6);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

impl BrowserPolicy {
    /// Whether `host` (the `Host` header) names this server in a way no rebound DNS name can.
    pub fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
        name.parse::<IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.allowed_hosts.iter().any(|a| a == "*" || *a == name)
    }

    /// Whether a request from `origin` to `host` is served: its own origin, or a named one.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        let own = host.is_some_and(|h| {
            let h = h.to_ascii_lowercase();
            origin == format!("http://{h}") || origin == format!("https://{h}")
        });
        own || self.cors(&origin)
    }

    /// Whether `origin` (lower case) gets CORS headers.
    fn cors(&self, origin: &str) -> bool {
        self.cors_origins.iter().any(|o| o == "*" || o == origin)
    }
}

fn refused(message: String) -> Response {
    ApiError {
        status: StatusCode::FORBIDDEN,
        message,
        kind: "invalid_request_error",
        param: None,
        code: Some("forbidden"),
    }
    .into_response()
}

/// The request headers a preflight may ask for, echoed back when short and plain.
fn allowed_request_headers(h: &HeaderMap) -> HeaderValue {
    h.get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .filter(|v| {
            v.len() <= 512
                && v.as_bytes()
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b" ,-_".contains(b))
        })
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"))
}

/// The middleware: the two guards, then CORS for the origins that pass them.
pub async fn guard(State(st): State<Arc<ServerState>>, req: Request, next: Next) -> Response {
    let p = &st.browser;
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(h) = host
        && !p.host_allowed(h)
    {
        let shown: String = h.chars().take(100).collect();
        return refused(format!(
            "requests addressed to host {shown:?} are refused (a web page on a rebound DNS name \
             could drive the server): use the server's IP address or localhost, or start it \
             with --allowed-host NAME"
        ));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return next.run(req).await;
    };
    let origin_text = origin.to_str().unwrap_or("");
    if !p.origin_allowed(origin_text, host) {
        let shown: String = origin_text.chars().take(100).collect();
        return refused(format!(
            "cross-origin request from {shown:?} refused: start the server with \
             --cors-origin {shown} to let pages from there call it"
        ));
    }
    let origin = origin.clone();
    let cors = p.cors(&origin_text.trim_end_matches('/').to_ascii_lowercase());
    if req.method() == Method::OPTIONS
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        let mut r = StatusCode::NO_CONTENT.into_response();
        if cors {
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                allowed_request_headers(headers),
            );
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            add_cors(h, origin);
        }
        return r;
    }
    let mut r = next.run(req).await;
    if cors {
        add_cors(r.headers_mut(), origin);
    }
    r
}

fn add_cors(h: &mut HeaderMap, origin: HeaderValue) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(header::VARY, HeaderValue::from_static("Origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(cors: &[&str], hosts: &[&str]) -> BrowserPolicy {
        BrowserArgs {
            cors_origins: cors.iter().map(|s| (*s).to_string()).collect(),
            allowed_hosts: hosts.iter().map(|s| (*s).to_string()).collect(),
        }
        .policy()
    }

    #[test]
    fn hosts_are_addresses_localhost_or_named() {
        let p = policy(&[], &["Box.Example"]);
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "10.0.0.7:80",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "box.example:8080",
            "localhost.",
        ] {
            assert!(p.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1.nip.io",
            "localhost.evil.example",
            "[::1",
            "",
        ] {
            assert!(!p.host_allowed(bad), "{bad}");
        }
        assert!(policy(&[], &["*"]).host_allowed("anything.example"));
    }

    #[test]
    fn origins_are_the_request_own_or_named() {
        let p = policy(&["http://localhost:3000/"], &[]);
        let host = Some("127.0.0.1:8080");
        assert!(p.origin_allowed("http://127.0.0.1:8080", host));
        assert!(p.origin_allowed("HTTP://LOCALHOST:3000", host));
        assert!(!p.origin_allowed("http://localhost:3001", host));
        assert!(!p.origin_allowed("https://evil.example", host));
        assert!(!p.origin_allowed("null", host));
        assert!(!p.origin_allowed("http://127.0.0.1:8080", None));
        assert!(policy(&["*"], &[]).origin_allowed("https://evil.example", host));
    }
}
