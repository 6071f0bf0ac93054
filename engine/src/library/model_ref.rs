//! A model as a user names it (`--model`, `-hf`, the window's `-m`): a path, `default`, a name
//! in the library, or a Hugging Face repo `owner/name[:QUANT]` (also written
//! `hf.co/owner/name[:QUANT]` or `https://huggingface.co/owner/name[:QUANT]`), the way
//! llama.cpp's `-hf` takes it ([`ModelRef`], [`HubRef`]); the choice of a repo's GGUF file by its
//! quant tag, split parts together ([`pick_gguf`]); and the checks on repo ids and commit ids,
//! one definition for the Hugging Face cache reader and the Hub client.

use std::path::PathBuf;

use crate::formats::gguf_split;
use crate::library::entry::{is_model_name, occupied};

/// The quant tags tried, in order, when a repo is named without one (llama.cpp's order); then
/// the first model file of the repo.
pub const DEFAULT_QUANTS: [&str; 2] = ["Q4_K_M", "Q8_0"];
/// Longest repo id part the Hub allows (`owner` and `name` each).
const MAX_REPO_PART: usize = 96;
/// Longest quant tag taken (`UD-Q4_K_XL` and the like are far shorter).
const MAX_QUANT: usize = 64;
/// What a GGUF file of a repo is not the model when its name holds one of these (a vision
/// projector, an importance matrix, a draft head): llama.cpp's list.
const NOT_A_MODEL: [&str; 6] = ["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"];
/// The prefixes a Hub reference may be written with.
const HUB_PREFIXES: [&str; 5] = [
    "https://huggingface.co/",
    "http://huggingface.co/",
    "huggingface.co/",
    "https://hf.co/",
    "hf.co/",
];

/// Why `id` is not a Hub repo id: `owner/name` (or a bare legacy `name`), each part 1 to 96
/// of `A-Z a-z 0-9 _ . -`, not starting or ending with `.` or `-`, with no `..` or `--` (the
/// Hub's own rules; they also keep an id from ever being a path outside a folder, and make the
/// cache's `models--owner--name` folder names read back unambiguously).
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

/// `s` in lower case when it is exactly `len` hex digits.
pub fn hex_of_len(s: &str, len: usize) -> Option<String> {
    (s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_ascii_lowercase())
}

/// A git commit id: 40 hex digits, in lower case.
pub fn commit_id(s: &str) -> Option<String> {
    hex_of_len(s, 40)
}

/// A name as it can be shown in a message: quoted, with control characters escaped (a hostile
/// name must not rewrite the terminal), cut at 200 characters.
pub fn shown(name: &str) -> String {
    let cut: String = name.chars().take(200).collect();
    let more = if cut.len() < name.len() { "..." } else { "" };
    format!("{cut:?}{more}")
}

/// Why a model reference names no model.
#[derive(Debug, thiserror::Error)]
pub enum RefError {
    #[error("{text} is not a Hugging Face repo (owner/name[:QUANT]): {why}")]
    BadRepo { text: String, why: &'static str },
    #[error(
        "{text} is not a quant tag (1 to 64 letters, digits, '_' or '-', as in Q4_K_M or UD-Q4_K_XL)"
    )]
    BadQuant { text: String },
    #[error(
        "{text} is not a file, not `default`, not a model in the library (tpslab models), and not a Hugging Face repo (owner/name[:QUANT]): {why}"
    )]
    Unknown { text: String, why: &'static str },
    #[error("model file {} does not exist", .0.display())]
    NoFile(PathBuf),
    #[error("{repo} has no GGUF model file {wanted}; its GGUF files: {files}")]
    NoGguf {
        repo: String,
        wanted: String,
        files: String,
    },
    #[error("{first} in {repo} is a split GGUF, but its part {part} is not there")]
    MissingPart {
        repo: String,
        first: String,
        part: String,
    },
    #[error(
        "{0} is neither in the library nor in the Hugging Face cache; `tpslab pull` or `-hf` downloads it"
    )]
    NotDownloaded(HubRef),
}

/// A Hugging Face repo and the quant tag that picks its GGUF file (none: [`DEFAULT_QUANTS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    /// `owner/name`, checked by [`check_repo_id`].
    pub repo: String,
    /// As typed (matched without regard to case).
    pub quant: Option<String>,
}

