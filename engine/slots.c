/* Slot allocator and step-row checks: see slots.h. */
#include "slots.h"

#include <string.h>

#include "alloc.h"

gdn_status gdn__slots_init(gdn__slot_table *table, int32_t num_slots)
{
    memset(table, 0, sizeof *table);
    table->num_slots = num_slots;
    table->allocated = gdn__calloc((size_t)num_slots, sizeof *table->allocated);
    table->free_stack = gdn__calloc((size_t)num_slots, sizeof *table->free_stack);
    table->read_mark = gdn__calloc((size_t)num_slots, sizeof *table->read_mark);
    table->write_mark = gdn__calloc((size_t)num_slots, sizeof *table->write_mark);
    table->read_row = gdn__calloc((size_t)num_slots, sizeof *table->read_row);
    if (!table->allocated || !table->free_stack || !table->read_mark || !table->write_mark || !table->read_row) {
        gdn__slots_release(table);
        return GDN_ENOMEM;
    }
    /* Fill so that a fresh table hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < num_slots; i++) table->free_stack[i] = num_slots - 1 - i;
    table->free_count = num_slots;
    return GDN_OK;
}

void gdn__slots_release(gdn__slot_table *table)
{
    gdn__free(table->allocated);
    gdn__free(table->free_stack);
    gdn__free(table->read_mark);
    gdn__free(table->write_mark);
    gdn__free(table->read_row);
    memset(table, 0, sizeof *table);
}

gdn_status gdn__slots_alloc(gdn__slot_table *table, int32_t *slot)
{
    if (table->free_count == 0) return GDN_ESLOT_EXHAUSTED;
    const int32_t s = table->free_stack[--table->free_count];
    table->allocated[s] = 1;
    *slot = s;
    return GDN_OK;
}

gdn_status gdn__slots_check_live(const gdn__slot_table *table, int32_t slot)
{
    if (slot < 0) return GDN_EINVAL;
    if (slot >= table->num_slots) return GDN_ESLOT_RANGE;
    if (!table->allocated[slot]) return GDN_ESLOT_FREE;
    return GDN_OK;
}

gdn_status gdn__slots_free(gdn__slot_table *table, int32_t slot)
{
    gdn_status status = gdn__slots_check_live(table, slot);
    if (status != GDN_OK) return status;
    table->allocated[slot] = 0;
    table->free_stack[table->free_count++] = slot;
    return GDN_OK;
}

/* A new stamp invalidates every mark at once; on wrap-around the marks are cleared for real. */
static void next_stamp(gdn__slot_table *table)
{
    if (++table->stamp == 0) {
        memset(table->read_mark, 0, (size_t)table->num_slots * sizeof *table->read_mark);
        memset(table->write_mark, 0, (size_t)table->num_slots * sizeof *table->write_mark);
        table->stamp = 1;
    }
}

static gdn_status check_range_and_live(const gdn__slot_table *table, int32_t slot)
{
    if (slot >= table->num_slots) return GDN_ESLOT_RANGE;
    if (!table->allocated[slot]) return GDN_ESLOT_FREE;
    return GDN_OK;
}

gdn_status gdn__slots_check_step(gdn__slot_table *table, int32_t batch, const int32_t *read_slots,
                                 const int32_t *write_slots)
{
    gdn_status status;
    next_stamp(table);
    for (int32_t i = 0; i < batch; i++) {
        const int32_t r = read_slots[i];
        if (r < 0) continue;
        if ((status = check_range_and_live(table, r)) != GDN_OK) return status;
        if (table->read_mark[r] == table->stamp) return GDN_ESLOT_DUP;
        table->read_mark[r] = table->stamp;
        table->read_row[r] = i;
    }
    for (int32_t i = 0; i < batch; i++) {
        if (read_slots[i] < 0) continue;
        const int32_t w = write_slots ? write_slots[i] : read_slots[i];
        if (w < 0) return GDN_EINVAL; /* a live row must write somewhere */
        if ((status = check_range_and_live(table, w)) != GDN_OK) return status;
        if (table->write_mark[w] == table->stamp) return GDN_ESLOT_DUP;
        /* Writing a slot that another row reads would race with that row's read. */
        if (table->read_mark[w] == table->stamp && table->read_row[w] != i) return GDN_ESLOT_DUP;
        table->write_mark[w] = table->stamp;
    }
    return GDN_OK;
}
