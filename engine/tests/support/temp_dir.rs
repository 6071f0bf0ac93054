//! A temporary folder for one test, removed when the test ends (passed or not): the one
//! `TempDir` of every test binary in the workspace (the app's tests include this file too).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct TempDir(pub PathBuf);

/// Tests run in parallel threads: each folder gets its own number.
static NEXT: AtomicUsize = AtomicUsize::new(0);

impl TempDir {
    /// `$TMP/tpslab-{tag}-{pid}-{n}`, empty.
    pub fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("tpslab-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        Self(d)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
