//! Writes a GGUF as the parts of a split set the way llama.cpp's `gguf-split` lays them out
//! (all metadata in part 1, the tensors shared out in order), with each part's split keys given.

use std::path::{Path, PathBuf};

use tpslab_engine::gguf::{GgufFile, Value};
use tpslab_engine::gguf_split::part_path;
use tpslab_engine::gguf_write::{TensorDesc, write_gguf};

/// Writes `src` as `parts` files `{stem}-0000i-of-0000N.gguf` in `dir`, part `i` carrying the
/// metadata `split_keys(i)` adds; returns the first part's path.
pub fn write_split(
    src: &GgufFile,
    dir: &Path,
    stem: &str,
    parts: usize,
    split_keys: impl Fn(usize) -> Vec<(String, Value)>,
) -> PathBuf {
    let first = dir.join(format!("{stem}-00001-of-{parts:05}.gguf"));
    let n = src.tensors.len();
    for i in 0..parts {
        let mut metadata: Vec<(String, Value)> = if i == 0 {
            src.metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        } else {
            Vec::new()
        };
        metadata.extend(split_keys(i));
        let tensors: Vec<(TensorDesc, Vec<u8>)> = src.tensors[i * n / parts..(i + 1) * n / parts]
            .iter()
            .map(|t| {
                (
                    TensorDesc::new(t.name.clone(), t.dims.clone(), t.ty),
                    src.read_tensor(t).expect("read"),
                )
            })
            .collect();
        let path = part_path(&first, i as u64 + 1, parts as u64).expect("part name");
        let f = std::fs::File::create(&path).expect("create");
        write_gguf(std::io::BufWriter::new(f), &metadata, &tensors).expect("write");
    }
    first
}
