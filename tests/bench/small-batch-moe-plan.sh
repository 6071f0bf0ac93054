#!/usr/bin/env bash
# BENCHMARKS.md, 2026-12-04 sections (issues 19, 20, 21): small batches old against new, the
# planner calibrated here, and the synthetic Qwen3-30B-A3B at 1 / 4 / 16. Run on a quiet
# machine. NEW and OLD are release builds of `tpslab` (a clean clone, and the same tree with the
# kernels before the change); ROWS_NEW and ROWS_OLD the matching `step_rows` examples. Results go
# to OUT (default /tmp/bench). Needs ~17 GiB free for the MoE model.
set -x
B=${NEW:?release tpslab}
OLD=${OLD:?release tpslab before the change}
ROWS_NEW=${ROWS_NEW:?kernels example step_rows}
ROWS_OLD=${ROWS_OLD:?step_rows before the change}
mkdir -p "${OUT:=/tmp/bench}"
cd "$OUT" 
date -u > date.txt
grep -o 'avx512[a-z_]*\|avx2\|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ' > flags.txt
# 1. Kernel change, same run: the old and new serving benchmark interleaved, small batches.
for r in 1 2; do
  for b in old new; do
    bin=$B; [ $b = old ] && bin=$OLD
    $bin bench --concurrency 1,2,4,8,16 --prompt-len 32 --output-len 64 --threads 2 > serve_${b}_$r.txt 2>&1
  done
done
for r in 1 2 3; do
  TPSLAB_ROWS=12 TPSLAB_REPS=21 $ROWS_OLD > rows_old_$r.txt 2>&1
  TPSLAB_ROWS=12 TPSLAB_REPS=21 $ROWS_NEW > rows_new_$r.txt 2>&1
done
# 2. Planner calibration here, then a fresh held-out run at 64.
$B plan --calibrate --device this-cpu --concurrency 1,4,16,64 --token-budget 2048 --threads 2 --save-devices cal_devices.json --json cal_plan.json > calibrate.txt 2>&1
$B bench --concurrency 64 --prompt-len 128 --output-len 128 --threads 2 > fresh64.txt 2>&1
# 3. MoE: synthetic Qwen3-30B-A3B, Q4_K, at 1 / 4 / 16.
/usr/bin/time -v $B bench --synthetic qwen3-30b-a3b --precision q4_k --concurrency 1,4,16 --prompt-len 32 --output-len 16 --threads 2 --json moe.json > moe.txt 2> moe.err
date -u >> date.txt