impl std::fmt::Display for HubRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

impl HubRef {
    /// `owner/name[:QUANT]`, optionally behind `hf.co/` or `https://huggingface.co/`. The repo
    /// must have an owner (as llama.cpp's `-hf` asks) and pass [`check_repo_id`]; the tag is 1
    /// to 64 of `A-Z a-z 0-9 _ -`.
    pub fn parse(text: &str) -> Result<Self, RefError> {
        let body = HUB_PREFIXES
            .iter()
            .find_map(|p| strip_prefix_ignore_case(text, p))
            .unwrap_or(text);
        let body = body.strip_suffix('/').unwrap_or(body);
        let (repo, quant) = match body.rsplit_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (body, None),
        };
        let bad = |why| RefError::BadRepo {
            text: shown(text),
            why,
        };
        if !repo.contains('/') {
            return Err(bad("it has no owner ('/')"));
        }
        check_repo_id(repo).map_err(bad)?;
        if let Some(q) = quant {
            let ok = !q.is_empty()
                && q.len() <= MAX_QUANT
                && q.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
            if !ok {
                return Err(RefError::BadQuant { text: shown(q) });
            }
        }
        Ok(Self {
            repo: repo.to_string(),
            quant: quant.map(str::to_string),
        })
    }

    /// Whether `text` is written as a Hub reference whatever else it could be (`hf.co/...`).
    fn is_prefixed(text: &str) -> bool {
        HUB_PREFIXES
            .iter()
            .any(|p| strip_prefix_ignore_case(text, p).is_some())
    }
}

/// Whether `text` is written as a path (absolute, `./`, `~`, a model file's extension), so a
/// missing one is reported as a missing file rather than tried as a repo.
fn looks_like_path(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    text.starts_with(['/', '.', '~', '\\'])
        || text.contains('\\')
        || lower.ends_with(".gguf")
        || lower.ends_with(".safetensors")
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// What a model reference names, before anything is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A file or folder that exists.
    Path(PathBuf),
    /// The built-in default model (fetched on first use).
    Default,
    /// A model in the library, by its name in `tpslab models`.
    Name(String),
    /// A Hugging Face repo: the library, then the Hugging Face cache, then a download.
    Hub(HubRef),
}

impl ModelRef {
    /// Sorts `text` out in the order llama.cpp users expect: a Hub reference written as one
    /// (`hf.co/...`); an existing path; `default`; a model in the library folder `lib` by name; `owner/name[:QUANT]`.
    /// Anything else is refused, saying why it is not a repo id.
    pub fn classify(text: &str, lib: Option<&std::path::Path>) -> Result<Self, RefError> {
        if HubRef::is_prefixed(text) {
            return HubRef::parse(text).map(Self::Hub);
        }
        let path = PathBuf::from(text);
        if !text.is_empty() && occupied(&path) {
            return Ok(Self::Path(path));
        }
        if text == "default" {
            return Ok(Self::Default);
        }
        if is_model_name(text) && lib.is_some_and(|l| occupied(&l.join(text))) {
            return Ok(Self::Name(text.to_string()));
        }
        if looks_like_path(text) {
            return Err(RefError::NoFile(path));
        }
        HubRef::parse(text).map(Self::Hub).map_err(|e| match e {
            RefError::BadRepo { why, .. } => RefError::Unknown {
                text: shown(text),
                why,
            },
            e => e,
        })
    }
}

/// llama.cpp's quant tag of a GGUF file name: the last `-TAG` or `.TAG` of its stem (split
/// numbers left out), in upper case; `None` when the stem ends otherwise.
pub fn quant_tag(file: &str) -> Option<String> {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = match gguf_split::first_part(base) {
        Some((prefix, _)) => prefix,
        None => strip_suffix_ignore_case(base, ".gguf")?,
    };
    let stem = split_prefix(stem).unwrap_or(stem);
    let cut = stem.rfind(['-', '.'])?;
    let tag = &stem[cut + 1..];
    (!tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .then(|| tag.to_ascii_uppercase())
}

fn strip_suffix_ignore_case<'a>(text: &'a str, suffix: &str) -> Option<&'a str> {
    let cut = text.len().checked_sub(suffix.len())?;
    let tail = text.get(cut..)?;
    tail.eq_ignore_ascii_case(suffix).then(|| &text[..cut])
}

