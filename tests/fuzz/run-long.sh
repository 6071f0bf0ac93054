#!/usr/bin/env bash
# Long fuzz runs, not in CI. Two modes:
#
#   tests/fuzz/run-long.sh                  # 20000 cases per target, a random seed
#   CASES=200000 SEED=42 tests/fuzz/run-long.sh
#   MINUTES=10 tests/fuzz/run-long.sh       # each target for 10 minutes, seed after seed
#
# Targets, one per parser of outside input: the GGUF reader and model load (`gguf`, `split`),
# the safetensors header (`safetensors`), `config.json` and `tokenizer.json` (`hf_folder`), the
# chat template and its context (`template`), structured output's JSON schemas
# (`json_schema`), and request JSON through the parser and the real HTTP routes (`request`).
# Their inputs are the committed seeds they mutate: the tiny model of
# engine/tests/support/tiny_model.rs, tests/data/schemas, and the generators in the targets.
# A failure prints the seed and the case; keep the case as a regression test
# (engine/tests/fuzz.rs `regressions`, tests/api/server_fuzz.rs) and fix it. With MINUTES, one line
# per target (`fuzz NAME: N cases in T s`) goes to $OUT (default target/fuzz-long.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED="${SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}"
# Release: the same code as a user's build, ~10x more cases per minute than the test profile.
if [ -z "${MINUTES:-}" ]; then
    CASES="${CASES:-20000}"
    echo "fuzz: $CASES cases per target, seed $SEED"
    export TPSLAB_FUZZ_CASES="$CASES" TPSLAB_FUZZ_SEED="$SEED"
    cargo test --release --locked -p tpslab-engine --test fuzz -- --test-threads 2
    cargo test --release --locked --workspace --test api -- server_fuzz:: --test-threads 2
    echo "fuzz: seed $SEED passed"
    exit 0
fi
OUT="${OUT:-target/fuzz-long.txt}"
SECS=$((MINUTES * 60))
mkdir -p "$(dirname "$OUT")"
echo "fuzz: $MINUTES minutes per target from seed $SEED ($(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))" | tee -a "$OUT"
cargo test --release --locked -p tpslab-engine --test fuzz --no-run
cargo test --release --locked --workspace --test api --no-run
for target in gguf_files_and_model_load split_sets safetensors_headers \
    hugging_face_folders_config_and_tokenizer_json chat_template_rendering json_schemas; do
    TPSLAB_FUZZ_SECS="$SECS" TPSLAB_FUZZ_SEED="$SEED" \
        cargo test --release --locked -p tpslab-engine --test fuzz -- --exact "$target" \
        --nocapture 2>&1 | grep -E '^fuzz |test result|panicked' | tee -a "$OUT"
done
# Request JSON: the parser and the real routes, batch after batch of seeds for as long.
start=$(date +%s)
batches=0
while [ $(($(date +%s) - start)) -lt "$SECS" ]; do
    TPSLAB_FUZZ_SEED=$((SEED % 1000000000 + batches)) \
        cargo test --release --locked --workspace --test api -q -- server_fuzz:: --test-threads 2 >/dev/null 2>&1 \
        || { echo "fuzz request: FAILED at seed offset $((SEED % 1000000000 + batches))" | tee -a "$OUT"; exit 1; }
    batches=$((batches + 1))
done
echo "fuzz request: $batches runs of tests/api/server_fuzz.rs (each target at its default case count, a seed each) in $(($(date +%s) - start)) s" | tee -a "$OUT"
echo "fuzz: done, seed $SEED" | tee -a "$OUT"
