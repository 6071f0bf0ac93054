#!/usr/bin/env bash
# Cold start, as a user meets it: the time from starting the server to the first token of the
# first request (a completion of one token), for `tpslab serve` and llama.cpp's `llama-server`
# on the same GGUF file, ROUNDS rounds interleaved (which engine starts first alternates).
# The request (no model named: each engine serves its one model) is retried every 20 ms until
# the server answers, so the figure includes loading
# the model (tpslab copies and packs the weights into its arena; llama-server maps the file)
# and the first prompt's prefill.
#   tests/bench/cold-start.sh
#   MODEL=/path/to/file.gguf ROUNDS=5 tests/bench/cold-start.sh
# Knobs: MODEL (default: the default model), ROUNDS (3), THREADS (2), TPS (the tpslab binary,
# default target/release/tpslab), LLAMA_BIN (the llama.cpp reference build), PORT (18431).
# Prints one line per engine and round, then the medians and their ratio. The page cache is
# left as it is: both engines read a file the previous round has just read (a warm start from
# disk; a first start after boot also pays the disk).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
PORT=${PORT:-18431}
TPS=${TPS:-target/release/tpslab}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llama-cpp-ref/llama.cpp/build/bin}
MODEL=${MODEL:-"${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf"}
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
[ -x "$TPS" ] || { echo "no tpslab binary at $TPS (cargo build --release)" >&2; exit 2; }
[ -x "$LLAMA_BIN/llama-server" ] || { echo "no llama-server in $LLAMA_BIN" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl is needed" >&2; exit 2; }

now() { date +%s.%N; }

# Starts the server ($@), then asks for one token until it answers; prints the seconds taken.
first_token() {
  local t0 pid body
  t0=$(now)
  "$@" >/dev/null 2>&1 &
  pid=$!
  body='{"prompt":"The capital of France is","max_tokens":1,"temperature":0}'
  for _ in $(seq 1 6000); do
    if curl -sf -m 60 -H 'Content-Type: application/json' -d "$body" \
      "http://127.0.0.1:$PORT/v1/completions" >/dev/null 2>&1; then
      echo "$(now) - $t0" | bc -l
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "the server exited: $*" >&2; return 1; }
    sleep 0.02
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  echo "no answer in 120 s: $*" >&2
  return 1
}

tps_run() {
  first_token "$TPS" serve --model "$MODEL" --device cpu --threads "$THREADS" \
    --host 127.0.0.1 --port "$PORT"
}
llama_run() {
  first_token "$LLAMA_BIN/llama-server" -m "$MODEL" -t "$THREADS" --host 127.0.0.1 \
    --port "$PORT" -c 4096
}

echo "# model $MODEL; $THREADS threads; $ROUNDS rounds; $(date -u '+%Y-%m-%d %H:%M UTC')"
ts=() ls=()
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then
    a=$(tps_run); b=$(llama_run)
  else
    b=$(llama_run); a=$(tps_run)
  fi
  printf 'round %d: tpslab %.2f s, llama-server %.2f s\n' "$r" "$a" "$b"
  ts+=("$a") ls+=("$b")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
mt=$(median "${ts[@]}") ml=$(median "${ls[@]}")
printf 'median: tpslab %.2f s, llama-server %.2f s, tpslab / llama-server %.2fx\n' \
  "$mt" "$ml" "$(echo "$mt / $ml" | bc -l)"
