//! `tpslab export` end to end: the default model written as a BF16 Hugging Face folder, which
//! `generate --model DIR` and `quantize DIR` then take like a GGUF; bad targets refused in one line.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::cli_bin;
use crate::temp_dir;
use cli_bin::tpslab;
use temp_dir::TempDir;

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tpslab failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err(out: &Output) -> String {
    assert!(!out.status.success(), "tpslab should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

#[test]
fn export_then_generate_and_quantize_from_the_folder() {
    let tmp = TempDir::new("export");
    let dir = tmp.0.join("smollm2-bf16");
    let out = ok(&tpslab(&[
        "export",
        "default",
        s(&dir),
        "--dtype",
        "bf16",
        "--threads",
        "2",
    ]));
    assert!(out.contains("272 tensors") && out.contains("BF16"), "{out}");
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    ] {
        assert!(dir.join(f).is_file(), "{f} written");
    }
    assert!(!dir.join("model.safetensors.tmp").exists());
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("read"))
            .expect("json");
    assert_eq!(config["torch_dtype"], "bfloat16");
    assert_eq!(config["num_key_value_heads"], 3);

    let generated: Value = serde_json::from_str(&ok(&tpslab(&[
        "generate",
        "--model",
        s(&dir),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "6",
        "--threads",
        "2",
        "--json",
    ])))
    .expect("one JSON object");
    // The folder's tokenizer gives llama.cpp's ids for the prompt (refs/llamacpp_greedy.json).
    assert_eq!(
        generated["prompt_token_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    assert_eq!(
        generated["output_token_ids"].as_array().expect("ids").len(),
        6
    );

    let q8 = tmp.0.join("q8_0.gguf");
    ok(&tpslab(&[
        "quantize",
        s(&dir),
        s(&q8),
        "--type",
        "q8_0",
        "--threads",
        "2",
    ]));
    assert!(q8.is_file());
    // An unknown preset is refused before anything is read, listing the known ones.
    let e = err(&tpslab(&[
        "quantize",
        s(&dir),
        s(&tmp.0.join("x.gguf")),
        "--type",
        "q4_k_xl",
    ]));
    assert!(
        e.contains("unknown quantization type 'q4_k_xl'") && e.contains("q4_k_m, q4_k_s"),
        "{e}"
    );
    assert!(!tmp.0.join("x.gguf").exists());

    // A non-empty target and a quantized dtype are refused, naming the reason.
    let e = err(&tpslab(&["export", "default", s(&dir)]));
    assert!(e.contains("not an empty folder"), "{e}");
    let e = err(&tpslab(&[
        "export",
        "default",
        s(&tmp.0.join("x")),
        "--dtype",
        "q4_k",
    ]));
    assert!(e.contains("F32, F16 and BF16"), "{e}");
    let empty = tmp.0.join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let e = err(&tpslab(&[
        "generate",
        "--model",
        s(&empty),
        "--prompt",
        "hi",
    ]));
    assert!(e.contains("has no config.json"), "{e}");
}
