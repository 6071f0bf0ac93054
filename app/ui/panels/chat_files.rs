//! A conversation saved to a file and read back: JSON in the store's own format (the
//! conversation as the window saves it, under the format's name and [`CHAT_SCHEMA`]; importable)
//! or Markdown (to read). An import is hostile input: its size is bounded, its format, version
//! and branches are checked, and a bad file is a clear error that changes nothing. The file
//! dialogs run on a worker ([`FileJob`]); the frame polls its outcome.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::chat_store::{CHAT_SCHEMA, Conversation, Role, answer_stats_text};
use crate::ui::files::{DialogOutcome, DialogRequest, DialogTask, Dialogs};

/// The `format` of a JSON export.
pub const FORMAT: &str = "tpslab-chat";

/// The largest file an import reads.
pub const MAX_IMPORT_BYTES: u64 = 32 << 20;

#[derive(Serialize)]
struct ExportOut<'a> {
    format: &'static str,
    version: u32,
    conversation: &'a Conversation,
}

/// What is read first: is it an export of ours, of a version we know?
#[derive(Deserialize)]
struct Head {
    format: Option<String>,
    version: Option<u32>,
}

#[derive(Deserialize)]
struct ExportIn {
    conversation: Conversation,
}

/// `conv` as a JSON export.
pub fn to_json(conv: &Conversation) -> Result<Vec<u8>, String> {
    let out = ExportOut {
        format: FORMAT,
        version: CHAT_SCHEMA,
        conversation: conv,
    };
    serde_json::to_vec_pretty(&out).map_err(|e| e.to_string())
}

/// The conversation of a JSON export, checked; its id is the importer's to give.
pub fn from_json(bytes: &[u8]) -> Result<Conversation, String> {
    let head: Head =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON chat export: {e}"))?;
    if head.format.as_deref() != Some(FORMAT) {
        return Err(format!(
            "not a TPS Lab chat export (its \"format\" is not \"{FORMAT}\")"
        ));
    }
    match head.version {
        Some(v) if (1..=CHAT_SCHEMA).contains(&v) => {}
        Some(v) => {
            return Err(format!(
                "made by a newer TPS Lab (chat format {v}; this one reads up to {CHAT_SCHEMA})"
            ));
        }
        None => return Err("the export has no \"version\"".into()),
    }
    let conv = serde_json::from_slice::<ExportIn>(bytes)
        .map_err(|e| format!("the conversation in the export is not valid: {e}"))?
        .conversation;
    check(&conv)?;
    Ok(conv)
}

/// What an imported conversation must keep to beyond its types.
fn check(conv: &Conversation) -> Result<(), String> {
    conv.sampling
        .validate()
        .map_err(|e| format!("its sampling settings: {e}"))?;
    for (i, m) in conv.messages.iter().enumerate() {
        let n = i + 1;
        if m.role == Role::User && !m.others.is_empty() {
            return Err(format!("message {n} is the user's and has branches"));
        }
        if m.shown > m.others.len() {
            return Err(format!(
                "message {n} shows answer {} of {}",
                m.shown + 1,
                m.branches()
            ));
        }
        if m.others.iter().any(|b| b.role != Role::Assistant) {
            return Err(format!("a branch of message {n} is not an answer"));
        }
        if m.others.iter().any(|b| !b.others.is_empty()) {
            return Err(format!("a branch of message {n} has branches of its own"));
        }
    }
    Ok(())
}

/// `conv` to read: its title, system prompt, and each message under who wrote it (the answers
/// shown, their thinking folded, their figures under them).
pub fn to_markdown(conv: &Conversation) -> String {
    let mut md = format!("# {}\n\n", conv.title.trim());
    if !conv.system.trim().is_empty() {
        md.push_str("**System prompt**\n\n");
        for line in conv.system.trim().lines() {
            md.push_str(&format!("> {line}\n"));
        }
        md.push('\n');
    }
    for m in &conv.messages {
        match m.role {
            Role::User => md.push_str("## You\n\n"),
            Role::Assistant if m.branches() > 1 => md.push_str(&format!(
                "## Assistant (answer {} of {})\n\n",
                m.shown + 1,
                m.branches()
            )),
            Role::Assistant => md.push_str("## Assistant\n\n"),
        }
        if !m.reasoning.is_empty() {
            md.push_str("<details><summary>Thinking</summary>\n\n");
            md.push_str(m.reasoning.trim());
            md.push_str("\n\n</details>\n\n");
        }
        md.push_str(m.text.trim());
        md.push_str("\n\n");
        if let Some(s) = &m.stats {
            md.push_str(&format!("*{}*\n\n", answer_stats_text(s)));
        }
    }
    md
}

