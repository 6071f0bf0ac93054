//! A temporary folder for one test, removed when the test ends (passed or not).

use std::path::PathBuf;

pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `$TMP/tpslab-{tag}-{pid}`, empty.
    pub fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("tpslab-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        Self(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
