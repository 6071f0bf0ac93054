//! Shared by the command-line tests: the default model's file and the `tpslab` binary run with
//! arguments.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The default model's file (fetched on first use).
pub fn model() -> PathBuf {
    tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("default model")
}

/// `tpslab ARGS`, run to the end.
pub fn tpslab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(args)
        .output()
        .expect("run tpslab")
}
