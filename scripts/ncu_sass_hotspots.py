#!/usr/bin/env python3
"""Top stall locations of one kernel from `ncu --page source --print-source sass --csv` output: the SASS
lines with the most warp-stall samples, with their share and the instructions around them.
usage: ncu_sass_hotspots.py FILE [N]"""
import csv, sys

def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"') and not l.startswith('"Kernel Name"')]
    rd = csv.reader(lines)
    hdr = next(rd)
    def col(name):
        for i, h in enumerate(hdr):
            if h.startswith(name):
                return i
        return None
    i_src = col("Source")
    i_st = col("Warp Stall Sampling (All")
    i_ex = col("Instructions Executed")
    if i_src is None or i_st is None:
        print("columns:", hdr)
        return
    for r in rd:
        try:
            rows.append((float(r[i_st] or 0), r[i_src], r[i_ex] if i_ex is not None else ""))
        except (ValueError, IndexError):
            pass
    tot = sum(r[0] for r in rows) or 1
    print(f"{len(rows)} SASS lines, {tot:.0f} stall samples")
    for idx in sorted(range(len(rows)), key=lambda i: -rows[i][0])[:n]:
        s, src, ex = rows[idx]
        print(f"{100 * s / tot:5.1f}%  line {idx:5d}  exec {ex:>8}  {src.strip()[:110]}")

main()
