#!/usr/bin/env bash
# Long fuzz runs: every fuzz target with many cases, on a seed of its own (a new one each run
# unless SEED is given). A failure prints the seed and the case; keep the case as a regression
# test (engine/tests/fuzz.rs `regressions`, tests/server_fuzz.rs) and fix it.
#
#   tests/fuzz/run-long.sh            # 20000 cases per target, a random seed
#   CASES=200000 SEED=42 tests/fuzz/run-long.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CASES="${CASES:-20000}"
SEED="${SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}"
echo "fuzz: $CASES cases per target, seed $SEED"
export TPSLAB_FUZZ_CASES="$CASES" TPSLAB_FUZZ_SEED="$SEED"
# Release: the same code as a user's build, ~10x more cases per minute than the test profile.
cargo test --release --locked -p tpslab-engine --test fuzz -- --test-threads 2
if ls tests/*fuzz*.rs >/dev/null 2>&1; then
    for t in tests/*fuzz*.rs; do
        cargo test --release --locked --test "$(basename "$t" .rs)" -- --test-threads 2
    done
fi
echo "fuzz: seed $SEED passed"
