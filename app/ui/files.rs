//! File dialogs behind a seam: the app asks a [`FileDialog`] for a path on a worker thread (so the
//! frame never waits on a dialog), [`RfdDialog`] asks the desktop, tests answer with fixed paths.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// What to ask the user for.
#[derive(Debug, Clone)]
pub struct DialogRequest {
    pub title: String,
    /// The folder the dialog opens in.
    pub directory: PathBuf,
    /// The proposed file name (saving only).
    pub file_name: String,
    /// (name, extensions) pairs, e.g. ("JSON", ["json"]).
    pub filters: Vec<(String, Vec<String>)>,
}

impl DialogRequest {
    /// A request that proposes `default` (its folder and name).
    pub fn for_path(title: &str, default: &Path) -> Self {
        Self {
            title: title.to_owned(),
            directory: default
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            file_name: default
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            filters: Vec::new(),
        }
    }
}

/// The dialog's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialogAnswer {
    Chosen(PathBuf),
    Cancelled,
    /// No dialog could be shown (no display, no portal); the reason, for the notice.
    Unavailable(String),
}

/// Asks the user for paths. Calls block until answered: the app makes them on a worker thread.
pub trait FileDialog: Send + Sync {
    fn save_path(&self, req: &DialogRequest) -> DialogAnswer;
    fn open_path(&self, req: &DialogRequest) -> DialogAnswer;
    /// A folder (a safetensors model); dialogs that cannot pick folders say so.
    fn open_folder(&self, req: &DialogRequest) -> DialogAnswer {
        let _ = req;
        DialogAnswer::Unavailable("this dialog cannot pick folders".into())
    }
}

/// The desktop's dialog through rfd (its default xdg-portal backend on Linux).
#[derive(Debug, Default, Clone, Copy)]
pub struct RfdDialog;

/// rfd answers `None` both for "cancelled" and for "no portal"; a person takes longer than this to
/// cancel, a missing portal answers in tens of milliseconds.
const TOO_FAST_TO_BE_A_PERSON: Duration = Duration::from_millis(300);

impl RfdDialog {
    fn dialog(req: &DialogRequest) -> rfd::FileDialog {
        let mut d = rfd::FileDialog::new()
            .set_title(&req.title)
            .set_directory(&req.directory);
        if !req.file_name.is_empty() {
            d = d.set_file_name(&req.file_name);
        }
        for (name, exts) in &req.filters {
            d = d.add_filter(name, exts);
        }
        d
    }

    fn ask(pick: impl FnOnce() -> Option<PathBuf>) -> DialogAnswer {
        if !has_display() {
            return DialogAnswer::Unavailable("no display to show a file dialog on".into());
        }
        let t = Instant::now();
        match pick() {
            Some(p) => DialogAnswer::Chosen(p),
            None if t.elapsed() < TOO_FAST_TO_BE_A_PERSON => DialogAnswer::Unavailable(
                "the desktop offers no file dialog (no xdg-desktop-portal)".into(),
            ),
            None => DialogAnswer::Cancelled,
        }
    }
}

impl FileDialog for RfdDialog {
    fn save_path(&self, req: &DialogRequest) -> DialogAnswer {
        Self::ask(|| Self::dialog(req).save_file())
    }

    fn open_path(&self, req: &DialogRequest) -> DialogAnswer {
        Self::ask(|| Self::dialog(req).pick_file())
    }

    fn open_folder(&self, req: &DialogRequest) -> DialogAnswer {
        Self::ask(|| Self::dialog(req).pick_folder())
    }
}

fn has_display() -> bool {
    if cfg!(any(target_os = "windows", target_os = "macos")) {
        return true;
    }
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// A dialog that always gives the same answer (tests, scripted runs).
#[derive(Debug, Clone)]
pub struct FixedDialog(pub DialogAnswer);

impl FileDialog for FixedDialog {
    fn save_path(&self, _: &DialogRequest) -> DialogAnswer {
        self.0.clone()
    }

    fn open_path(&self, _: &DialogRequest) -> DialogAnswer {
        self.0.clone()
    }

    fn open_folder(&self, _: &DialogRequest) -> DialogAnswer {
        self.0.clone()
    }
}

/// Shared handle the app keeps and hands to workers.
pub type Dialogs = Arc<dyn FileDialog>;

/// An open dialog asked on a worker thread; the UI polls it each frame.
pub struct PendingOpen {
    rx: Receiver<DialogAnswer>,
}

impl PendingOpen {
    /// Asks `dialogs` on a worker thread (`ask` puts the question: a file or a folder); the
    /// answer arrives through [`Self::poll`] and wakes the frame.
    pub fn start(
        dialogs: &Dialogs,
        ctx: &egui::Context,
        ask: impl FnOnce(&dyn FileDialog) -> DialogAnswer + Send + 'static,
    ) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel();
        let (dialogs, ctx) = (Arc::clone(dialogs), ctx.clone());
        std::thread::Builder::new()
            .name("tpslab-dialog".into())
            .spawn(move || {
                let _ = tx.send(ask(dialogs.as_ref()));
                ctx.request_repaint();
            })
            .map_err(|e| format!("cannot open a file dialog: {e}"))?;
        Ok(Self { rx })
    }

    /// The answer once given; `None` while the dialog is open. A worker that ended without
    /// one counts as cancelled.
    pub fn poll(&self) -> Option<DialogAnswer> {
        match self.rx.try_recv() {
            Ok(a) => Some(a),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(DialogAnswer::Cancelled),
        }
    }
}

