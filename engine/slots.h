/*
 * Host-side slot bookkeeping: which pool rows are live, and the checks a step's rows must pass. All
 * memory is allocated at creation; allocation, free and step checks are O(1) per slot or row.
 */
#ifndef GDN_ENGINE_SLOTS_H
#define GDN_ENGINE_SLOTS_H

#include "gdn/gdn.h"

typedef struct gdn__slot_table {
    int32_t num_slots;
    uint8_t *allocated;   /* [num_slots] */
    int32_t *free_stack;  /* [num_slots]: free slots, the next one to hand out on top */
    int32_t free_count;
    /* Step checks: a slot is marked for this step when its mark equals `stamp`. */
    uint32_t *read_mark;  /* [num_slots] */
    uint32_t *write_mark; /* [num_slots] */
    int32_t *read_row;    /* [num_slots]: the row that reads the slot */
    uint32_t stamp;
} gdn__slot_table;

gdn_status gdn__slots_init(gdn__slot_table *table, int32_t num_slots);
void gdn__slots_release(gdn__slot_table *table);

gdn_status gdn__slots_alloc(gdn__slot_table *table, int32_t *slot);
gdn_status gdn__slots_free(gdn__slot_table *table, int32_t slot);
/* GDN_OK for an allocated slot, else GDN_ESLOT_RANGE or GDN_ESLOT_FREE (negative: GDN_EINVAL). */
gdn_status gdn__slots_check_live(const gdn__slot_table *table, int32_t slot);

/*
 * Checks the rows of a step: read slots < 0 are padding rows (their write slot is ignored); every
 * other read and write slot must be < num_slots (GDN_ESLOT_RANGE) and allocated (GDN_ESLOT_FREE); a
 * live row's write slot must not be negative (GDN_EINVAL); no slot may be read by two rows, written
 * by two rows, or written by one row and read by another (GDN_ESLOT_DUP). Changes no allocation.
 */
gdn_status gdn__slots_check_step(gdn__slot_table *table, int32_t batch, const int32_t *read_slots,
                                 const int32_t *write_slots);

#endif /* GDN_ENGINE_SLOTS_H */
