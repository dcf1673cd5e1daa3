#!/usr/bin/env python3
"""Writes the hand-made seeds of tests/fuzz_corpus/ (seed-*): byte strings in the format that
tests/fuzz_driver.c decodes (setup(), then one operation per byte of the op loop). Run it from
anywhere: python3 tests/fuzz_corpus/gen_seeds.py. The replay suite skips this file and README.md;
libFuzzer's own finds (crash-*, and anything else) are added as they are."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE, FOLD, AUTO, RING = 0, 1, 2, 3

# op codes (the op byte % 16)
ALLOC, FREE, RESET, STEP, BEGIN, RUN_LAYER, RUN_STEP, COMMIT = 0, 1, 2, 3, 4, 5, 6, 7
READ, WRITE, COPY, IMPORT, EXPORT, CALLER_STEP, MISC = 8, 9, 10, 11, 12, 13, 14


def header(layers=1, hk=1, hv_double=False, k128=False, v128=False, bf16_state=False, f16_in=False,
           f32_out=False, no_l2=False, slots=4, batch=4, tokens=4, strategy=CACHE, ring=0,
           graph=0, pool=0, views=0, callback=False, cb_commit=False, deep=False, skip_inputs=False,
           seed=0x1234, gate=0, invalid=None, fail_alloc=None):
    # setup(): layers_of / hk_of / hv_of tables indexed by byte % 8; K, V 128 at bits 3-4 / 5-6 == 3
    geo = {(1, False): 0, (1, True): 4, (2, False): 5, (2, True): 6}[(hk, hv_double)]
    geo |= (24 if k128 else 0) | (96 if v128 else 0)
    b_layers = {1: 0, 2: 4, 3: 7}[layers]
    d = (1 if bf16_state else 0) | (2 if f16_in else 0) | (4 if f32_out else 0) | (8 if no_l2 else 0)
    b_batch = 7 if batch == 16 else batch - 1
    b_tok = (15 if tokens == 16 else tokens - 1) | (gate << 4)
    ring_bits = {0: 0, 4: 1}.get(ring, 3)
    b_strat = strategy | (ring_bits << 2) | (((ring - 4) % 29) << 4 if ring_bits == 3 else 0)
    # setup(): graph = b % 3, pool = (b >> 2) % 3, views = (b >> 4) % 4
    b_modes = next(b for b in range(256) if (b % 3, (b >> 2) % 3, (b >> 4) % 4) == (graph, pool, views))
    b_flags = (3 if callback else 0) | (4 if cb_commit else 0) | (0x18 if deep else 0) | (0x40 if skip_inputs else 0)
    b_flags |= 0x80 if fail_alloc is not None else 0
    b_inv = 200 if invalid is None else 20
    out = [b_layers, geo, d, slots - 1, b_batch, b_tok, b_strat, 1, b_modes, b_flags, b_inv,
           seed & 0xff, seed >> 8 & 0xff, seed >> 16 & 0xff, seed >> 24 & 0xff]
    if pool == 2:
        out += [1, 0, 1]  # slot pad, layer stride given, its pad
    if pool:
        out += [1]  # pool offset 16 bytes
    if views == 2:
        out += [1, 1, 1, 1] * 6 * layers
    elif views == 3:
        out += ([1, 1] + [1, 1, 1, 1]) * layers
    if invalid is not None:
        out += list(invalid)  # (field, value)
    if fail_alloc is not None:
        out += [fail_alloc]  # the creation's host allocation that fails (ENOMEM), then a normal creation
    return out


def params(layers):
    return [1] * layers  # every layer gets random A_log, dt_bias


def live(k):
    return k << 3  # pick_slot: the k-th live slot


def rows_live(ks):
    return [len(ks)] + [(k << 4) for k in ks]  # build_rows: batch, then each row "an unused live slot"


def step(verify, T, ks, writes=None, how=0, accepted=None, batch_cap=4):
    """op_step: kind/T byte, rows, write mode, m byte, how byte, accepted bytes."""
    k = (1 | ((T - 1) << 1)) if verify else 0
    out = [STEP, k] + rows_live(ks)
    if writes is None:
        out += [0]
    else:
        out += [2] + writes
    out += [0, how]
    if verify and (how >> 6) != 3:
        acc = accepted or [T] * batch_cap
        out += acc[:batch_cap] + [0] * (batch_cap - len(acc))
    return out


def write(name, data):
    with open(os.path.join(HERE, name), 'wb') as f:
        f.write(bytes(data))


def main():
    # Every strategy: admit, decode, verify + commit (partial acceptance), reads, retire, reuse.
    for name, strat, extra in (('cache', CACHE, {}), ('fold', FOLD, {}), ('ring', RING, {'ring': 4}),
                               ('auto16', AUTO, {'batch': 16, 'slots': 6})):
        cap = extra.get('batch', 4)
        h = header(strategy=strat, **extra)
        ops = [ALLOC, ALLOC, ALLOC, RESET, live(1)]
        ops += step(False, 1, [0, 1, 2], how=1)
        ops += step(True, 3, [2, 0], how=2, accepted=[2, 0, 3, 1], batch_cap=cap)
        ops += step(False, 1, [1, 2], how=0)
        ops += [READ, 0, live(0), 0, READ, 1, live(2), 0]
        ops += step(True, 4, [0, 1, 2], how=1, accepted=[4, 1, 9, 2], batch_cap=cap)
        ops += [FREE, live(1), ALLOC, WRITE, 1, live(1), 0]
        ops += step(False, 1, [1, 0], how=0)
        write('seed-%s' % name, h + params(2) + ops)
    # Mid-step calls: a verify begun and run, a state read, then commit and a read (ring, cache, fold).
    for name, strat in (('ring', RING), ('cache', CACHE), ('fold', FOLD)):
        h = header(strategy=strat, layers=1, slots=2, batch=2, tokens=4)
        ops = [ALLOC, ALLOC]
        ops += step(False, 1, [0, 1], how=1)
        ops += [BEGIN, 1 | (3 << 1)] + rows_live([0]) + [0]  # verify T=4, no write slots
        ops += [RUN_STEP, READ, 0, live(0), 0, FREE, live(0), RESET, live(0)]
        ops += [COMMIT, 1, 2, 2, READ, 0, live(0), 0]
        write('seed-midstep-%s' % name, h + params(1) + ops)
    # Forks (write slot != read slot) in decode and verify, then copy / import / export.
    h = header(strategy=FOLD, slots=6, batch=4, tokens=3)
    ops = [ALLOC] * 5
    ops += step(False, 1, [0, 1], writes=[0 << 2, 1], how=1)
    ops += step(True, 2, [2, 1], writes=[0 << 2, 0], how=0, accepted=[0, 2, 0, 0])
    ops += [COPY, live(3), live(0), IMPORT, live(4), 4, EXPORT, live(0), 8, EXPORT, live(1), 1]
    ops += step(True, 3, [0, 1, 3, 4], how=2, accepted=[1, 2, 3, 0])
    write('seed-forks', h + params(2) + ops)
    # Caller-owned work (GDN_STEP_CALLER_WORK), ring.
    h = header(strategy=RING, ring=5, slots=3, batch=2, tokens=2)
    ops = [ALLOC, ALLOC, CALLER_STEP, 0] + rows_live([0, 1]) + [0, 7]
    ops += [CALLER_STEP, 1 | (1 << 1)] + rows_live([1, 0]) + [0, 7, 2, 1]
    ops += [MISC, 2, 0, MISC, 3, CALLER_STEP, 1] + rows_live([]) + [0, 0, 1, 1]
    write('seed-caller-work', h + params(2) + ops)
    # The capture callback (CPU: run_step calls it), committing inside, three layers.
    h = header(layers=3, strategy=CACHE, callback=True, cb_commit=True, slots=3, batch=2, tokens=3)
    ops = [ALLOC, ALLOC] + step(True, 3, [0, 1], how=0, accepted=[1, 3]) + [COMMIT, 0]
    ops += step(False, 1, [1], how=0)
    write('seed-callback', h + params(3) + ops)
    # Caller-owned pool (strided) and views (strided, fused), bf16 state, f16 inputs, f32 outputs.
    h = header(strategy=RING, ring=4, pool=2, views=2, bf16_state=True, f16_in=True, f32_out=True,
               slots=3, batch=3, tokens=3, layers=2)
    ops = [ALLOC, ALLOC] + step(False, 1, [0, 1], how=1) + step(True, 3, [1, 0], how=0, accepted=[3, 1, 0])
    write('seed-caller-memory', h + params(2) + ops + [MISC, 11])
    h = header(strategy=CACHE, pool=1, views=3, no_l2=True, slots=2, batch=2, tokens=2, layers=1, gate=7)
    ops = [ALLOC, ALLOC] + step(True, 2, [0, 1], how=0, accepted=[1, 2]) + step(False, 1, [1], how=0)
    write('seed-fused-views', h + params(1) + ops)
    # Refusals: bad rows, busy slots, misuse, NULLs, with deep (read-back) checks.
    h = header(strategy=FOLD, deep=True, slots=3, batch=2, tokens=2)
    ops = [ALLOC, ALLOC, BEGIN, 3] + rows_live([0]) + [0]
    ops += [FREE, live(0), RESET, live(0), COPY, live(1), live(0), COMMIT, 0, RUN_LAYER, 0, RUN_LAYER, 0]
    ops += [RUN_LAYER, 15, RUN_STEP, COMMIT, 0, MISC, 0, MISC, 1, MISC, 5]
    ops += [STEP, 0, 2, 8 << 4 | 8, 0, 0, 0]  # a duplicate row
    ops += [FREE, 7, FREE, 6, READ, 0, 5, 0, WRITE, 0, live(0), 31, IMPORT, live(0), 2, EXPORT, live(1), 1]
    write('seed-refusals', h + params(2) + ops)
    # Host allocation n of gdn_engine_create fails (fault injection): ENOMEM, nothing leaked, then a
    # normal engine runs a few steps.
    for name, strat, n in (('cache', CACHE, 0), ('fold', FOLD, 6), ('ring', RING, 11), ('views', CACHE, 9)):
        h = header(strategy=strat, fail_alloc=n, views=2 if name == 'views' else 0, slots=2, batch=2, tokens=2)
        ops = [ALLOC, ALLOC] + step(True, 2, [0, 1], how=0, accepted=[1, 2], batch_cap=2) + step(False, 1, [1], how=0)
        write('seed-enomem-%s' % name, h + params(1) + ops)
    # Invalid configurations, one field each (corrupt(): field % 19, value).
    for field in range(19):
        write('seed-invalid-%02d' % field, header(invalid=(field, 1), pool=2 if field == 17 else 0,
                                                  views=2 if field == 18 else 0))


if __name__ == '__main__':
    main()
