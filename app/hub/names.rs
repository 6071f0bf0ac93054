//! Checks on every name and id a Hub sends or a user types before it is used: repo ids,
//! revisions, commit ids, checksums, entity tags; and the percent-encoding of a file name in a
//! download URL. File names are checked by the engine's [`tpslab_engine::library::check_name`]
//! (one definition for the library and the Hub).

/// Longest repo id part the Hub allows (`owner` and `name` each).
const MAX_REPO_PART: usize = 96;
/// Longest revision (branch, tag or commit) taken from the user.
const MAX_REVISION: usize = 256;
/// Longest entity tag accepted from a server.
const MAX_ETAG: usize = 200;

/// Why `id` is not a Hub repo id: `owner/name` (or a bare legacy `name`), each part 1 to 96
/// of `A-Z a-z 0-9 _ . -`, not starting or ending with `.` or `-`, with no `..` or `--` (the
/// Hub's own rules; they also keep an id from ever being a path outside a folder).
pub fn check_repo_id(id: &str) -> Result<(), &'static str> {
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 2 {
        return Err("it has more than one '/'");
    }
    for p in parts {
        if p.is_empty() || p.len() > MAX_REPO_PART {
            return Err("each part must be 1 to 96 characters");
        }
        if !p
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err("only letters, digits, '_', '.' and '-' may be used");
        }
        if p.starts_with(['.', '-']) || p.ends_with(['.', '-']) {
            return Err("a part may not start or end with '.' or '-'");
        }
        if p.contains("..") || p.contains("--") {
            return Err("'..' and '--' are not allowed");
        }
    }
    Ok(())
}

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

/// `s` in lower case when it is exactly `len` hex digits.
pub fn hex_of_len(s: &str, len: usize) -> Option<String> {
    (s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_ascii_lowercase())
}

/// A git commit id: 40 hex digits, in lower case.
pub fn commit_id(s: &str) -> Option<String> {
    hex_of_len(s, 40)
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

/// A name as it can be shown in a message: quoted, with control characters escaped (a hostile
/// name must not rewrite the terminal), cut at 200 characters.
pub fn shown(name: &str) -> String {
    let cut: String = name.chars().take(200).collect();
    let more = if cut.len() < name.len() { "..." } else { "" };
    format!("{cut:?}{more}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        for ok in ["gpt2", "tpslab/tiny-st", "Qwen/Qwen2.5-0.5B", "a_b/c.d"] {
            assert_eq!(check_repo_id(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "a/b/c",
            "../x",
            "a/..",
            "/abs",
            "a/",
            "a b/c",
            "a/.hidden",
            "a--b/c",
            "a/b-",
        ] {
            assert!(check_repo_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn revisions_commits_and_tags() {
        assert!(check_revision("main").is_ok());
        assert!(check_revision("refs/pr/1").is_ok());
        for bad in ["", "..", "a/../b", "a?b", "a#b", "a\nb", "a//b"] {
            assert!(check_revision(bad).is_err(), "{bad:?}");
        }
        let c = "0123456789abcdef0123456789ABCDEF01234567";
        assert_eq!(commit_id(c).as_deref(), Some(c.to_lowercase().as_str()));
        assert_eq!(commit_id("../../etc"), None);
        assert_eq!(commit_id(&c[..39]), None);
        assert_eq!(entity_tag("\"abc-1\""), Some("abc-1"));
        assert_eq!(entity_tag("W/\"abc\""), Some("abc"));
        assert_eq!(entity_tag("\"../../x\""), None);
        assert_eq!(entity_tag("\"/tmp/x\""), None);
        assert_eq!(entity_tag("\"\""), None);
        assert_eq!(url_path("q4/a b#?.gguf"), "q4/a%20b%23%3F.gguf");
        assert_eq!(shown("a\u{1b}[2J"), "\"a\\u{1b}[2J\"");
    }
}
