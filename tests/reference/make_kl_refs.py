#!/usr/bin/env python3
"""Records llama.cpp's KL-divergence statistics of the default model (Q4_1) against its Q4_0
re-quantization by this engine, for tests/commands/perplexity_kl.rs (which needs neither llama.cpp nor
Python).

  1. `tpslab quantize default OUT --type q4_0` (the engine's own re-quantization; its sha256 is
     recorded so the test knows it compares the same file);
  2. `llama-perplexity -m BASE -f TEXT -c 512 --kl-divergence-base base.kld` (the base's log-probs);
  3. `llama-perplexity -m OUT -f TEXT -c 512 --kl-divergence-base base.kld --kl-divergence`,
     whose final statistics are parsed into JSON.

Usage (llama.cpp built by ../shared/reference/build-llamacpp.sh, tpslab built with cargo build):
  python3 tests/reference/make_kl_refs.py [LLAMA_CPP_BIN] [TPSLAB_BIN] > tests/data/kl_refs.json
"""
import hashlib, json, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama-cpp-ref/llama.cpp/build/bin"
TPSLAB = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/debug/tpslab")
TEXT = os.path.join(ROOT, "assets/perplexity/pride-and-prejudice-ch1.txt")
CTX = 512
TYPE = "q4_0"

# "label: value ± unc" or "label: value%" lines of llama-perplexity's final statistics.
FIELDS = {
    "ppl": r"Mean PPL\(Q\)\s*:",
    "ppl_base": r"Mean PPL\(base\)\s*:",
    "ln_ppl_ratio": r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:",
    "ppl_ratio": r"Mean PPL\(Q\)/PPL\(base\)\s*:",
    "ppl_diff": r"Mean PPL\(Q\)-PPL\(base\)\s*:",
    "kld_mean": r"Mean\s+KLD:",
    "kld_max": r"Maximum KLD:",
    "kld_p99": r"99\.0%\s+KLD:",
    "kld_p95": r"95\.0%\s+KLD:",
    "kld_median": r"Median\s+KLD:",
    "kld_min": r"Minimum KLD:",
    "dp_mean_pct": r"Mean\s+Δp:",
    "dp_rms_pct": r"RMS Δp\s*:",
    "same_top_pct": r"Same top p:",
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def parse(log):
    out = {}
    for key, pat in FIELDS.items():
        m = re.search(pat + r"\s*(-?[0-9.]+)\s*%?\s*(?:±\s*([0-9.]+))?", log)
        if not m:
            sys.exit(f"llama-perplexity printed no '{key}' line:\n{log[-3000:]}")
        out[key] = float(m.group(1))
        if m.group(2) is not None:
            out[key + "_unc"] = float(m.group(2))
    return out


def main():
    base = subprocess.run([TPSLAB, "models", "--json"], check=True, capture_output=True, text=True)
    entries = json.loads(base.stdout)
    base_path = next(e["path"] for e in entries if "SmolLM2-135M-Instruct" in e["path"])
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, f"default.{TYPE}.gguf")
        subprocess.run([TPSLAB, "quantize", "default", model, "--type", TYPE], check=True,
                       capture_output=True)
        kld = os.path.join(tmp, "base.kld")
        common = ["-f", TEXT, "-c", str(CTX), "-t", "2", "--kl-divergence-base", kld]
        subprocess.run([f"{BIN}/llama-perplexity", "-m", base_path] + common, check=True,
                       capture_output=True)
        r = subprocess.run([f"{BIN}/llama-perplexity", "-m", model, "--kl-divergence"] + common,
                           check=True, capture_output=True, text=True)
        stats = parse(r.stdout + r.stderr)
        json.dump({
            "about": "llama-perplexity --kl-divergence of the default model's Q4_0 re-quantization "
                     "(tpslab quantize) against the default model, bundled text, -c 512; "
                     "written by tests/reference/make_kl_refs.py",
            "ctx": CTX,
            "type": TYPE,
            "base_sha256": sha256(base_path),
            "model_sha256": sha256(model),
            "llamacpp": stats,
        }, sys.stdout, indent=1, ensure_ascii=False)
        print()


main()