/// The `NAME` of any part `NAME-0000K-of-0000N` (a stem, `.gguf` removed).
fn split_prefix(stem: &str) -> Option<&str> {
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(count) && digits(no) && !prefix.is_empty()).then_some(prefix)
}

/// Whether `file` (a path in a repo) is a GGUF model file: a `.gguf` whose name holds none of
/// [`NOT_A_MODEL`], and of a split model only its first part.
pub fn is_model_gguf(file: &str) -> bool {
    let base = file.rsplit('/').next().unwrap_or(file);
    let Some(stem) = strip_suffix_ignore_case(base, ".gguf") else {
        return false;
    };
    let lower = base.to_ascii_lowercase();
    if NOT_A_MODEL.iter().any(|w| lower.contains(w)) {
        return false;
    }
    split_prefix(stem).is_none() || gguf_split::first_part(base).is_some()
}

/// Whether `tag` occurs in `file` followed by `.` or `-`, case aside (llama.cpp's match).
fn tag_matches(file: &str, tag: &str) -> bool {
    let f = file.to_ascii_lowercase();
    let t = tag.to_ascii_lowercase();
    f.match_indices(&t)
        .any(|(i, _)| matches!(f.as_bytes().get(i + t.len()), Some(b'.' | b'-')))
}

/// The files of the model `r` picks among `files` (a repo's paths), as llama.cpp's `-hf`
/// picks: the first GGUF model file (see [`is_model_gguf`]) whose name holds the tag followed
/// by `.` or `-`, case aside; without a tag, [`DEFAULT_QUANTS`] in turn, then the first GGUF
/// model file. A split model's first part comes first, then its other parts, all of which must
/// be among `files`.
pub fn pick_gguf(r: &HubRef, files: &[&str]) -> Result<Vec<String>, RefError> {
    let models: Vec<&str> = files.iter().copied().filter(|f| is_model_gguf(f)).collect();
    let tags: Vec<&str> = match &r.quant {
        Some(q) => vec![q.as_str()],
        None => DEFAULT_QUANTS.to_vec(),
    };
    let found = tags
        .iter()
        .find_map(|t| models.iter().find(|f| tag_matches(f, t)))
        .or_else(|| models.first().filter(|_| r.quant.is_none()));
    let Some(first) = found else {
        let ggufs: Vec<&str> = files
            .iter()
            .copied()
            .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
            .collect();
        return Err(RefError::NoGguf {
            repo: r.repo.clone(),
            wanted: r
                .quant
                .as_ref()
                .map_or("at all".into(), |q| format!("tagged {q}")),
            files: if ggufs.is_empty() {
                "none".into()
            } else {
                ggufs.join(", ")
            },
        });
    };
    let (dir, base) = first.rsplit_once('/').map_or(("", *first), |(d, b)| (d, b));
    let Some(names) = gguf_split::part_names(base) else {
        return Ok(vec![first.to_string()]);
    };
    names
        .into_iter()
        .map(|n| {
            if dir.is_empty() {
                n
            } else {
                format!("{dir}/{n}")
            }
        })
        .map(|full| {
            if files.contains(&full.as_str()) {
                Ok(full)
            } else {
                Err(RefError::MissingPart {
                    repo: r.repo.clone(),
                    first: first.to_string(),
                    part: full,
                })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(repo: &str, quant: Option<&str>) -> HubRef {
        HubRef {
            repo: repo.into(),
            quant: quant.map(Into::into),
        }
    }

    #[test]
    fn repo_ids_and_commits() {
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
        let c = "0123456789abcdef0123456789ABCDEF01234567";
        assert_eq!(commit_id(c).as_deref(), Some(c.to_lowercase().as_str()));
        assert_eq!(commit_id("../../etc"), None);
        assert_eq!(commit_id(&c[..39]), None);
    }

    #[test]
    fn hub_references_parse_as_llama_cpp_writes_them() {
        for (text, repo, quant) in [
            ("bartowski/Qwen-GGUF", "bartowski/Qwen-GGUF", None),
            (
                "bartowski/Qwen-GGUF:Q4_K_M",
                "bartowski/Qwen-GGUF",
                Some("Q4_K_M"),
            ),
            (
                "hf.co/unsloth/Q-GGUF:UD-Q4_K_XL",
                "unsloth/Q-GGUF",
                Some("UD-Q4_K_XL"),
            ),
            ("https://huggingface.co/o/r", "o/r", None),
            ("HF.CO/o/r:q8_0", "o/r", Some("q8_0")),
        ] {
            assert_eq!(HubRef::parse(text).expect(text), hub(repo, quant), "{text}");
        }
        for bad in [
            "norepo",
            "o/r/x",
            "../etc:Q4",
            "o/..:Q4",
            "hf.co/../../etc/passwd",
            "o/r:",
            "o/r:Q4/../x",
            "o/r:a b",
            "o--x/r",
        ] {
            assert!(HubRef::parse(bad).is_err(), "{bad}");
        }
        let e = HubRef::parse("o/r:\u{1b}[2J")
            .expect_err("escape")
            .to_string();
        assert!(e.contains("\\u{1b}"), "{e}");
    }

    #[test]
    fn classify_in_order() {
        let dir = std::env::temp_dir().join(format!("tpslab-ref-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("models")).expect("mkdir");
        std::fs::write(dir.join("models").join("m.gguf"), b"x").expect("write");
        let lib = dir.join("models");
        let c = |t: &str| ModelRef::classify(t, Some(&lib));
        assert_eq!(c("default").expect("default"), ModelRef::Default);
        assert_eq!(c("m.gguf").expect("name"), ModelRef::Name("m.gguf".into()));
        let p = dir.join("models").display().to_string();
        assert_eq!(c(&p).expect("path"), ModelRef::Path(p.clone().into()));
        assert_eq!(
            c("o/r:Q8_0").expect("hub"),
            ModelRef::Hub(hub("o/r", Some("Q8_0")))
        );
        let e = c("nothing-here").expect_err("unknown").to_string();
        assert!(e.contains("not a file, not `default`"), "{e}");
        let e = c("dir/nothing-here.gguf").expect_err("no file").to_string();
        assert!(e.contains("does not exist"), "{e}");
        assert!(c("../x/y").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn picks_the_quant_as_llama_cpp_does() {
        let files = [
            "README.md",
            "mmproj-m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
            "m-q4_k_m.gguf",
            "m-Q4_K_M.imatrix.gguf",
            "big/m-Q6_K-00001-of-00002.gguf",
            "big/m-Q6_K-00002-of-00002.gguf",
            "m-Q2_K-00002-of-00003.gguf",
        ];
        let pick = |q: Option<&str>| pick_gguf(&hub("o/r", q), &files);
        assert_eq!(pick(None).expect("default"), ["m-q4_k_m.gguf"]);
        assert_eq!(pick(Some("q8_0")).expect("q8"), ["m-Q8_0.gguf"]);
        assert_eq!(
            pick(Some("Q6_K")).expect("split"),
            [
                "big/m-Q6_K-00001-of-00002.gguf",
                "big/m-Q6_K-00002-of-00002.gguf"
            ]
        );
        let e = pick(Some("Q5_K_M")).expect_err("absent").to_string();
        assert!(e.contains("no GGUF model file tagged Q5_K_M") && e.contains("m-Q8_0.gguf"));
        // `Q4_K` is not `Q4_K_M`: the tag must end at '.' or '-'.
        assert!(pick(Some("Q4_K")).is_err());
        // A split model whose first part is missing is no model; one missing a later part is
        // named.
        assert!(pick(Some("Q2_K")).is_err());
        let e = pick_gguf(&hub("o/r", Some("Q6_K")), &files[..6]).expect_err("part");
        assert!(e.to_string().contains("m-Q6_K-00002-of-00002.gguf"), "{e}");
        // Without a tag and without Q4_K_M or Q8_0: the first model file.
        assert_eq!(
            pick_gguf(&hub("o/r", None), &["a-F16.gguf", "b-Q5_0.gguf"]).expect("first"),
            ["a-F16.gguf"]
        );
        assert!(pick_gguf(&hub("o/r", None), &["mmproj-F16.gguf"]).is_err());
        assert_eq!(quant_tag("x/m-q4_k_m.gguf").as_deref(), Some("Q4_K_M"));
        assert_eq!(
            quant_tag("m.Q8_0-00001-of-00002.gguf").as_deref(),
            Some("Q8_0")
        );
        assert_eq!(quant_tag("model.gguf"), None);
    }
}
