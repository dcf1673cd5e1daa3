#!/usr/bin/env python3
"""Compares gdn-bench outputs of two builds (bench/results' side-by-side rule: both from one call).

  bench_compare.py sweep BASE.txt NEW.txt [N]   `--strategies` outputs, cell by cell: mean change,
                                                the N fastest and N slowest cells (default 8)
  bench_compare.py engine ENGINE.txt            scripts/bench_ab.sh's engine table: base -> new for
                                                each (strategy, bucket, T), every repetition
"""
import signal
import sys
from collections import defaultdict


def sweep_cells(path):
    """{(preset, state, T, strategy, B, kind): us} from a `gdn-bench --strategies` output."""
    cells = {}
    for line in open(path):
        if not line.startswith("qwen") or "|" not in line:
            continue
        words = line.split("|")[0].split()
        if words[-1] not in ("decode", "verify"):  # the summary table (decode and verify on one line)
            continue
        # preset state T strategy... B G kind (the strategy may be two words: "ring L=16")
        key = (words[0], words[1], int(words[2]), " ".join(words[3:-3]), int(words[-3]), words[-1])
        cells[key] = float(line.split("|")[1].split()[0])
    return cells


def compare_sweeps(base_path, new_path, n):
    base, new = sweep_cells(base_path), sweep_cells(new_path)
    rows = sorted((100.0 * (new[k] / base[k] - 1.0), k, base[k], new[k]) for k in base if k in new)
    if not rows:
        sys.exit("no common cells")
    print(f"{len(rows)} cells; mean {sum(r[0] for r in rows) / len(rows):+.2f}%")
    shown = rows if len(rows) <= 2 * n else rows[:n] + [None] + rows[-n:]
    for r in shown:
        if r is None:
            print("...")
            continue
        preset, state, tokens, strategy, batch, kind = r[1]
        print(f"{r[0]:+7.2f}%  {preset} {state} T={tokens} {strategy} B={batch} {kind}: {r[2]} -> {r[3]}")


def compare_engine(path):
    """Lines `variant strategy bN TN graph_us kernel_sum_us` (bench_ab.sh): base and new side by side."""
    runs = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        words = line.split()
        if len(words) < 5 or words[0] not in ("base", "new"):
            continue
        runs[(words[1], int(words[2][1:]), int(words[3][1:]))][words[0]].append(float(words[4]))
    print(f"{'strategy':8} {'bucket':>6} {'T':>2}  base -> new (graph us)")
    for key in sorted(runs):
        b, n = runs[key]["base"], runs[key]["new"]
        pairs = " | ".join(f"{x:.1f} -> {y:.1f} ({100 * (y / x - 1):+.1f}%)" for x, y in zip(b, n))
        print(f"{key[0]:8} {key[1]:6} {key[2]:2}  {pairs}")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    if len(sys.argv) >= 4 and sys.argv[1] == "sweep":
        compare_sweeps(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 8)
    elif len(sys.argv) == 3 and sys.argv[1] == "engine":
        compare_engine(sys.argv[2])
    else:
        sys.exit(__doc__)
