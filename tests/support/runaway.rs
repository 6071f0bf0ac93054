//! The default model with another chat template (and name), for the tests that hold a runaway
//! template against the CLI, the server and the window.
#![allow(dead_code)] // each test binary uses the templates it needs

use std::path::{Path, PathBuf};

use tpslab_engine::formats::gguf::Value;

/// The templates of engine/tests/data/runaway/ that never end on their own.
pub const NESTED_LOOPS: &str = include_str!("../../engine/tests/data/runaway/nested_loops.jinja");
pub const STRING_DOUBLING: &str =
    include_str!("../../engine/tests/data/runaway/string_doubling.jinja");

/// Writes `dir/runaway.gguf`: the default model whose chat template is `template` and whose
/// `general.name` is `name`.
pub fn model_with_template(dir: &Path, template: &str, name: &str) -> PathBuf {
    let default = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("default model");
    let path = dir.join("runaway.gguf");
    tpslab_engine::formats::gguf_write::copy_with_metadata(
        &default,
        &path,
        &[
            (
                "tokenizer.chat_template".into(),
                Value::String(template.into()),
            ),
            ("general.name".into(), Value::String(name.into())),
        ],
    )
    .expect("copy the default model with another template");
    path
}
