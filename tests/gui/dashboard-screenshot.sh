#!/usr/bin/env bash
# The README's dashboard screenshot: the real window under Xvfb (no GPU, no display needed),
# driven by the frame benchmark's `sweep` scenario (app/ui/frame_bench.rs): the dashboard's
# concurrency sweep 1, 2, 4, ... MAX (prompt 32, output 64) on the default model, so the live
# trade-off view holds one point per batch size; the screen is grabbed AT seconds after start.
#
# Needs: xvfb xauth imagemagick (apt-get install xvfb xauth imagemagick), a release build.
# Usage: tests/gui/dashboard-screenshot.sh [TPSLAB_BIN] [OUT.png] [MAX] [AT]
set -euo pipefail
BIN=${1:-target/release/tpslab}
OUT=${2:-assets/screenshots/dashboard.png}
MAX=${3:-16}
AT=${4:-40}
WORK=$(mktemp -d)
export XDG_RUNTIME_DIR=$WORK
# The benchmark closes the window itself a while after the grab.
export TPSLAB_FRAME_BENCH="$((AT + 20)),$MAX,$WORK/frames.json,sweep"
xvfb-run -a -s "-screen 0 1280x800x24" sh -c "
  '$BIN' --threads 2 > '$WORK/app.log' 2>&1 &
  sleep $AT
  import -window root '$WORK/shot.png'
  wait
"
cp "$WORK/shot.png" "$OUT"
echo "screenshot: $OUT (frames: $(cat "$WORK/frames.json" 2>/dev/null | tr -d '\n ' | cut -c1-200))"
