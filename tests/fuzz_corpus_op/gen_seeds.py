#!/usr/bin/env python3
"""Writes the seeds of tests/fuzz_corpus_op/ (seed-*, and the first three crash-* inputs): byte strings in the format that
tests/fuzz_op_driver.c decodes (setup(): five header bytes, a scale byte when asked for, three seed
bytes; then one operation per op byte, each reading its own bytes). Run it from anywhere:
python3 tests/fuzz_corpus_op/gen_seeds.py. The replay suite skips this file and README files;
libFuzzer's finds (crash-*, and anything else) are added as they are."""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE, FOLD, RING = 0, 1, 2


def header(hk=1, hv_double=False, k128=False, v128=False, no_l2=False, bf16_state=False, f16_in=False,
           f32_out=False, strategy=CACHE, no_flag=False, slots=4, batch=3, tokens=4, ring=0, stride_pad=0,
           gate=0, scale=None, seed=0x1234):
    g = (hk - 1) | (2 if hv_double else 0) | (12 if k128 else 0) | (48 if v128 else 0) | (192 if no_l2 else 0)
    d = (1 if bf16_state else 0) | (2 if f16_in else 0) | (4 if f32_out else 0) | (strategy << 3) | (96 if no_flag else 0)
    sb = (slots - 2) + 6 * (batch - 1)
    tb = (tokens - 1) + 5 * {0: 0, 4: 1, 6: 2, 8: 3}[ring]
    lb = stride_pad | (gate << 2) | (16 if scale is not None else 0)
    out = [g, d, sb, tb, lb]
    if scale is not None:
        out.append(scale)
    return out + [seed & 0xff, seed >> 8 & 0xff, seed >> 16 & 0xff]


def dense_views(n):
    return [0, 0] * n  # make_view: mode 0 (dense), lead pad 0


def decode_row_live(slot):
    return 5 + 10 * slot  # plan_rows: t % 10 >= 5 is a live row, from the slot t / 10


def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(bytes(data))


def main():
    rng = random.Random(17)
    # Every strategy x state dtype, with random operations after the header.
    for strategy, sname in ((CACHE, "cache"), (FOLD, "fold"), (RING, "ring")):
        for bf16 in (False, True):
            for variant in range(3):
                h = header(hk=1 + variant % 2, hv_double=variant == 2, bf16_state=bf16, f16_in=variant == 1,
                           f32_out=variant == 2, strategy=strategy, slots=3 + variant, batch=2 + variant,
                           tokens=2 + variant, ring=(4, 6, 0)[variant], stride_pad=variant, gate=variant,
                           seed=rng.randrange(1 << 24))
                body = [rng.randrange(256) for _ in range(360)]
                write("seed-%s-%s-%d" % (sname, "bf16" if bf16 else "f32", variant), h + body)
    # Larger heads, no l2 norm, a custom scale, no error flag.
    write("seed-k128", header(k128=True, strategy=FOLD, batch=2, tokens=2) + [rng.randrange(256) for _ in range(200)])
    write("seed-v128-ring", header(v128=True, strategy=RING, ring=4, batch=2, tokens=3) + [rng.randrange(256) for _ in range(200)])
    write("seed-no-l2", header(no_l2=True, scale=7, no_flag=True, strategy=CACHE) + [rng.randrange(256) for _ in range(300)])
    # A verify of 3 tokens on slot 1, then its commit accepting all of them, then an export (cache).
    h = header(strategy=CACHE, slots=4, batch=1, tokens=3)
    verify = [0, 1 + 2 * 2, 1, decode_row_live(1), 0x55] + dense_views(6) + [1, 0]  # (0: no commit at once)
    commit = [4, 1, 1]  # accepted[0] = T (values[1]), no change
    export = [11, 1, 1, 1]  # slot 1, step fields as they are, no change
    write("seed-verify-commit-export", h + verify + commit + export)
    # Known library bugs (tests/fuzz_op_driver.c, known_bug[]): the smallest input that shows each.
    # A decode whose only row reads slot 0 and writes slot -1 (cache strategy: the pool at slot -1).
    h = header(strategy=CACHE, slots=4, batch=1, tokens=1)
    write("crash-negative-write-slot", h + [0, 0, 1, 3, 0x55] + dense_views(6) + [1])
    # gdn_op_slot_import(op, 0, NULL): documented GDN_EINVAL, resets the slot.
    write("crash-import-null", h + [9, 0, 1, 0, 46, 0])
    # Fold: a verify of one row whose k view has a negative head stride (HK 2: head 1 lies before
    # head 0); storing the token wraps the offset through size_t (UBSan: pointer overflow).
    h = header(hk=2, strategy=FOLD, slots=4, batch=1, tokens=1)
    k_reversed = [3, 0, 4, 0]  # make_view: strided (mode 3), no pads, head dimension reversed, lead 0
    write("crash-negative-stride-store", h + [0, 1, 1, decode_row_live(0), 0x55, 0, 0] + k_reversed +
          dense_views(4) + [1, 0])


if __name__ == "__main__":
    main()
