#!/usr/bin/env python3
"""Summarise a layer kernel's phase trace (a -Dphase_trace=true build; kernels/gdn_phase_trace.cuh).

    GDN_PHASE_TRACE_DIR=DIR gdn-bench --engine --bucket 64 --tokens 1 ...   # writes DIR/{layer,mixer,ring_stream}.bin
    scripts/phase_trace.py DIR/mixer.bin

ring_stream.bin is the ring's streamed kernel (kernels/gdn_cuda_ring_decode.cu), whose slots mean
other things: issued / waited / inputs are its first producer's (the first stages' copies issued,
past the wait, the first item's tokens issued), conv is consumer thread 0's first stage landed,
prepared its tokens prepared, set 0 its first item done.

The records are the last launch's of each CTA index (numpy only). For each pair of consecutive
phases that every CTA recorded: the mean, 10th, 50th and 90th percentile time between them in ns
(clock64 scaled by each CTA's own clock rate over its %globaltimer span); then the kernel's span, when
CTAs started, and how many were resident on an SM on average.
"""
import sys

import numpy as np

RECORD = 16
NAMES = ["start", "issued", "waited", "inputs", "conv", "prepared", "set 0", "set 1", "set 2", "set 3+",
         "norm", "end"]
START_NS, END_NS, SM = 12, 13, 14


def main(path):
    records = np.fromfile(path, dtype=np.uint64).reshape(-1, RECORD)
    ctas = int(records[0, SM] >> 32)
    if ctas == 0:
        print(f"{path}: no traced launch")
        return 1
    r = records[:ctas].astype(np.int64)
    clocks = r[:, :len(NAMES)]
    done = (clocks[:, 0] > 0) & (clocks[:, NAMES.index("end")] > 0)
    r, clocks = r[done], clocks[done]
    span_ns = r[:, END_NS] - r[:, START_NS]
    ghz = (clocks[:, -1] - clocks[:, 0]) / np.maximum(span_ns, 1)
    print(f"{path}: {ctas} CTAs ({done.sum()} complete); a CTA {span_ns.mean():.0f} ns on average, "
          f"clock {np.median(ghz):.2f} GHz (median)")
    phases = [k for k in range(len(NAMES)) if (clocks[:, k] > 0).all()]
    for a, b in zip(phases, phases[1:]):
        d = (clocks[:, b] - clocks[:, a]) / ghz
        p10, p50, p90 = np.percentile(d, [10, 50, 90])
        print(f"  {NAMES[a]:>8} -> {NAMES[b]:<8} mean {d.mean():7.0f}  p10 {p10:7.0f}  p50 {p50:7.0f}  p90 {p90:7.0f}")
    t0 = r[:, START_NS].min()
    starts, ends = (r[:, START_NS] - t0) / 1e3, (r[:, END_NS] - t0) / 1e3
    sms = len(np.unique(r[:, SM] & 0xFFFFFFFF))
    grid = np.linspace(0, ends.max(), 400, endpoint=False)
    resident = np.mean([((starts <= g) & (ends > g)).sum() for g in grid]) / sms
    q = np.percentile(starts, [25, 50, 75, 100])
    print(f"  kernel span {ends.max():.2f} us on {sms} SMs; CTA starts at 25/50/75/100%: "
          + " / ".join(f"{x:.2f}" for x in q) + f" us; {resident:.2f} CTAs resident an SM on average")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
