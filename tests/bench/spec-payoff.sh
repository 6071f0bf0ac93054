#!/usr/bin/env bash
# Speculation never costs (issue 42): single-stream decode on the default model with n-gram
# speculation off, on with the pay-off policy (the default: a proposal is verified only when it
# is expected to pay for the longer step), and on with every proposal verified
# (`--spec-always`), on three workloads:
#   - copy: a passage, then its start again (proposals land);
#   - free: windows of the bundled text continued greedily (the small model often repeats);
#   - sampled: the same at temperature 1 (text that does not repeat: proposals rarely land).
# Rounds are interleaved (every configuration once per round) and each cell is the median over
# rounds of the per-request decode TPS mean (4 requests one after another, 128 in, 128 out).
# Usage: TPS=path/to/release/tpslab tests/bench/spec-payoff.sh OUT_DIR
# Knobs: THREADS (2), ROUNDS (3), SUMMARY_ONLY=1 (only the table, from OUT_DIR's runs).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
. "$HERE/tests/bench/machine.sh"
TPS=${TPS:?set TPS to a release tpslab binary}
OUT=${1:?output folder}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
MODEL=$(default_model "$TPS")
machine_lines
echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds, $THREADS threads"

workload_args() {
  case $1 in
    copy) echo "--workload copy" ;;
    free) echo "--workload free" ;;
    sampled) echo "--workload free --temperature 1" ;;
  esac
}
spec_args() {
  case $1 in
    off) echo "--spec off" ;;
    pays) echo "--spec ngram" ;;
    always) echo "--spec ngram --spec-always" ;;
  esac
}
WORKLOADS="copy free sampled"
SPECS="off pays always"
for r in $( [ -n "${SUMMARY_ONLY:-}" ] || seq 1 "$ROUNDS"); do
  for w in $WORKLOADS; do
    for s in $SPECS; do
      # shellcheck disable=SC2046
      "$TPS" bench --model "$MODEL" --threads "$THREADS" --prompt-len 128 --output-len 128 \
        --concurrency 1 --num-requests 4 $(workload_args "$w") $(spec_args "$s") \
        --json "$OUT/$w-$s-$r.json" >"$OUT/$w-$s-$r.txt"
    done
  done
done

python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def cell(w, s, key):
    vals = []
    for r in range(1, rounds + 1):
        run = json.load(open(f"{out}/{w}-{s}-{r}.json"))["runs"][0]
        vals.append(run[key])
    return statistics.median(vals), vals
def spec_totals(w, s):
    p = a = 0
    for r in range(1, rounds + 1):
        run = json.load(open(f"{out}/{w}-{s}-{r}.json"))["runs"][0]
        sp = run.get("spec") or {}
        p += sp.get("num_draft_tokens", 0)
        a += sp.get("num_accepted_tokens", 0)
    return p, a
print("| workload | speculation | per-request TPS (median of rounds; each round) | vs off | accepted / verified proposals |")
print("|---|---|---|---|---|")
names = {"off": "off", "pays": "n-gram, verified when it pays", "always": "n-gram, every proposal verified"}
for w in ["copy", "free", "sampled"]:
    base, _ = cell(w, "off", "mean_per_request_tps")
    for s in ["off", "pays", "always"]:
        m, vals = cell(w, s, "mean_per_request_tps")
        p, a = spec_totals(w, s)
        acc = "-" if s == "off" else f"{a} / {p}" + (f" ({100*a/p:.0f}%)" if p else "")
        each = ", ".join(f"{v:.1f}" for v in vals)
        print(f"| {w} | {names[s]} | {m:.1f} ({each}) | {m/base:.2f}x | {acc} |")
EOF
