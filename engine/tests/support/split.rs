//! Writes a GGUF as the parts of a split set the way llama.cpp's `gguf-split` lays them out
//! (all metadata in part 1, the tensors shared out in order), with each part's split keys given.
//! Used by the engine's tests and, through `#[path]`, by the app's Hub tests.

use std::path::{Path, PathBuf};

use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::gguf_split::part_path;
use tpslab_engine::formats::gguf_write::{TensorDesc, write_gguf};

/// `src` as `parts` split parts in memory, `(file name, bytes)`: `{stem}-0000i-of-0000N.gguf`,
/// part `i` carrying the metadata `split_keys(i)` adds.
pub fn split_parts(
    src: &GgufFile,
    stem: &str,
    parts: usize,
    split_keys: impl Fn(usize) -> Vec<(String, Value)>,
) -> Vec<(String, Vec<u8>)> {
    let first = PathBuf::from(format!("{stem}-00001-of-{parts:05}.gguf"));
    let n = src.tensors.len();
    (0..parts)
        .map(|i| {
            let mut metadata: Vec<(String, Value)> = if i == 0 {
                src.metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            } else {
                Vec::new()
            };
            metadata.extend(split_keys(i));
            let tensors: Vec<(TensorDesc, Vec<u8>)> = src.tensors
                [i * n / parts..(i + 1) * n / parts]
                .iter()
                .map(|t| {
                    let desc = TensorDesc::new(t.name.clone(), t.dims.clone(), t.ty);
                    (desc, src.read_tensor(t).expect("read"))
                })
                .collect();
            let name = part_path(&first, i as u64 + 1, parts as u64).expect("part name");
            let bytes = write_gguf(Vec::new(), &metadata, &tensors).expect("write");
            (name.to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

/// [`split_parts`] written into `dir`; returns the first part's path.
#[allow(dead_code)] // not every test binary that includes this writes files
pub fn write_split(
    src: &GgufFile,
    dir: &Path,
    stem: &str,
    parts: usize,
    split_keys: impl Fn(usize) -> Vec<(String, Value)>,
) -> PathBuf {
    let files = split_parts(src, stem, parts, split_keys);
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).expect("write part");
    }
    dir.join(&files[0].0)
}
