#!/usr/bin/env bash
# What a new user gets on this CPU: builds tpslab from a clean clone of this repository (release,
# --locked, its own target dir), then runs ROUNDS interleaved rounds of both engines on the
# default model and prints the same-run ratios (tpslab / llama.cpp) with their spread.
#   tests/bench/cpu-vs-llamacpp.sh
#   ROUNDS=7 LLAMA_BIN=/path/to/llama.cpp/build/bin tests/bench/cpu-vs-llamacpp.sh
# Each round runs, in an order that alternates between rounds (tpslab first in odd rounds,
# llama.cpp first in even ones, so drift in the machine's load hits both alike):
#   pp128, pp512, tg128: tpslab bench --pp 128,512 --tg 128 --reps 1  vs  llama-bench -r 1
#     (tg128 also as tpslab's share of the read bandwidth its bench measures in the same run)
#   whole-run output at 64 concurrent (prompt 128, output 128): tpslab bench --concurrency 64
#     (aggregate output TPS)  vs  llama-batched-bench -npl 64 (B*TG/T)
# A ratio is taken within a round (both engines seconds apart), then the median and the range
# over rounds are printed.
# Knobs: ROUNDS (5), THREADS (2), LLAMA_BIN (the llama.cpp reference build), SRC (the repo to
# clone, default this one), REV (HEAD), WORK (a fresh temp dir; kept if KEEP=1), TARGET_DIR
# (default WORK/target: a cold build; point it at an existing dir only to check the script),
# MODEL (a GGUF file both engines run, or several separated by spaces, each measured in turn after
# the one build; default the default model), CONCURRENT (64; 0 skips the concurrent figure, which
# takes minutes on a larger model).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
. "$HERE/tests/bench/machine.sh"
SRC=${SRC:-$HERE}
REV=${REV:-$(git -C "$SRC" rev-parse HEAD)}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llama-cpp-ref/llama.cpp/build/bin}
WORK=${WORK:-$(mktemp -d /tmp/tpslab-cpu-bench.XXXXXX)}
TARGET_DIR=${TARGET_DIR:-$WORK/target}
for b in llama-bench llama-batched-bench; do
  [ -x "$LLAMA_BIN/$b" ] || { echo "no $LLAMA_BIN/$b (set LLAMA_BIN)" >&2; exit 2; }
done
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK/tpslab"; [ "$TARGET_DIR" = "$WORK/target" ] && rm -rf "$WORK"' EXIT

echo "# clean clone of $SRC at $REV into $WORK/tpslab"
git clone --quiet --no-local "$SRC" "$WORK/tpslab"
git -C "$WORK/tpslab" checkout --quiet "$REV"
t0=$(date +%s)
(cd "$WORK/tpslab" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release --locked -q)
echo "# release build: $(( $(date +%s) - t0 )) s"
TPS="$TARGET_DIR/release/tpslab"
"$TPS" generate --model default --prompt x --max-tokens 1 --json >/dev/null
MODELS=${MODEL:-"${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf"}
for MODEL in $MODELS; do
  [ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
done
CONCURRENT=${CONCURRENT:-64}

machine_lines

# One round of each engine; each prints "figure value" lines.
ours() {
  "$TPS" bench --model "$MODEL" --pp 128,512 --tg 128 --reps 1 --threads "$THREADS" |
    awk -F'|' '$2 ~ /^ *(pp|tg)[0-9]+ *$/ { gsub(/ /, "", $2); gsub(/ /, "", $3); print $2, $3
      if ($2 ~ /^tg/ && $6 ~ /%/) { gsub(/[ %]/, "", $6); print $2 "share", $6 } }'
  [ "$CONCURRENT" = 0 ] && return
  "$TPS" bench --model "$MODEL" --concurrency "$CONCURRENT" --prompt-len 128 --output-len 128 --threads "$THREADS" |
    awk -F'|' -v c="$CONCURRENT" '$2 ~ "^ *" c " *$" { gsub(/ /, "", $8); print "out64", $8 }'
}
theirs() {
  "$LLAMA_BIN/llama-bench" -m "$MODEL" -p 128,512 -n 128 -r 1 -t "$THREADS" -o csv 2>/dev/null |
    awk -F',' 'NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); c[h] = i } next }
      { p = $c["n_prompt"]; g = $c["n_gen"]; gsub(/"/, "", p); gsub(/"/, "", g); v = $c["avg_ts"]; gsub(/"/, "", v)
        print (p + 0 > 0 ? "pp" p : "tg" g), v }'
  [ "$CONCURRENT" = 0 ] && return
  "$LLAMA_BIN/llama-batched-bench" -m "$MODEL" -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$CONCURRENT" \
    -t "$THREADS" 2>&1 | awk -F'|' -v c="$CONCURRENT" '$2 ~ /^ *128 *$/ && $4 ~ "^ *" c " *$" { print "out64", $4 * $3 / $10 }'
}

for MODEL in $MODELS; do
echo
echo "# model $MODEL"
echo "# tpslab kernels: ${TPSLAB_CPU_KERNELS:-detected}; threads $THREADS; rounds $ROUNDS; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
RES="$WORK/rounds.txt"
: >"$RES"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then
    ours | sed "s/^/$r ours /" >>"$RES"; theirs | sed "s/^/$r llama /" >>"$RES"
  else
    theirs | sed "s/^/$r llama /" >>"$RES"; ours | sed "s/^/$r ours /" >>"$RES"
  fi
  echo "# round $r done, load $(cut -d' ' -f1 /proc/loadavg)"
done

echo
echo "| figure | tpslab tok/s (median) | llama.cpp tok/s (median) | same-round ratio: median | min .. max | rounds |"
echo "|---|---|---|---|---|---|"
awk "$(cat "$HERE/tests/bench/median.awk")"'
  { v[$3, $2, $1] = $4; figs[$3] = 1; rounds[$1] = 1 }
  END {
    split("pp128 pp512 tg128 out64", order, " ")
    for (o = 1; o <= 4; o++) {
      f = order[o]; if (!(f in figs)) continue
      n = 0; delete ra; delete oa; delete la
      for (r in rounds) if ((f, "ours", r) in v && (f, "llama", r) in v && v[f, "llama", r] > 0) {
        n++; oa[n] = v[f, "ours", r]; la[n] = v[f, "llama", r]; ra[n] = oa[n] / la[n]
      }
      if (n == 0) continue
      lo = ra[1]; hi = ra[1]; for (i = 1; i <= n; i++) { if (ra[i] < lo) lo = ra[i]; if (ra[i] > hi) hi = ra[i] }
      name = f == "out64" ? "whole-run output, '"$CONCURRENT"' concurrent" : f
      printf "| %s | %.1f | %.1f | **%.2fx** | %.2f .. %.2f | %d |\n", name, median(oa, n), median(la, n), median(ra, n), lo, hi, n
      # Decode against the read bandwidth tpslab bench measures in the same run.
      n = 0; delete sa
      for (r in rounds) if ((f "share", "ours", r) in v) sa[++n] = v[f "share", "ours", r]
      if (n == 0) continue
      lo = sa[1]; hi = sa[1]; for (i = 1; i <= n; i++) { if (sa[i] < lo) lo = sa[i]; if (sa[i] > hi) hi = sa[i] }
      printf "| %s, tpslab share of the read bandwidth | %.0f%% | - | - | %.0f .. %.0f%% | %d |\n", f, median(sa, n), lo, hi, n
    }
  }' "$RES"
done
