//! Checks on every name and id a Hub sends or a user types before it is used: repo ids,
//! revisions, commit ids, checksums, entity tags; and the percent-encoding of a file name in a
//! download URL. File names are checked by the engine's [`tpslab_engine::library::check_name`],
//! repo ids and commit ids by its [`tpslab_engine::library::model_ref`] (one definition for the
//! library, the Hugging Face cache and the Hub).

pub use tpslab_engine::library::model_ref::{check_repo_id, commit_id, hex_of_len, shown};

/// Longest revision (branch, tag or commit) taken from the user.
const MAX_REVISION: usize = 256;
/// Longest entity tag accepted from a server.
const MAX_ETAG: usize = 200;

/// Why `rev` is not a usable revision: it goes into the listing's URL, so it may not be empty,
/// `.`/`..` (which a URL would resolve away), or hold control characters, `?`, `#` or `\`.
pub fn check_revision(rev: &str) -> Result<(), &'static str> {
    if rev.is_empty() || rev.len() > MAX_REVISION {
        return Err("it must be 1 to 256 characters");
    }
    if rev
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err("it has an empty, '.' or '..' part");
    }
    if rev
        .chars()
        .any(|c| c.is_control() || matches!(c, '?' | '#' | '\\' | '%' | ' '))
    {
        return Err("it holds a control character, a space or one of ? # \\ %");
    }
    Ok(())
}

/// The value inside an entity tag header (`ETag`, `X-Linked-Etag`): `"v"`, `W/"v"` or a bare
/// `v`, where `v` is 1 to 200 of `A-Z a-z 0-9 . _ - + =` (what the Hub, S3, CloudFront and GCS
/// send). Anything else (a `/`, `..`, a space, a quote inside) is `None`.
pub fn entity_tag(h: &str) -> Option<&str> {
    let h = h.strip_prefix("W/").unwrap_or(h);
    let v = h
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(h);
    let ok = !v.is_empty()
        && v.len() <= MAX_ETAG
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+' | b'='));
    ok.then_some(v)
}

/// A checked file name (see [`tpslab_engine::library::check_name`]) as a URL path: each part
/// percent-encoded except the unreserved characters, the `/` between parts kept.
pub fn url_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_commits_and_tags() {
        assert!(check_revision("main").is_ok());
        assert!(check_revision("refs/pr/1").is_ok());
        for bad in ["", "..", "a/../b", "a?b", "a#b", "a\nb", "a//b"] {
            assert!(check_revision(bad).is_err(), "{bad:?}");
        }
        assert_eq!(entity_tag("\"abc-1\""), Some("abc-1"));
        assert_eq!(entity_tag("W/\"abc\""), Some("abc"));
        assert_eq!(entity_tag("\"../../x\""), None);
        assert_eq!(entity_tag("\"/tmp/x\""), None);
        assert_eq!(entity_tag("\"\""), None);
        assert_eq!(url_path("q4/a b#?.gguf"), "q4/a%20b%23%3F.gguf");
        assert_eq!(shown("a\u{1b}[2J"), "\"a\\u{1b}[2J\"");
    }
}
