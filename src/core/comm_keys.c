/* comm_keys.c -- the store keys of a communicator's creation.
 *
 * Scoping. Every key a communicator (and its backend) writes lives under
 *
 *     tc/<job>/<attempt>/<name>/<n>/...          (tc_comm_create)
 *     tc/split/<parent prefix hash>/<seq>/<group hash>/...   (split)
 *
 * <job> is TORCHCOMMS_JOB_ID, else TORCHELASTIC_RUN_ID (torchrun, tcrun),
 * else "-"; <attempt> is TORCHELASTIC_RESTART_COUNT (torchrun's restart
 * number), else 0; <n> counts the communicators of that name this process
 * created (ranks of one communicator created at once by threads of one
 * process share it: name_generation in comm.c). A restarted attempt therefore never reads the keys of an earlier
 * attempt, whatever that attempt left behind. Split prefixes hash the
 * parent's, so they inherit its scope.
 *
 * Stale keys. Before anything else every rank adds 1 to "<prefix>/arrivals"
 * and gets its arrival ticket. On a store used by nobody before, the
 * tickets are 1..size. A ticket above the size means the prefix was used
 * before (a second job on the same store with the same job id and attempt
 * whose creation died half-way): the rank fails at once with an error that
 * says so, instead of reading another job's token and addresses and waiting
 * the whole timeout for connections that cannot succeed.
 *
 * Deletion. While the backend's init runs on the calling thread, every key
 * it sets or adds to through the host's store functions is recorded. The
 * backend's init returns only once every rank has finished its setup (the
 * cpu backend ends with an all-to-all), so every key has been read by
 * everyone who needs it: each rank then deletes the keys it wrote itself
 * (and the arrival counter). Nothing of a completed creation stays in the
 * store, so a later job or attempt on the same store starts clean. */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The keys recorded during one creation (the caller's thread only): those
 * set on the communicator's prefixed store and on any store the backend
 * made from it for the same creation (the cpu backend's hierarchy prefixes
 * it again for its groups); each with its store, retained. */
typedef struct tc__keylog {
  tc_store_t *store; /* the communicator's prefixed store */
  char **keys;
  tc_store_t **stores;
  size_t n, cap;
} keylog_t;

static _Thread_local keylog_t *key_recording;

static void keylog_add(tc_store_t *s, const char *key) {
  keylog_t *l = key_recording;
  for (size_t i = 0; i < l->n; i++)
    if (l->stores[i] == s && !strcmp(l->keys[i], key)) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    char **k = realloc(l->keys, cap * sizeof *k);
    if (k) l->keys = k;
    tc_store_t **st = k ? realloc(l->stores, cap * sizeof *st) : NULL;
    if (st) l->stores = st;
    if (!k || !st) return; /* not deleted later: harmless, only untidy */
    l->cap = cap;
  }
  char *copy = strdup(key);
  if (!copy) return;
  tc_store_retain(s);
  l->stores[l->n] = s;
  l->keys[l->n++] = copy;
}

/* The host's store functions (tc__host in work.c): the public ones, plus
 * recording of what a creation writes. */
int tc__host_store_set(tc_store_t *s, const char *key, const void *v, size_t len) {
  int rc = tc_store_set(s, key, v, len);
  if (rc == TC_OK && key_recording) keylog_add(s, key);
  return rc;
}

int tc__host_store_add(tc_store_t *s, const char *key, int64_t delta, int64_t *result) {
  int rc = tc_store_add(s, key, delta, result);
  if (rc == TC_OK && key_recording) keylog_add(s, key);
  return rc;
}

/* Writes a store-safe form of v (at most 64 characters of [A-Za-z0-9._-],
 * others as '_') into out. */
static void key_part(char *out, size_t len, const char *v) {
  size_t i = 0;
  for (; v[i] && i + 1 < len && i < 64; i++) {
    char ch = v[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    out[i] = ok ? ch : '_';
  }
  out[i] = 0;
}

/* The job id and the attempt the keys are scoped by ("-" and "0" if unset). */
static void key_scope(const char **job, const char **attempt) {
  *job = tc__setting_str(TC_SET_JOB_ID);
  if (!*job) *job = tc__env_str("TORCHELASTIC_RUN_ID");
  if (!*job) *job = "-";
  *attempt = tc__setting_str(TC_SET_RESTART_COUNT);
  if (!*attempt) *attempt = "0";
}

void tc__comm_scope_prefix(char *buf, size_t len, const char *name, uint64_t generation) {
  const char *job, *attempt;
  key_scope(&job, &attempt);
  char j[80], a[80];
  key_part(j, sizeof j, job);
  key_part(a, sizeof a, attempt);
  snprintf(buf, len, "tc/%s/%s/%s/%llu", j, a, name, (unsigned long long)generation);
}

int tc__comm_arrive(tc_comm_t *c, const char *fn) {
  int64_t ticket = 0;
  int rc = tc_store_add(c->store, "arrivals", 1, &ticket);
  if (rc != TC_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
    return tc__comm_error(c, rc, fn,
                          "could not register with the store (%s); check that the "
                          "store server is running and reachable", why);
  }
  if (ticket > (int64_t)c->size) {
    const char *job, *attempt;
    key_scope(&job, &attempt);
    return tc__comm_error(
        c, TC_ERR_INVALID_USAGE, fn,
        "the store already holds keys of an earlier communicator '%s' under '%s' "
        "(this rank arrived as number %lld of %d): they were left by an earlier job "
        "or attempt on the same store whose creation did not complete (job id '%s', "
        "restart %s). Use a fresh store, set TORCHCOMMS_JOB_ID to a new value, or "
        "choose another communicator name",
        c->name, c->prefix, (long long)ticket, c->size, job, attempt);
  }
  return TC_OK;
}

void tc__comm_record_begin(tc_comm_t *c, void **token) {
  keylog_t *l = calloc(1, sizeof *l);
  *token = l;
  if (!l) return;
  l->store = c->store;
  key_recording = l;
}

void tc__comm_record_end(tc_comm_t *c, void *token, int delete_keys) {
  keylog_t *l = token;
  key_recording = NULL;
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) {
    if (delete_keys) {
      int deleted = 0;
      if (tc_store_delete(l->stores[i], l->keys[i], &deleted) != TC_OK)
        tc__logs(TC_LOG_DEBUG, TC_LOG_STORE,
                 "communicator '%s': could not delete store key '%s/%s' (%s)", c->name,
                 c->prefix, l->keys[i], tc_last_error());
    }
    free(l->keys[i]);
    tc_store_release(l->stores[i]);
  }
  if (delete_keys) {
    int deleted = 0;
    (void)tc_store_delete(c->store, "arrivals", &deleted);
  }
  free(l->keys);
  free(l->stores);
  free(l);
}
