#!/usr/bin/env python3
"""The GPU check's table (printed) and its rows as JSON, from the `tpslab bench --json` files
and the device bandwidth that tests/gpu/gpu-check.sh leaves in one folder.

    python3 tests/gpu/results.py OUT_DIR RESULTS.json

One JSON object per (run, concurrency): model, precision, concurrency, per_request_decode_tps
(1000 / median TPOT), aggregate_tps (output tokens a second over the run), ttft_ms (median),
weight_bytes, and bandwidth_gbps (the device copy bandwidth measured in the same call), plus the
run's tag and the floor (bandwidth / weight bytes: the batch-1 decode rate if the weights were
read once a step at that bandwidth and nothing else took time).
"""

import json
import math
import os
import re
import sys

# The runs gpu-check.sh makes, in its order: (tag, model, precision).
RUNS = [(f"{a}-{p}", a, p) for a in ("smollm2-135m", "llama-3-8b") for p in ("f16", "q4_k")] + [
    ("smollm2-135m-f16-nographs", "smollm2-135m", "f16"),
    ("llama-3-8b-q4_k-mmq", "llama-3-8b", "q4_k"),
    ("smollm2-135m-q4_k-mmq", "smollm2-135m", "q4_k"),
    ("llama-3-8b-q6_k-mmq", "llama-3-8b", "q6_k"),
    ("llama-3-8b-f16-wide", "llama-3-8b", "f16"),
    ("qwen3-30b-a3b-q4_k", "qwen3-30b-a3b", "q4_k"),
    ("qwen3-30b-a3b-q4_k-cpu-moe", "qwen3-30b-a3b", "q4_k"),
]


def main() -> None:
    out, dest = sys.argv[1], sys.argv[2]
    bw = None
    try:
        m = re.search(r"bandwidth_gbs (\d+)", open(os.path.join(out, "bandwidth.txt")).read())
        bw = float(m.group(1)) if m else None
    except OSError:
        pass
    print(f"device copy bandwidth: {bw} GB/s; floor = weight bytes / bandwidth for one decode step")
    print(f"{'run':<26}{'weights GB':>10}{'floor tok/s':>12} | c: aggregate output tok/s / "
          "per-request decode tok/s / TTFT p50 ms")
    rows = []
    for tag, model, precision in RUNS:
        p = os.path.join(out, f"{tag}.json")
        if not os.path.exists(p):
            print(f"{tag:<26} (no result)")
            continue
        j = json.load(open(p))
        wb = j.get("weights_bytes") or 0
        floor = bw * 1e9 / wb if bw and wb else float("nan")
        cells = []
        for r in j.get("runs", []):
            tpot = r.get("median_tpot_ms") or float("nan")
            decode = 1000 / tpot if tpot and not math.isnan(tpot) else None
            cells.append(f"c={r['max_concurrency']}: {r['output_throughput']:.0f} / "
                         f"{decode or float('nan'):.0f} / {r['median_ttft_ms']:.1f}")
            rows.append({
                "tag": tag,
                "model": model,
                "precision": precision,
                "concurrency": r["max_concurrency"],
                "per_request_decode_tps": decode,
                "aggregate_tps": r["output_throughput"],
                "ttft_ms": r["median_ttft_ms"],
                "weight_bytes": wb,
                "bandwidth_gbps": bw,
                "floor_tps": None if math.isnan(floor) else floor,
                # A mixture of experts: the share of expert bytes its steps read.
                "expert_share": r.get("expert_share"),
            })
        print(f"{tag:<26}{wb / 1e9:>10.2f}{floor:>12.0f} | " + " | ".join(cells))
    with open(dest, "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    print(f"{len(rows)} rows -> {dest}")


if __name__ == "__main__":
    main()
