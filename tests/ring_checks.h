/*
 * Directed checks of the ring verify strategy on a given backend (Criterion assertions), shared by the
 * CPU suite (test_ring.c) and the GPU suite (test_gpu_fold.c). Each makes its own small tiny-preset
 * engine (2 layers) with GDN_VERIFY_RING, fp32 outputs, and runs both state dtypes unless it says so.
 */
#ifndef GDN_TESTS_RING_CHECKS_H
#define GDN_TESTS_RING_CHECKS_H

#include "gdn/gdn.h"

/* A decode writes back when its ring would hold ring_length records (not one earlier), a verify when
 * h + T > C (not at h + T == C), with C = max(ring_length, max_tokens). */
void ring_check_write_back_points_are_exact(gdn_backend_kind backend);

/* A read in the middle of a ring returns the current state and writes it back into that layer's pool
 * only (the other layer keeps its ring); a second read returns the same bytes. */
void ring_check_a_read_in_the_middle_of_a_ring_returns_the_current_state(gdn_backend_kind backend);

/* gdn_slot_write_state in the middle of a ring replaces the state and empties that layer's ring only. */
void ring_check_a_write_in_the_middle_of_a_ring_replaces_it(gdn_backend_kind backend);

/* gdn_slot_reset with records zeroes pool and ring; a freed slot's next owner, its state written
 * straight into the pool, never sees the last owner's records (read first, or stepped first). fp32. */
void ring_check_reset_and_free_in_the_middle_of_a_ring(gdn_backend_kind backend);

/* A verify with h + T > C: outputs, the state before its tokens written back, and the states after a
 * commit of 0..T tokens or none (uncommitted, dropped by the next begin), then further steps. */
void ring_check_a_verify_that_does_not_fit_writes_back_first(gdn_backend_kind backend);

/* Forks (write slot != read slot) of decodes and verifies (accepted 0 included) into slots freed with
 * records; the read slot keeps its ring. */
void ring_check_forks_write_back_into_the_new_slot(gdn_backend_kind backend);

/* Slots outside the step, rows that append to their rings, padding rows and an uncommitted verify:
 * pools untouched bit for bit, padding outputs zero, rings intact. */
void ring_check_slots_outside_the_step_and_padding_rows_are_bit_exact(gdn_backend_kind backend);

/* Decode steps of at most ring_write_through rows write every row back after applying its records
 * and empty its ring; larger ones append (explicit counts, the default, -1). */
void ring_check_small_decodes_write_through(gdn_backend_kind backend);

#endif /* GDN_TESTS_RING_CHECKS_H */
