/* handles.h -- tables of user handles (communicators, works, batches): a
 * handle is a slot's index and generation, never a pointer, so a stale
 * handle (destroyed, released, freed) is an error and never touches memory,
 * and a table's memory is bounded by the most objects alive at once.
 *
 * A handle is (generation << 27) | (index << 3) | tag: the tag (1..7) names
 * the table (a handle of one kind passed as another is "not a ... handle"),
 * the index (24 bits) a slot, the generation (37 bits) the slot's life. A
 * slot's generation is odd while its object is live and even once it is
 * closed; closing bumps it, so every handle of the closed life is stale, also
 * once the slot holds a new object. Slots live in chunks allocated once and
 * never moved or freed (a slot's address stays valid while another thread
 * grows the table); each slot keeps the object it was given (the struct is
 * reused by the slot's next life), and a closed slot goes back on a free list
 * only when its owner says so (a communicator's once no work refers to it). */
#ifndef TC_HANDLES_H
#define TC_HANDLES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "internal.h"

_Static_assert(sizeof(uintptr_t) >= 8, "handles need 64-bit pointers");

#define TC__HANDLE_COMM 1u
#define TC__HANDLE_WORK 2u
#define TC__HANDLE_BATCH 4u
#define TC__HANDLE_WINDOW 3u

#define TC__HANDLE_CHUNK 1024u
#define TC__HANDLE_CHUNKS 16384u /* 16M slots: the 24-bit index */

typedef struct tc__hslot {
  void *obj;                /* the struct this slot holds, kept across lives */
  _Atomic uint64_t gen;     /* odd: live; even: closed (or never used) */
  uint32_t next_free;
} tc__hslot_t;

typedef struct tc__htable {
  pthread_mutex_t mu; /* taking and returning slots */
  uint32_t tag;
  uint32_t used;      /* slots ever handed out */
  uint32_t free_head; /* free list of closed slots, UINT32_MAX: empty */
  _Atomic(tc__hslot_t *) chunks[TC__HANDLE_CHUNKS];
} tc__htable_t;

#define TC__HTABLE_INIT(t) \
  {.mu = PTHREAD_MUTEX_INITIALIZER, .tag = (t), .used = 0, .free_head = UINT32_MAX}

/* Takes a free slot (a returned one first): its index, and the object it
 * kept from an earlier life (NULL for a new slot: store one with
 * tc__htable_set). -1 when the table is full or out of memory. */
TC_INTERNAL int tc__htable_take(tc__htable_t *t, uint32_t *idx, void **obj);
TC_INTERNAL void tc__htable_set(tc__htable_t *t, uint32_t idx, void *obj);
/* Starts the slot's next life (it must be closed) and returns its handle. */
TC_INTERNAL uintptr_t tc__htable_open(tc__htable_t *t, uint32_t idx);
/* The object of a live handle h; NULL otherwise, with *stale = 1 when h was
 * a handle of this table whose life ended, 0 when h never was one. */
TC_INTERNAL void *tc__htable_get(tc__htable_t *t, const void *h, int *stale);
/* Ends the life of h: 1 when this call ended it, 0 when h was not live. */
TC_INTERNAL int tc__htable_close(tc__htable_t *t, const void *h);
/* Ends the slot's current life, whatever its handle (no-op when closed). */
TC_INTERNAL void tc__htable_close_slot(tc__htable_t *t, uint32_t idx);
/* Returns a closed slot to the free list (its object is kept for reuse). */
TC_INTERNAL void tc__htable_put(tc__htable_t *t, uint32_t idx);
/* The object of slot idx while it is live (its generation odd), else NULL. */
TC_INTERNAL void *tc__htable_live(tc__htable_t *t, uint32_t idx);
/* Slots ever handed out (for tests of boundedness). */
TC_INTERNAL uint32_t tc__htable_used(tc__htable_t *t);

#endif
