#!/usr/bin/env bash
# The quantize presets on the default model (BENCHMARKS.md, issue 16): re-quantizes it to each
# preset, measures KL against it and perplexity (bundled text, ctx 512), then decode speed, and
# prints the table. Usage: tests/bench/quant-presets.sh [TPSLAB_BIN] [OUT_DIR]
set -eu
BIN=${1:-target/release/tpslab}; O=${2:-/tmp/tpslab-presets}; mkdir -p "$O"
PRESETS="q8_0 q6_k q5_k_m q5_k_s q4_k_m q4_k_s iq4_xs q3_k_m q2_k"
for p in $PRESETS; do
  [ -f "$O/$p.gguf" ] || "$BIN" quantize --type "$p" --threads 1 default "$O/$p.gguf" >/dev/null
  "$BIN" perplexity --threads 2 --json --kl-base default "$O/$p.gguf" > "$O/$p.kl.json"
done
for p in base $PRESETS; do
  m="$O/$p.gguf"; [ "$p" = base ] && m=default
  "$BIN" bench --model "$m" --device cpu --threads 2 --tg 128 --pp 128 --reps 3 > "$O/$p.bench.txt"
done
python3 - "$O" "$PRESETS" <<'PY'
import json, re, sys
o, presets = sys.argv[1], sys.argv[2].split()
def tg(p):
    t = open(f"{o}/{p}.bench.txt").read()
    dom = re.search(r"\(([^)]*)\)", t.splitlines()[0]).group(1)
    return re.search(r"\| tg128 \| ([0-9.]+) \|", t).group(1), dom
print("| preset | size (MiB) | mean KL ± | P99 KL | same top-1 | perplexity ± | Δ ppl | decode tok/s (tg128) |")
print("|---|---|---|---|---|---|---|---|")
import os
for p in presets:
    d = json.load(open(f"{o}/{p}.kl.json"))
    t, dom = tg(p)
    size = os.path.getsize(f"{o}/{p}.gguf") / 2**20
    print(f"| {p.upper()} | {size:.1f} | {d['kld']['value']:.4f} ± {d['kld']['unc']:.4f} | "
          f"{d['kld_spread']['p99']:.4f} | {100*d['same_top']['value']:.1f}% | "
          f"{d['ppl']['value']:.3f} ± {d['ppl']['unc']:.3f} | {d['ppl_diff']['value']:+.3f} | {t} ({dom} dominant) |")
t, _ = tg("base")
print(f"| original | | 0 | 0 | 100% | {d['ppl_base']['value']:.3f} | 0 | {t} |")
PY