/// Writes `conv` to `path` as JSON or Markdown, whole or not at all.
pub fn export(conv: &Conversation, path: &Path, markdown: bool) -> Result<(), String> {
    let bytes = if markdown {
        to_markdown(conv).into_bytes()
    } else {
        to_json(conv)?
    };
    tpslab_engine::library::write_whole(path, &bytes)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The conversation exported to `path`, read and checked (at most [`MAX_IMPORT_BYTES`]).
pub fn import(path: &Path) -> Result<Conversation, String> {
    let why = |e: &dyn std::fmt::Display| format!("cannot import {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| why(&e))?;
    let mut bytes = Vec::new();
    file.take(MAX_IMPORT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| why(&e))?;
    if bytes.len() as u64 > MAX_IMPORT_BYTES {
        return Err(why(&format!(
            "the file is over {} MiB",
            MAX_IMPORT_BYTES >> 20
        )));
    }
    from_json(&bytes).map_err(|e| why(&e))
}

/// Where an export goes when no dialog can be shown: `chats/` in the TPS Lab home folder.
fn default_path(conv: &Conversation, markdown: bool) -> PathBuf {
    let stem: String = (conv.title.chars())
        .map(|c| if c.is_alphanumeric() { c } else { '-' })
        .take(48)
        .collect();
    let ext = if markdown { "md" } else { "json" };
    let home = tpslab_engine::library::home_dir().unwrap_or_else(|_| PathBuf::from("."));
    home.join("chats").join(format!("{stem}-{}.{ext}", conv.id))
}

/// How a file dialog and its work ended.
#[derive(Debug)]
pub enum FileOutcome {
    Exported {
        path: PathBuf,
        /// Why no dialog was shown (the default path was used).
        fallback: Option<String>,
    },
    Imported(Box<Conversation>, PathBuf),
    Cancelled,
    Failed(String),
}

/// An export or an import in flight: its dialog, then the writing or reading, on a worker
/// (`ui::files`' one runner).
pub enum FileJob {
    Export(DialogTask<PathBuf>),
    Import(DialogTask<(Box<Conversation>, PathBuf)>),
}

impl FileJob {
    /// Asks where to save `conv` and writes it there.
    pub fn export(
        dialogs: &Dialogs,
        ctx: &egui::Context,
        conv: &Conversation,
        markdown: bool,
    ) -> Result<Self, String> {
        let default = default_path(conv, markdown);
        let mut req = DialogRequest::for_path("Export the conversation", &default);
        req.filters = vec![if markdown {
            ("Markdown".into(), vec!["md".into()])
        } else {
            ("JSON".into(), vec!["json".into()])
        }];
        let conv = conv.clone();
        let job = DialogTask::save(dialogs, req, default, ctx, move |path| {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
            export(&conv, path, markdown).map(|()| path.to_path_buf())
        })?;
        Ok(Self::Export(job))
    }

    /// Asks for a JSON export and reads it.
    pub fn import(dialogs: &Dialogs, ctx: &egui::Context) -> Result<Self, String> {
        let home = tpslab_engine::library::home_dir().unwrap_or_else(|_| PathBuf::from("."));
        let mut req = DialogRequest::for_path(
            "Import a conversation",
            &home.join("chats").join("chat.json"),
        );
        req.file_name.clear();
        req.filters = vec![("JSON".into(), vec!["json".into()])];
        let job = DialogTask::open(dialogs, req, "import", ctx, |p| {
            import(p).map(|conv| (Box::new(conv), p.to_path_buf()))
        })?;
        Ok(Self::Import(job))
    }

    /// The outcome once the worker is done; `None` while it runs.
    pub fn poll(&self) -> Option<FileOutcome> {
        fn ended<T>(
            o: DialogOutcome<T>,
            done: impl FnOnce(T, Option<String>) -> FileOutcome,
        ) -> FileOutcome {
            match o {
                DialogOutcome::Done { value, fallback } => done(value, fallback),
                DialogOutcome::Cancelled => FileOutcome::Cancelled,
                DialogOutcome::Failed(e) => FileOutcome::Failed(e),
            }
        }
        match self {
            Self::Export(job) => job
                .poll()
                .map(|o| ended(o, |path, fallback| FileOutcome::Exported { path, fallback })),
            Self::Import(job) => job
                .poll()
                .map(|o| ended(o, |(conv, path), _| FileOutcome::Imported(conv, path))),
        }
    }
}
