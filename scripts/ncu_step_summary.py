#!/usr/bin/env python3
"""Summarizes an `ncu --csv --metrics gpu__time_duration.sum` log of bench_cuda_decode (graphs off):
splits the kernel sequence into steps at the embedding kernel, takes the last complete step (a decode
step when the bench ran with --prefill 0) and prints per-kernel-name counts and device time, in
launch order of first appearance, plus the step's total. usage: ncu_step_summary.py NCU_CSV"""
import csv, sys
from collections import OrderedDict


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1000.0 if unit.startswith("n") else (v if unit.startswith("u") else v * 1000.0)
        rows.append((r["Kernel Name"], us))
    starts = [i for i, (n, _) in enumerate(rows) if n.startswith("embed_kernel")]
    if len(starts) < 2:
        print("ncu_step_summary: fewer than two steps in the log")
        return
    step = rows[starts[-2]:starts[-1]]
    agg = OrderedDict()
    for n, us in step:
        key = n.split("(")[0]
        c, t = agg.get(key, (0, 0.0))
        agg[key] = (c + 1, t + us)
    total = sum(us for _, us in step)
    print(f"one decode step: {len(step)} kernels, {total:.1f} us of kernel time (standalone, serialized)")
    for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t:9.1f} us  {c:4d} x {t / c:7.2f} us  {k[:90]}")


if __name__ == "__main__":
    main()
