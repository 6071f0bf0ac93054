#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   tests/gpu/gpu-check.sh build   # here (no GPU needed): release binary + GPU test binaries,
#                                  # stripped, as one xz archive in .gpu/ (git-ignored), which the
#                                  # device call carries
#   tests/gpu/gpu-check.sh run     # on the GPU machine, in one call: GPU tests (CUDA vs CPU on
#                                  # fresh random inputs), device bandwidth, then the benchmark:
#                                  # synthetic smollm2-135m and llama-3-8b, F16 and Q4_K, at
#                                  # concurrency 1,16,64,256; logs under $OUT, table last, its rows
#                                  # as JSON in tests/gpu/results/DATE.json (tests/gpu/results.py),
#                                  # copied to $OUT/results-DATE.json to bring back and commit.
#
# The device call: run(command="bash tests/gpu/gpu-check.sh run", carry=[".gpu"], timeout_s=480).
# The run keeps to BUDGET_S seconds (default 420): a bench that would start past it is skipped and
# said so, in priority order (the default kernels first, then the trial kernels and the mixture
# of experts, then the rest), and $OUT/gpu-check.tgz is rewritten after every part, so a call cut
# off at its limit still brings back what ran.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode="${1:-}"
carry=.gpu

build() {
  set -e
  local exclude
  exclude="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
  rm -rf "$carry" && mkdir -p "$carry"
  cargo build --release --bin tpslab
  local tdir="${CARGO_TARGET_DIR:-target}"
  cp "$tdir/release/tpslab" "$carry/tpslab"
  for spec in "tpslab-kernels cuda" "tpslab-engine cuda_model"; do
    set -- $spec
    local exe
    exe=$(cargo test --release -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null |
      python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
    cp "$exe" "$carry/test-$2"
  done
  strip "$carry"/*
  ls -la "$carry"
  # The device call carries at most 64 MiB: the binaries (each embedding the PTX) travel as one
  # xz archive, which run() unpacks with Python's tarfile.
  tar -C "$carry" -cJf "$carry.tar.xz" .
  rm -rf "$carry" && mkdir -p "$carry" && mv "$carry.tar.xz" "$carry/bundle.tar.xz"
  du -sh "$carry"
}

run() {
  # Everything is written here and packed into one file under $OUT at the end (the device
  # tool brings back at most 8 files).
  out=/tmp/gpu-out  # global: the EXIT trap packs it after run() returns
  rm -rf "$out" && mkdir -p "$out"
  # The binaries, unpacked from build()'s archive.
  local bin=/tmp/gpu-bin
  rm -rf "$bin" && mkdir -p "$bin"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$carry/bundle.tar.xz" "$bin" || { echo "cannot unpack $carry/bundle.tar.xz" >&2; exit 3; }
  carry="$bin"
  local t0
  budget=${BUDGET_S:-420}
  t0=$(date +%s)
  left() { echo $((budget - ($(date +%s) - t0))); }
  pack() { tar czf "${OUT:-/tmp}/gpu-check.tgz" -C "$out" . 2>/dev/null || true; }
  trap pack EXIT
  # cuBLAS from the image's pip CUDA libraries.
  local nv
  nv=$(python3 -c 'import nvidia, os; print(nvidia.__path__[0])' 2>/dev/null)
  for d in "$nv"/cu13/lib "$nv"/*/lib; do [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$out/smi.txt"
  echo "== GPU tests"
  for t in "$carry"/test-*; do
    # The GPU tests are #[ignore]d where there is no GPU; here they all run. The one on the real
    # default model runs only where that file is (the device machine does not fetch it).
    skip=()
    [ -f "${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] ||
      { skip=(--skip real_default_model_logits_match_cpu); echo "not run: real_default_model_logits_match_cpu (no default model on this machine)"; }
    timeout "$(( $(left) > 60 ? $(left) : 60 ))" "$t" --include-ignored "${skip[@]}" --test-threads=1 --nocapture 2>&1 |
      tee "$out/$(basename "$t").log" | grep -E "^test |seed|skipped|result|panicked|rel err"
    pack
  done
  echo "== device bandwidth (torch device-to-device copy, bytes read + written)"
  python3 - <<'EOF' 2>&1 | tee "$out/bandwidth.txt"
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); y.copy_(x); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); ms = ts[len(ts) // 2]
print(f"bandwidth_gbs {2 * x.numel() / ms / 1e6:.0f}")
EOF
  echo "== benchmark"
  bench() { # tag, concurrency levels, then extra arguments
    local tag="$1" conc="$2" limit; shift 2
    # 30 s stay for the table.
    limit=$(( $(left) - 30 )); [ "$limit" -gt 100 ] && limit=100
    if [ "$limit" -lt 20 ]; then echo "$tag: skipped (time budget of ${budget} s)"; return; fi
    timeout "$limit" "$carry/tpslab" bench --device cuda --concurrency "$conc" --prompt-len 128 \
      --output-len 128 --kv-budget-mb 20480 --max-batched-tokens 8192 --json "$out/$tag.json" \
      "$@" > "$out/$tag.log" 2>&1
    echo "$tag: exit $? ($(left) s left)"; tail -7 "$out/$tag.log"
    pack
  }
  for arch in smollm2-135m llama-3-8b; do
    for prec in f16 q4_k; do
      bench "$arch-$prec" 1,16,64,256 --synthetic "$arch" --precision "$prec"
    done
  done
  # The kernels that are opt-in until measured here: 8-bit-activation matrix-vector kernels
  # (mmvq.cu) up to 8 rows, the fused tensor-core kernels (mmq.cu) for 9 to 256 rows and flash
  # prefill (flash.cu; TTFT) and graphs of padded mixed steps, against the default (f32-activation
  # kernels, dequantize + cuBLAS, per-token attention, decode-only graphs) in the runs above.
  TPSLAB_CUDA_MMVQ=1 TPSLAB_CUDA_MMQ=1 TPSLAB_CUDA_FLASH=1 TPSLAB_CUDA_MIXED_GRAPHS=1 \
    bench llama-3-8b-q4_k-mmq 1,16,64,256 --synthetic llama-3-8b --precision q4_k
  # A mixture of experts (its layers are untried on a GPU until this check: TPSLAB_CUDA_TRIAL),
  # all on the GPU, then with every block's experts in host memory on the CPU (--cpu-moe).
  TPSLAB_CUDA_TRIAL=1 bench qwen3-30b-a3b-q4_k 1,16,64 --synthetic qwen3-30b-a3b --precision q4_k
  TPSLAB_CUDA_TRIAL=1 bench qwen3-30b-a3b-q4_k-cpu-moe 1 --synthetic qwen3-30b-a3b \
    --precision q4_k --cpu-moe
  TPSLAB_CUDA_MMVQ=1 TPSLAB_CUDA_MMQ=1 TPSLAB_CUDA_FLASH=1 TPSLAB_CUDA_MIXED_GRAPHS=1 \
    bench smollm2-135m-q4_k-mmq 1,16,64,256 --synthetic smollm2-135m --precision q4_k
  TPSLAB_CUDA_MMVQ=1 TPSLAB_CUDA_MMQ=1 TPSLAB_CUDA_FLASH=1 TPSLAB_CUDA_MIXED_GRAPHS=1 \
    bench llama-3-8b-q6_k-mmq 1,16 --synthetic llama-3-8b --precision q6_k
  # F16 batch-1 decode with four 16-byte streaming loads in flight a lane (matvec.cu mmv_*_wide).
  TPSLAB_CUDA_WIDE=1 bench llama-3-8b-f16-wide 1 --synthetic llama-3-8b --precision f16
  # Do CUDA graphs pay? The same decode without them.
  TPSLAB_CUDA_GRAPHS=0 bench smollm2-135m-f16-nographs 1,16 --synthetic smollm2-135m --precision f16
  echo "== table"
  # The table, and the same rows as JSON (tests/gpu/results/DATE.json, brought back under $OUT
  # too: commit it with the BENCHMARKS.md table).
  local day
  day=$(date -u +%F)
  mkdir -p tests/gpu/results
  python3 tests/gpu/results.py "$out" "tests/gpu/results/$day.json"
  cp "tests/gpu/results/$day.json" "${OUT:-/tmp}/results-$day.json"
}

case "$mode" in
  build) build ;;
  run) run ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
