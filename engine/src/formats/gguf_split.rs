//! Split GGUF models (llama.cpp's `gguf-split`): `NAME-00001-of-00003.gguf` and its siblings.
//!
//! The first part holds the metadata and `split.count` / `split.no` / `split.tensors.count`; each
//! part has its own tensor table and data section. Opening the first part opens them all and
//! lists every tensor with the part it lives in ([`TensorSource::GgufPart`]), so the rest of the
//! engine sees one model. Each part is validated like a whole file before anything is read, and
//! the parts must agree on their count, their numbers and the total tensor count.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::formats::gguf::{GgufError, GgufFile, TensorSource};

pub const KEY_COUNT: &str = "split.count";
pub const KEY_NO: &str = "split.no";
pub const KEY_TENSORS: &str = "split.tensors.count";

/// The most parts a split model may have (llama.cpp writes five digits).
const MAX_PARTS: u64 = 99_999;

/// `("NAME", N)` for a split model's first part `NAME-00001-of-0000N.gguf` (a file name, no
/// folder); `None` for any other name.
pub fn first_part(name: &str) -> Option<(&str, u64)> {
    let stem = name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let prefix = head.strip_suffix("-00001")?;
    let n: u64 = count.parse().ok()?;
    (count.len() == 5 && count.bytes().all(|b| b.is_ascii_digit()) && !prefix.is_empty() && n >= 1)
        .then_some((prefix, n))
}

/// The file names of every part of the split model whose first part is `first_name`.
pub fn part_names(first_name: &str) -> Option<Vec<String>> {
    let (prefix, n) = first_part(first_name)?;
    Some((1..=n).map(|i| part_name(prefix, i, n)).collect())
}

/// llama.cpp's name for part `no` (1-based) of `count`.
fn part_name(prefix: &str, no: u64, count: u64) -> String {
    format!("{prefix}-{no:05}-of-{count:05}.gguf")
}

/// The file name of part `no` (1-based) of `count` next to `first`
/// (`model-00001-of-00003.gguf` -> `model-0000{no}-of-00003.gguf`), as llama.cpp names them.
pub fn part_path(first: &Path, no: u64, count: u64) -> Option<PathBuf> {
    let (prefix, n) = first_part(first.file_name()?.to_str()?)?;
    (n == count).then(|| first.with_file_name(part_name(prefix, no, count)))
}

fn split_key(f: &GgufFile, key: &str) -> Result<Option<u64>, GgufError> {
    f.get(key)
        .map(|v| {
            v.as_u64().ok_or_else(|| GgufError::WrongType {
                key: key.into(),
                expected: "unsigned integer",
            })
        })
        .transpose()
}

fn corrupt(path: &Path, what: String) -> GgufError {
    GgufError::Corrupt {
        path: path.to_path_buf(),
        what,
    }
}

/// `first` as one model: unchanged when it is not split, else with every part's tensors.
pub(crate) fn join(mut first: GgufFile) -> Result<GgufFile, GgufError> {
    let Some(count) = split_key(&first, KEY_COUNT)? else {
        return Ok(first);
    };
    let no = split_key(&first, KEY_NO)?.unwrap_or(0);
    if count == 0 || count > MAX_PARTS || no >= count {
        return Err(corrupt(
            &first.path,
            format!("split.no {no} of split.count {count} is not a valid part"),
        ));
    }
    if no != 0 {
        let first_name = part_path_any(&first.path, no, count)
            .map_or_else(|| "the first part".into(), |p| p.display().to_string());
        return Err(corrupt(
            &first.path,
            format!(
                "this is part {} of {count} of a split model; open {first_name}",
                no + 1
            ),
        ));
    }
    if count == 1 {
        return Ok(first);
    }
    let total = split_key(&first, KEY_TENSORS)?;
    let mut names: std::collections::HashSet<String> =
        first.tensors.iter().map(|t| t.name.clone()).collect();
    for i in 1..count {
        let path = part_path(&first.path, i + 1, count).ok_or_else(|| {
            corrupt(
                &first.path,
                format!(
                    "a split model ({count} parts) whose name does not end in \
                     -00001-of-{count:05}.gguf, so its other parts cannot be found"
                ),
            )
        })?;
        let part = GgufFile::open_single(&path)?;
        let (pc, pn) = (split_key(&part, KEY_COUNT)?, split_key(&part, KEY_NO)?);
        if pc != Some(count) || pn != Some(i) {
            return Err(corrupt(
                &path,
                format!(
                    "expected part {} of {count} (split.no {i}), found split.count {pc:?}, \
                     split.no {pn:?}",
                    i + 1
                ),
            ));
        }
        let source = TensorSource::GgufPart {
            path: Arc::from(path.as_path()),
            data_offset: part.data_offset,
        };
        for mut t in part.tensors {
            if !names.insert(t.name.clone()) {
                return Err(corrupt(
                    &path,
                    format!("tensor '{}' is also in an earlier part", t.name),
                ));
            }
            t.source = source.clone();
            first.tensors.push(t);
        }
        first.file_len = first.file_len.saturating_add(part.file_len);
    }
    if let Some(total) = total.filter(|&n| n != first.tensors.len() as u64) {
        return Err(corrupt(
            &first.path,
            format!(
                "split.tensors.count is {total} but the {count} parts hold {} tensors",
                first.tensors.len()
            ),
        ));
    }
    Ok(first)
}

/// The first part's path from any part's (`no` is 0-based).
fn part_path_any(path: &Path, no: u64, count: u64) -> Option<PathBuf> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".gguf")?;
    let prefix = stem.strip_suffix(&format!("-{:05}-of-{count:05}", no + 1))?;
    Some(path.with_file_name(part_name(prefix, 1, count)))
}

/// Every file of the model at `path`: the parts of a split model, or the file itself.
pub fn model_files(f: &GgufFile) -> Vec<PathBuf> {
    let mut files = vec![f.path.clone()];
    for t in &f.tensors {
        if let TensorSource::GgufPart { path, .. } = &t.source
            && files.last().is_none_or(|p| p.as_path() != &**path)
        {
            files.push(path.to_path_buf());
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_follow_llama_cpp() {
        let first = Path::new("/m/qwen-00001-of-00003.gguf");
        assert_eq!(
            part_path(first, 3, 3),
            Some(PathBuf::from("/m/qwen-00003-of-00003.gguf"))
        );
        assert_eq!(part_path(Path::new("/m/qwen.gguf"), 2, 3), None);
        assert_eq!(first_part("qwen-00001-of-00003.gguf"), Some(("qwen", 3)));
        assert_eq!(first_part("qwen-00002-of-00003.gguf"), None);
        assert_eq!(first_part("-00001-of-00003.gguf"), None);
        assert_eq!(first_part("qwen-00001-of-3.gguf"), None);
        assert_eq!(
            part_names("a-00001-of-00002.gguf"),
            Some(vec![
                "a-00001-of-00002.gguf".into(),
                "a-00002-of-00002.gguf".into()
            ])
        );
        assert_eq!(
            part_path_any(Path::new("/m/q-00002-of-00003.gguf"), 1, 3),
            Some(PathBuf::from("/m/q-00001-of-00003.gguf"))
        );
    }
}
