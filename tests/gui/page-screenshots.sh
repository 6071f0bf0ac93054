#!/usr/bin/env bash
# A screenshot of each page of the real window under Xvfb (no GPU, no display needed), on the
# default model, at 1280x800: the window opens on the page its saved state names (a fresh
# TPSLAB_HOME per page, holding a copy of the default model and a state file of one line), and the
# screen is grabbed AT seconds after start. The dashboard's picture with a live sweep is
# tests/gui/dashboard-screenshot.sh.
#
# Needs: xvfb xauth imagemagick (apt-get install xvfb xauth imagemagick), a release build, the
# default model fetched once (`tpslab generate -m default ...` does it).
# Usage: tests/gui/page-screenshots.sh [TPSLAB_BIN] [OUT_DIR] [AT] [PAGES...]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/tpslab}
OUT=${2:-assets/screenshots}
AT=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
PAGES=("$@")
[ ${#PAGES[@]} -gt 0 ] || PAGES=(Chat Planner Tuner Models Quantize)
[ -x "$BIN" ] || { echo "no tpslab binary at $BIN (cargo build --release)" >&2; exit 2; }
command -v xvfb-run >/dev/null || { echo "xvfb-run is needed (apt-get install xvfb xauth)" >&2; exit 2; }
MODEL=${TPSLAB_MODEL:-$HOME/.local/share/tpslab/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "the default model is not fetched yet ($MODEL)" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export XDG_RUNTIME_DIR=$WORK/xdg
mkdir -p "$XDG_RUNTIME_DIR" "$OUT" && chmod 700 "$XDG_RUNTIME_DIR"
for page in "${PAGES[@]}"; do
  home=$WORK/home-$page
  mkdir -p "$home/models"
  cp "$MODEL" "$home/models/"
  printf '{"tab": "%s"}\n' "$page" > "$home/window-state.json"
  name=$(echo "$page" | tr 'A-Z' 'a-z')
  TPSLAB_HOME=$home xvfb-run -a -s "-screen 0 1280x800x24" sh -c "
    '$BIN' --threads 2 > '$WORK/$page.log' 2>&1 &
    sleep $AT
    import -window root '$WORK/$name.png'
    kill \$! 2>/dev/null || true
    wait 2>/dev/null || true
  "
  cp "$WORK/$name.png" "$OUT/$name.png"
  echo "screenshot: $OUT/$name.png"
done
