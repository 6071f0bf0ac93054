//! The committed PTX (kernels/ptx/, embedded in the binary) is what the CUDA sources
//! (kernels/cuda/*.cu) compile to with nvcc 13.0. Ignored by default (most machines have no nvcc
//! 13.0): `kernels/cuda/build-ptx.sh --fetch` installs it from PyPI wheels, then
//! `cargo test -p tpslab-kernels --test ptx -- --ignored` runs it, and fails where nvcc is missing.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs nvcc 13.0: kernels/cuda/build-ptx.sh --fetch installs it"]
fn committed_ptx_matches_the_cuda_sources() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/build-ptx.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit status 3: no nvcc 13.0 here.
    assert_ne!(
        out.status.code(),
        Some(3),
        "this test needs nvcc 13.0: {}",
        text.trim()
    );
    assert!(
        out.status.success() && text.contains("committed PTX matches"),
        "kernels/ptx/ is stale: run kernels/cuda/build-ptx.sh and commit the result\n{text}"
    );
}
