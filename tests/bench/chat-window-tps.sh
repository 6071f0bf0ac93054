#!/usr/bin/env bash
# A chat answer streamed in the real window against `tpslab generate` on the same model, in one
# run: both decode the same greedy answer to the same chat prompt (TOKENS tokens at most), ROUNDS
# rounds interleaved. The window runs under Xvfb with the painter `--renderer auto` picks and its
# own frame pacing, nothing forced (app/ui/chat_bench.rs, TPSLAB_CHAT_BENCH); it reports the
# speed under the answer (tokens as the window drew them) and the engine's own per-request figure.
#   tests/bench/chat-window-tps.sh
#   TPS=target/debug/tpslab ROUNDS=5 TOKENS=256 tests/bench/chat-window-tps.sh
# Knobs: TPS (the tpslab binary, default target/release/tpslab), TOKENS (256), ROUNDS (3),
# THREADS (0 = one per core, for both), RENDERER (auto), PROMPT.
# Prints one line per round, then the medians and the ratios window / generate.
# Needs: xvfb-run (Debian: xvfb xauth), python3; Mesa for the painter (libgl1-mesa-dri libegl1).
set -euo pipefail
cd "$(dirname "$0")/../.."
TPS=${TPS:-target/release/tpslab}
TOKENS=${TOKENS:-256}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-0}
RENDERER=${RENDERER:-auto}
PROMPT=${PROMPT:-"Write a long story about a lighthouse keeper, in many paragraphs."}
[ -x "$TPS" ] || { echo "no tpslab binary at $TPS (cargo build --release)" >&2; exit 2; }
command -v xvfb-run >/dev/null || { echo "xvfb-run is needed (apt-get install xvfb xauth)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 is needed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_RUNTIME_DIR="$tmp/xdg"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

field() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"v": v}))' "$@"; }

gen=() win=() shown=()
for r in $(seq 1 "$ROUNDS"); do
  "$TPS" generate --chat -p "$PROMPT" -n "$TOKENS" --threads "$THREADS" --json >"$tmp/gen.json" 2>"$tmp/gen.err" \
    || { cat "$tmp/gen.err" >&2; exit 1; }
  g=$(field "$tmp/gen.json" 'v["decode_tokens_per_s"]')
  gn=$(field "$tmp/gen.json" 'len(v["output_token_ids"])')
  rm -f "$tmp/win.json"
  # The prompt goes last in the variable: it may hold commas.
  timeout 900 xvfb-run -a -s "-screen 0 1280x800x24" \
    env TPSLAB_CHAT_BENCH="$TOKENS,$tmp/win.json,$PROMPT" \
    "$TPS" --threads "$THREADS" --renderer "$RENDERER" >"$tmp/win.log" 2>&1 || true
  [ -s "$tmp/win.json" ] || { echo "the window wrote no report:" >&2; tail -20 "$tmp/win.log" >&2; exit 1; }
  w=$(field "$tmp/win.json" 'v["engine_decode_tps"] or 0')
  s=$(field "$tmp/win.json" 'v["window_decode_tps"] or 0')
  wn=$(field "$tmp/win.json" 'v["tokens"]')
  fr=$(field "$tmp/win.json" '"%d frames in %.1f s (%s), cap %d/s" % (v["frames"], v["seconds"], v["renderer"], v["frame_cap_fps"])')
  echo "round $r: generate $g tok/s ($gn tokens); window: engine $w tok/s, under the answer $s tok/s ($wn tokens; $fr)"
  [ "$gn" = "$wn" ] || echo "  warning: the two answers differ in length ($gn vs $wn tokens)"
  gen+=("$g") win+=("$w") shown+=("$s")
done
python3 - "${gen[*]}" "${win[*]}" "${shown[*]}" <<'PY'
import statistics as st, sys
g, w, s = ([float(x) for x in a.split()] for a in sys.argv[1:4])
mg, mw, ms = st.median(g), st.median(w), st.median(s)
print(f"median: generate {mg:.1f} tok/s; window {mw:.1f} tok/s (engine), {ms:.1f} tok/s (under the answer)")
print(f"ratio window / generate: {mw / mg:.2f} (engine), {ms / mg:.2f} (under the answer)")
PY
