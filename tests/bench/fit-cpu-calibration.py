#!/usr/bin/env python3
"""Refits the device table's "cpu" calibration to this-cpu's measured rows.

The planner's roofline has a few shares per backend (assets/devices.json, "calibrations"):
weight-read bandwidth, decode / batched-decode / prefill compute, step and TTFT overheads. This
script searches them (coordinate descent over a grid, from the table's values) for the least mean
|relative error| of aggregate TPS, per-request TPS and TTFT over the rows marked "fitted", by
running `tpslab plan --devices` on candidate tables, and prints the held-out rows' error too.

  tests/bench/fit-cpu-calibration.py TPSLAB_BINARY DEVICES_JSON OUT_JSON

DEVICES_JSON holds this-cpu's measured rows (edit them first); OUT_JSON gets the table with the
fitted calibration (copy its "cpu" values into assets/devices.json). The table's bandwidth and FLOP/s figures of this-cpu
stay as they are: the shares are relative to them.
"""
import json
import subprocess
import sys
import tempfile

def steps(lo, hi, step):
    n = round((hi - lo) / step)
    return [round(lo + i * step, 4) for i in range(n + 1)]


GRID = {
    "weight_bandwidth_efficiency": steps(0.3, 1.0, 0.05),
    "decode_compute_efficiency": steps(0.02, 0.5, 0.01),
    "batched_compute_efficiency": steps(0.05, 0.8, 0.01),
    "prefill_compute_efficiency": steps(0.05, 0.8, 0.01),
    "step_overhead_ms": steps(0.0, 3.0, 0.25),
    "ttft_overhead_ms": steps(0.0, 100.0, 5.0),
}


def set_param(cal, name, value):
    if name == "weight_bandwidth_efficiency":
        cal[name] = {"default": value}
    else:
        cal[name] = value


def errors(binary, table):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(table, f)
        path = f.name
    out = path + ".plan.json"
    subprocess.run(
        [binary, "plan", "--model", "default", "--device", "this-cpu", "--concurrency", "1",
         "--devices", path, "--json", out],
        check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        e = json.load(f)["sources"][0]["error"]
    fitted, held = [], []
    for r in e["rows"]:
        errs = [abs(r[k]) * 100 for k in ("aggregate_err", "per_request_err", "ttft_err")]
        (fitted if r["row"].get("fitted") else held).extend(errs)
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    return mean(fitted), mean(held), max(held) if held else float("nan")


def main():
    binary, src = sys.argv[1], sys.argv[2]
    dst = sys.argv[3]
    table = json.load(open(src))
    cal = table["calibrations"]["cpu"]
    cal.setdefault("batched_above_tokens", 9)
    cal.setdefault("batched_compute_efficiency", cal["decode_compute_efficiency"])
    best = errors(binary, table)
    print(f"start: fitted mean {best[0]:.1f}%, held out mean {best[1]:.1f}% max {best[2]:.1f}%")
    for _ in range(6):
        moved = False
        for name, values in GRID.items():
            for v in values:
                old = cal[name]
                set_param(cal, name, v)
                e = errors(binary, table)
                if e[0] < best[0] - 1e-9:
                    best, moved = e, True
                else:
                    cal[name] = old
        if not moved:
            break
    print(f"fitted: mean {best[0]:.1f}%; held out: mean {best[1]:.1f}%, max {best[2]:.1f}%")
    print(json.dumps({k: cal[k] for k in GRID}, indent=1))
    with open(dst, "w") as f:
        json.dump(table, f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
