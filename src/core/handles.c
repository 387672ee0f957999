/* handles.c -- the handle tables (see handles.h). */
#include "handles.h"

#include <stdlib.h>

#define TC__GEN_BITS 37u
#define TC__GEN_MASK ((UINT64_C(1) << TC__GEN_BITS) - 1u)
#define TC__IDX_MASK ((UINT64_C(1) << 24) - 1u)

static tc__hslot_t *slot_at(tc__htable_t *t, uint64_t idx) {
  if (idx / TC__HANDLE_CHUNK >= TC__HANDLE_CHUNKS) return NULL;
  tc__hslot_t *ch = atomic_load(&t->chunks[idx / TC__HANDLE_CHUNK]);
  return ch ? &ch[idx % TC__HANDLE_CHUNK] : NULL;
}

int tc__htable_take(tc__htable_t *t, uint32_t *idx, void **obj) {
  pthread_mutex_lock(&t->mu);
  tc__hslot_t *s = NULL;
  uint32_t i = t->free_head;
  if (i != UINT32_MAX) {
    s = slot_at(t, i);
    t->free_head = s->next_free;
  } else if (t->used / TC__HANDLE_CHUNK < TC__HANDLE_CHUNKS) {
    i = t->used;
    uint32_t k = i / TC__HANDLE_CHUNK;
    if (!atomic_load(&t->chunks[k])) {
      tc__hslot_t *ch = calloc(TC__HANDLE_CHUNK, sizeof *ch);
      if (ch) atomic_store(&t->chunks[k], ch);
    }
    s = slot_at(t, i);
    if (s) t->used++;
  }
  pthread_mutex_unlock(&t->mu);
  if (!s) return -1;
  s->next_free = UINT32_MAX;
  *idx = i;
  *obj = s->obj;
  return 0;
}

void tc__htable_set(tc__htable_t *t, uint32_t idx, void *obj) {
  slot_at(t, idx)->obj = obj;
}

uintptr_t tc__htable_open(tc__htable_t *t, uint32_t idx) {
  tc__hslot_t *s = slot_at(t, idx);
  uint64_t gen = atomic_load(&s->gen) + 1u; /* even (closed) -> odd (live) */
  atomic_store(&s->gen, gen);
  return (uintptr_t)(((gen & TC__GEN_MASK) << 27) | ((uint64_t)idx << 3) | t->tag);
}

/* The slot named by h and the generation h carries, or NULL. */
static tc__hslot_t *slot_of(tc__htable_t *t, const void *h, uint64_t *gen) {
  uint64_t v = (uint64_t)(uintptr_t)h;
  if ((v & 7u) != t->tag) return NULL;
  *gen = v >> 27;
  return slot_at(t, (v >> 3) & TC__IDX_MASK);
}

void *tc__htable_get(tc__htable_t *t, const void *h, int *stale) {
  uint64_t hg = 0;
  tc__hslot_t *s = slot_of(t, h, &hg);
  *stale = 0;
  if (!s || !(hg & 1u)) return NULL;
  uint64_t g = atomic_load(&s->gen) & TC__GEN_MASK;
  if (g == hg) return s->obj;
  *stale = hg < g; /* a generation the slot had; a later one never existed */
  return NULL;
}

int tc__htable_close(tc__htable_t *t, const void *h) {
  uint64_t hg = 0;
  tc__hslot_t *s = slot_of(t, h, &hg);
  if (!s || !(hg & 1u)) return 0;
  uint64_t g = atomic_load(&s->gen);
  if ((g & TC__GEN_MASK) != hg) return 0;
  /* one winner when two threads close the same handle */
  return atomic_compare_exchange_strong(&s->gen, &g, g + 1u);
}

void tc__htable_close_slot(tc__htable_t *t, uint32_t idx) {
  tc__hslot_t *s = slot_at(t, idx);
  uint64_t g = atomic_load(&s->gen);
  while ((g & 1u) && !atomic_compare_exchange_weak(&s->gen, &g, g + 1u)) {
  }
}

void tc__htable_put(tc__htable_t *t, uint32_t idx) {
  tc__hslot_t *s = slot_at(t, idx);
  pthread_mutex_lock(&t->mu);
  s->next_free = t->free_head;
  t->free_head = idx;
  pthread_mutex_unlock(&t->mu);
}

uint32_t tc__htable_used(tc__htable_t *t) {
  pthread_mutex_lock(&t->mu);
  uint32_t n = t->used;
  pthread_mutex_unlock(&t->mu);
  return n;
}

void *tc__htable_live(tc__htable_t *t, uint32_t idx) {
  tc__hslot_t *s = slot_at(t, idx);
  return s && (atomic_load(&s->gen) & 1) ? s->obj : NULL;
}