/// How a save that went through a dialog ended.
#[derive(Debug)]
pub enum SaveOutcome<T> {
    /// Written; `fallback` says why no dialog was shown when the default path was used instead.
    Saved {
        value: T,
        fallback: Option<String>,
    },
    Cancelled,
    Failed(String),
}

/// A dialog-then-write running on a worker; the UI polls it each frame.
pub struct PendingSave<T> {
    rx: Receiver<SaveOutcome<T>>,
}

impl<T: Send + 'static> PendingSave<T> {
    /// Asks `dialogs` for a path on a worker thread, then calls `write` with it (or with
    /// `fallback` when no dialog can be shown); the result arrives through [`Self::poll`].
    pub fn start(
        dialogs: &Dialogs,
        req: DialogRequest,
        fallback: PathBuf,
        ctx: &egui::Context,
        write: impl FnOnce(&Path) -> Result<T, String> + Send + 'static,
    ) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel();
        let (dialogs, ctx) = (Arc::clone(dialogs), ctx.clone());
        std::thread::Builder::new()
            .name("tpslab-save".into())
            .spawn(move || {
                let outcome = match dialogs.save_path(&req) {
                    DialogAnswer::Chosen(p) => write(&p).map(|value| (value, None)),
                    DialogAnswer::Unavailable(why) => write(&fallback).map(|v| (v, Some(why))),
                    DialogAnswer::Cancelled => {
                        let _ = tx.send(SaveOutcome::Cancelled);
                        ctx.request_repaint();
                        return;
                    }
                };
                let _ = tx.send(match outcome {
                    Ok((value, fallback)) => SaveOutcome::Saved { value, fallback },
                    Err(e) => SaveOutcome::Failed(e),
                });
                ctx.request_repaint();
            })
            .map_err(|e| format!("cannot start the save thread: {e}"))?;
        Ok(Self { rx })
    }

    /// The outcome once the worker is done; `None` while the dialog is open or writing.
    pub fn poll(&self) -> Option<SaveOutcome<T>> {
        match self.rx.try_recv() {
            Ok(o) => Some(o),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                Some(SaveOutcome::Failed("the save stopped unexpectedly".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_display_rfd_says_unavailable_without_trying() {
        // Only the no-display branch: a test must never open a real dialog.
        if has_display() {
            return;
        }
        let req = DialogRequest::for_path("t", Path::new("/tmp/x/sweep.json"));
        assert_eq!(req.directory, Path::new("/tmp/x"));
        assert_eq!(req.file_name, "sweep.json");
        assert!(matches!(
            RfdDialog.save_path(&req),
            DialogAnswer::Unavailable(_)
        ));
    }

    #[test]
    fn a_cancelled_save_writes_nothing_and_a_chosen_one_writes_there() {
        let ctx = egui::Context::default();
        let wait = |job: PendingSave<PathBuf>| loop {
            if let Some(o) = job.poll() {
                return o;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let req = DialogRequest::for_path("t", Path::new("default.json"));
        let cancel: Dialogs = Arc::new(FixedDialog(DialogAnswer::Cancelled));
        let job = PendingSave::start(&cancel, req.clone(), "default.json".into(), &ctx, |_| {
            Err("must not write".to_string())
        });
        assert!(matches!(wait(job.expect("thread")), SaveOutcome::Cancelled));
        let chosen: Dialogs = Arc::new(FixedDialog(DialogAnswer::Chosen("mine.json".into())));
        let job = PendingSave::start(&chosen, req.clone(), "default.json".into(), &ctx, |p| {
            Ok(p.to_path_buf())
        });
        let SaveOutcome::Saved { value, fallback } = wait(job.expect("thread")) else {
            panic!("not saved")
        };
        assert_eq!((value, fallback), (PathBuf::from("mine.json"), None));
        let none: Dialogs = Arc::new(FixedDialog(DialogAnswer::Unavailable("no portal".into())));
        let job = PendingSave::start(&none, req, "default.json".into(), &ctx, |p| {
            Ok(p.to_path_buf())
        });
        let SaveOutcome::Saved { value, fallback } = wait(job.expect("thread")) else {
            panic!("not saved")
        };
        assert_eq!(value, PathBuf::from("default.json"));
        assert_eq!(fallback.as_deref(), Some("no portal"));
    }
}
