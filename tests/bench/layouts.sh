#!/usr/bin/env bash
# Does prefill speed depend on where the kernels land in the binary? Builds three differently
# laid out release binaries of one commit and times pp128 on each in interleaved rounds:
#   default      cargo build --release --locked (what a new user gets)
#   cgu1         the kernels crate with codegen-units = 1 (one object: every function moves)
#   dummy        the kernels crate with an unused 4 KiB function ahead of the hot kernels
# All three share one target folder (dependencies built once; each variant rebuilds only the
# workspace crates). Prints a table of pp128 tok/s per round and each layout's median against
# the default's.
#   tests/bench/layouts.sh
#   ROUNDS=7 REPS=3 TARGET_DIR=/tmp/layout-target tests/bench/layouts.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
. "$HERE/tests/bench/machine.sh"
SRC=${SRC:-$HERE}
REV=${REV:-$(git -C "$SRC" rev-parse HEAD)}
ROUNDS=${ROUNDS:-5}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
WORK=${WORK:-$(mktemp -d /tmp/tpslab-layouts.XXXXXX)}
TARGET_DIR=${TARGET_DIR:-$WORK/target}
mkdir -p "$WORK/bin"

clone() {
  rm -rf "$WORK/$1"
  git clone --quiet --no-local "$SRC" "$WORK/$1"
  git -C "$WORK/$1" checkout --quiet "$REV"
}
build() { # name, clone dir, extra cargo args...
  local name=$1 dir=$2
  shift 2
  local t0
  t0=$(date +%s)
  (cd "$dir" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release --locked -q "$@")
  cp "$TARGET_DIR/release/tpslab" "$WORK/bin/$name"
  echo "# built $name in $(($(date +%s) - t0)) s"
}

clone default
build default "$WORK/default"
build cgu1 "$WORK/default" --config 'profile.release.package."tpslab-kernels".codegen-units=1'
clone dummy
# An unused, never-inlined function of about 4 KiB of code at the top of the panel kernels'
# module (x86/panel32.rs; avx2_panel.rs before the kernels moved into x86/): everything after it
# in the kernels' object moves.
PANEL="$WORK/dummy/kernels/src/x86/panel32.rs"
[ -f "$PANEL" ] || PANEL="$WORK/dummy/kernels/src/avx2_panel.rs"
python3 - "$PANEL" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
pad = "\n".join(f"    acc = acc.wrapping_mul(0x9e37_79b9).rotate_left({i % 31 + 1}) ^ {i};" for i in range(400))
dummy = ("\n/// Layout probe (tests/bench/layouts.sh): never called.\n#[inline(never)]\n#[allow(dead_code)]\n"
         "pub(crate) fn layout_probe(mut acc: u32) -> u32 {\n" + pad + "\n    acc\n}\n")
i = s.index("\nuse ")
open(p, "w").write(s[:i] + dummy + s[i:])
EOF
build dummy "$WORK/dummy"

"$WORK/bin/default" generate --model default --prompt x --max-tokens 1 --json >/dev/null
MODEL="${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
machine_lines
echo "# commit $REV; pp128, --reps $REPS, $THREADS threads, $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"

RES="$WORK/layouts.txt"
: >"$RES"
names=(default cgu1 dummy)
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order each round so drift hits every layout alike.
  for i in 0 1 2; do
    n=${names[$(((i + r) % 3))]}
    v=$("$WORK/bin/$n" bench --model "$MODEL" --pp 128 --reps "$REPS" --threads "$THREADS" |
      awk -F'|' '$2 ~ /^ *pp128 *$/ { gsub(/ /, "", $3); print $3 }')
    echo "$r $n $v" >>"$RES"
  done
done

echo
echo "| layout | pp128 tok/s per round | median | median / default's |"
echo "|---|---|---|---|"
awk "$(cat "$HERE/tests/bench/median.awk")"'
  { v[$2, $1] = $3; rounds[$1] = 1 }
  END {
    split("default cgu1 dummy", order, " ")
    for (o = 1; o <= 3; o++) {
      f = order[o]; n = 0; list = ""; delete a
      for (r = 1; (r in rounds); r++) { n++; a[n] = v[f, r]; list = list (n > 1 ? ", " : "") v[f, r] }
      med[f] = median(a, n)
      printf "| %s | %s | %.1f | %.2f |\n", f, list, med[f], med[f] / med["default"]
    }
  }' "$RES"
