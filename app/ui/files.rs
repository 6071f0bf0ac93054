//! File dialogs behind a seam: the app asks a [`FileDialog`] for a path on a worker thread (so the
//! frame never waits on a dialog), [`RfdDialog`] asks the desktop, tests answer with fixed paths.
//! One runner puts every dialog on a worker: [`PendingOpen`] (the answer alone) and
//! [`DialogTask`] (a save or an open with the work on its path).

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

/// The one dialog runner: `work` (which asks `dialogs` and does what the answer calls for) runs
/// on a worker thread named `tpslab-<name>`; its result comes back on the channel, and the
/// frame is woken to poll it.
fn on_worker<R: Send + 'static>(
    name: &str,
    dialogs: &Dialogs,
    ctx: &egui::Context,
    work: impl FnOnce(&dyn FileDialog) -> R + Send + 'static,
) -> Result<Receiver<R>, String> {
    let (tx, rx) = mpsc::channel();
    let (dialogs, ctx) = (Arc::clone(dialogs), ctx.clone());
    std::thread::Builder::new()
        .name(format!("tpslab-{name}"))
        .spawn(move || {
            let _ = tx.send(work(dialogs.as_ref()));
            ctx.request_repaint();
        })
        .map_err(|e| format!("cannot open a file dialog: {e}"))?;
    Ok(rx)
}

/// An open dialog asked on a worker thread, its answer alone (the caller decides what to do
/// with it); the UI polls it each frame.
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
        Ok(Self {
            rx: on_worker("dialog", dialogs, ctx, ask)?,
        })
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

/// How a dialog and the work on its answer ended.
#[derive(Debug)]
pub enum DialogOutcome<T> {
    /// Done; `fallback` says why no dialog was shown when a save used the default path instead.
    Done {
        value: T,
        fallback: Option<String>,
    },
    Cancelled,
    Failed(String),
}

/// A dialog and then the work on the path it gave (writing a save, reading an open), on a
/// worker; the UI polls it each frame.
pub struct DialogTask<T> {
    rx: Receiver<DialogOutcome<T>>,
}

impl<T: Send + 'static> DialogTask<T> {
    /// Asks `dialogs` where to save, then calls `write` with the path (or with `fallback` when
    /// no dialog can be shown); the result arrives through [`Self::poll`].
    pub fn save(
        dialogs: &Dialogs,
        req: DialogRequest,
        fallback: PathBuf,
        ctx: &egui::Context,
        write: impl FnOnce(&Path) -> Result<T, String> + Send + 'static,
    ) -> Result<Self, String> {
        let rx = on_worker("save", dialogs, ctx, move |d| match d.save_path(&req) {
            DialogAnswer::Chosen(p) => done(write(&p), None),
            DialogAnswer::Unavailable(why) => done(write(&fallback), Some(why)),
            DialogAnswer::Cancelled => DialogOutcome::Cancelled,
        })?;
        Ok(Self { rx })
    }

    /// Asks `dialogs` for a file to open, then calls `read` with it; with no dialog to ask,
    /// fails saying so (`what` names the action: "import").
    pub fn open(
        dialogs: &Dialogs,
        req: DialogRequest,
        what: &'static str,
        ctx: &egui::Context,
        read: impl FnOnce(&Path) -> Result<T, String> + Send + 'static,
    ) -> Result<Self, String> {
        let rx = on_worker("open", dialogs, ctx, move |d| match d.open_path(&req) {
            DialogAnswer::Chosen(p) => done(read(&p), None),
            DialogAnswer::Unavailable(why) => {
                DialogOutcome::Failed(format!("no file dialog to {what} with: {why}"))
            }
            DialogAnswer::Cancelled => DialogOutcome::Cancelled,
        })?;
        Ok(Self { rx })
    }

    /// The outcome once the worker is done; `None` while the dialog is open or working.
    pub fn poll(&self) -> Option<DialogOutcome<T>> {
        match self.rx.try_recv() {
            Ok(o) => Some(o),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(DialogOutcome::Failed(
                "the file job stopped unexpectedly".into(),
            )),
        }
    }
}

fn done<T>(r: Result<T, String>, fallback: Option<String>) -> DialogOutcome<T> {
    match r {
        Ok(value) => DialogOutcome::Done { value, fallback },
        Err(e) => DialogOutcome::Failed(e),
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
        let wait = |job: DialogTask<PathBuf>| loop {
            if let Some(o) = job.poll() {
                return o;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let req = DialogRequest::for_path("t", Path::new("default.json"));
        let cancel: Dialogs = Arc::new(FixedDialog(DialogAnswer::Cancelled));
        let job = DialogTask::save(&cancel, req.clone(), "default.json".into(), &ctx, |_| {
            Err("must not write".to_string())
        });
        assert!(matches!(
            wait(job.expect("thread")),
            DialogOutcome::Cancelled
        ));
        let chosen: Dialogs = Arc::new(FixedDialog(DialogAnswer::Chosen("mine.json".into())));
        let job = DialogTask::save(&chosen, req.clone(), "default.json".into(), &ctx, |p| {
            Ok(p.to_path_buf())
        });
        let DialogOutcome::Done { value, fallback } = wait(job.expect("thread")) else {
            panic!("not saved")
        };
        assert_eq!((value, fallback), (PathBuf::from("mine.json"), None));
        let none: Dialogs = Arc::new(FixedDialog(DialogAnswer::Unavailable("no portal".into())));
        let job = DialogTask::save(&none, req, "default.json".into(), &ctx, |p| {
            Ok(p.to_path_buf())
        });
        let DialogOutcome::Done { value, fallback } = wait(job.expect("thread")) else {
            panic!("not saved")
        };
        assert_eq!(value, PathBuf::from("default.json"));
        assert_eq!(fallback.as_deref(), Some("no portal"));
    }
}
