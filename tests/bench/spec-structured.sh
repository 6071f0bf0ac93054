#!/usr/bin/env bash
# Speculative decoding (issue 17) and structured output (issue 18) on the default model, one run:
#   - per-request decode TPS at concurrency 1 with speculation off, n-gram and self-drafting, on
#     copy-heavy prompts (a passage, then its start again) and on free writing;
#   - aggregate TPS at 16 and 64 with speculation off, n-gram with the policy off, and n-gram
#     with the policy on (no proposals above 8 running requests);
#   - llama.cpp's prompt-lookup decoding (llama-lookup) beside plain decoding (llama-completion)
#     on a copy-heavy and a free prompt of the same text, when LLAMA_BIN has them;
#   - structured output: each level of 1 / 16 / 64 plain and constrained to
#     assets/bench/records.schema.json, with the ratios.
# Usage: TPS=path/to/release/tpslab tests/bench/spec-structured.sh OUT_DIR
# (build TPS from a clean clone: tests/bench/cpu-vs-llamacpp.sh does it with KEEP=1).
# Knobs: THREADS (2), LLAMA_BIN (/tmp/llama-cpp-ref/llama.cpp/build/bin), PARTS (the parts to
# run, of "spec llama structured"; all by default).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
. "$HERE/tests/bench/machine.sh"
TPS=${TPS:?set TPS to a release tpslab binary}
OUT=${1:?output folder}
THREADS=${THREADS:-2}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llama-cpp-ref/llama.cpp/build/bin}
PARTS=${PARTS:-spec llama structured}
part() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
MODEL=$(default_model "$TPS")
machine_lines
echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
bench() { "$TPS" bench --model "$MODEL" --threads "$THREADS" --prompt-len 128 --output-len 128 "$@"; }

if part spec; then
echo "## speculation at concurrency 1 (4 requests, one at a time)"
for w in copy free; do
  for s in off ngram self; do
    echo "### workload $w, spec $s"
    bench --workload "$w" --spec "$s" --concurrency 1 --num-requests 4 --json "$OUT/c1-$w-$s.json"
  done
done

echo "## aggregate at 16 and 64 (free writing)"
bench --concurrency 16,64 --spec off --json "$OUT/agg-off.json"
bench --concurrency 16,64 --spec ngram --json "$OUT/agg-ngram.json"
bench --concurrency 16,64 --spec ngram --spec-max-batch 8 --json "$OUT/agg-ngram-policy.json"
fi

if part llama && [ -x "$LLAMA_BIN/llama-lookup" ] && [ -x "$LLAMA_BIN/llama-completion" ]; then
  echo "## llama.cpp: plain and prompt lookup, 128 tokens, greedy"
  TEXT="$HERE/assets/perplexity/pride-and-prejudice-ch1.txt"
  head -c 600 "$TEXT" >"$OUT/free.txt"
  { head -c 600 "$TEXT"; printf '\n\n'; head -c 300 "$TEXT"; } >"$OUT/copy.txt"
  for w in copy free; do
    echo "### llama.cpp $w: plain"
    "$LLAMA_BIN/llama-completion" -m "$MODEL" -f "$OUT/$w.txt" -n 128 --temp 0 -t "$THREADS" \
      -no-cnv --ignore-eos 2>&1 | grep -E "eval time" || true
    echo "### llama.cpp $w: lookup"
    "$LLAMA_BIN/llama-lookup" -m "$MODEL" -f "$OUT/$w.txt" -n 128 --temp 0 -t "$THREADS" \
      --spec-draft-n-max 4 2>&1 | grep -E "decoded|n_draft|n_accept|accept" || true
  done
fi

if part structured; then
echo "## structured output: plain and constrained, 1 / 16 / 64"
SCHEMA="$HERE/assets/bench/records.schema.json"
bench --concurrency 1 --num-requests 8 --json-schema "$SCHEMA" --json "$OUT/structured-1.json"
bench --concurrency 16,64 --json-schema "$SCHEMA" --json "$OUT/structured-16-64.json"
fi
