//! The memory and time of tokenizing one long text: peak resident memory above what the process
//! held with the tokenizer and the text loaded, per byte of text, for prose (spaces between words) and for text with no
//! ASCII space (CJK), with a model file's tokenizer (a vocabulary GGUF is enough):
//!
//!   cargo run --release -p tpslab-engine --example tokenize_memory -- MODEL.gguf [MIB]
//!
//! Each text runs in a child process of its own, so one's peak does not hide the other's.

use std::time::Instant;

use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::text::tokenizer::Tokenizer;

/// A line of `/proc/self/status` in bytes: `VmHWM` (peak resident set) or `VmRSS` (now).
fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn text_of(kind: &str, bytes: usize) -> String {
    let unit = match kind {
        "prose" => "The quick brown fox, 1234 times, jumped over the lazy dog's fence.\n",
        _ => "我们在本地运行大型语言模型并测量它们的速度。",
    };
    unit.repeat(bytes / unit.len() + 1)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, mib) = match args.as_slice() {
        [m] => (m.clone(), 4usize),
        [m, n, ..] => (m.clone(), n.parse()?),
        _ => return Err("usage: tokenize_memory MODEL.gguf [MIB] [prose|cjk]".into()),
    };
    let Some(kind) = args.get(2) else {
        for kind in ["prose", "cjk"] {
            let out = std::process::Command::new(std::env::current_exe()?)
                .args([&model, &mib.to_string(), kind])
                .output()?;
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        return Ok(());
    };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model)?)?;
    let text = text_of(kind, mib << 20);
    let before = status_bytes("VmRSS:");
    let t = Instant::now();
    let ids = tok.encode(&text, false)?;
    let secs = t.elapsed().as_secs_f64();
    let extra = status_bytes("VmHWM:").saturating_sub(before);
    println!(
        "{kind}: {:.1} MiB, {} tokens, {:.2} s, peak +{:.0} MiB = {:.1} bytes per byte of text",
        text.len() as f64 / 1048576.0,
        ids.len(),
        secs,
        extra as f64 / 1048576.0,
        extra as f64 / text.len() as f64
    );
    Ok(())
}
