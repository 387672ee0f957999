/* private_api.h -- the internal entry points of libtorchcomms deliberately
 * shared with its statically linked clients: tcrun (tools/tcrun.c), the
 * Python extension (python/torchcomms/_comms_*.c) and the bootstrap-cost
 * measurement tcscale (tools/tcscale.c). They include this
 * header and the public ones, never a layer's internal header
 * (docs/architecture.md; tools/check_layers.py enforces it).
 *
 * Keep it small: an entry point belongs here only when a client needs
 * something that is not for users of the public API. Each declaration
 * repeats (or, for the store extension, is) the one of the layer that
 * defines it; those layers' headers include this file, so the compiler
 * checks that both agree. Symbols are hidden: only code linked into the
 * same object as libtorchcomms' sources can call them. */
#ifndef TC_PRIVATE_API_H
#define TC_PRIVATE_API_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "torchcomms.h"

#define TC__PRIVATE __attribute__((visibility("hidden")))

/* ---- core utilities (src/core/internal.h) ---- */

/* Copies text into the calling thread's last error verbatim and returns rc
 * (a store callback of the extension reports a Python exception's text). */
TC__PRIVATE int tc__set_error_text(int rc, const char *text);
/* Monotonic clock, seconds. */
TC__PRIVATE double tc__now(void);
/* Logging, gated by TORCHCOMMS_LOG (level 0 error .. 4 trace); subsystem
 * "misc" (docs/logging.md). */
TC__PRIVATE void tc__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prints every declared setting, its help and its value when set
 * (tcrun --help-env). */
TC__PRIVATE void tc__settings_print(FILE *f);
/* A BOOL setting of the table (src/core/settings.h) by its variable's
 * name: 0 or 1, or -1 when the table has no BOOL setting of that name.
 * For the clients' own settings, read through the table as all others. */
TC__PRIVATE int tc__setting_bool_named(const char *name);

/* ---- flight recorder (src/core/flight.c) ---- */

/* 1 when comm's flight recorder keeps stacks (TORCHCOMMS_FR_STACK or
 * TORCH_FR_CPP_STACK at its creation). */
TC__PRIVATE int tc__fr_stacks_wanted(const tc_comm_t *comm);
/* The caller's own frames for the operations this thread issues, as the
 * items of a JSON list ({"name": ..., "filename": ..., "line": N}, comma
 * separated, innermost first, no brackets: the extension's Python frames):
 * copied by each operation's entry, shown before its C frames. NULL or ""
 * clears it. The text must stay valid until cleared. */
TC__PRIVATE void tc__fr_set_caller_frames(const char *json);

/* ---- bootstrap (src/bootstrap/store_internal.h) ---- */

/* Optional functions of a store, beyond the public tc_store_vtable_t. */
typedef struct tc__store_ext {
  /* Waits until all keys exist (TC_ERR_TIMEOUT with the error text set
   * otherwise). NULL: tc_store_wait polls `check`. */
  int (*wait)(void *ctx, const char *const *keys, size_t nkeys,
              double timeout_s);
  /* The local address of the store's connection, or NULL. */
  const char *(*local_addr)(void *ctx);
  /* Short name for messages ("tcp", "memory", "prefix", "custom"). */
  const char *kind;
  /* 1: every request is forwarded to another store through the public
   * tc_store_* functions (the prefix store), where it is counted; so it is
   * not counted again on this one (tc__store_counts). */
  int forwards;
  /* 1: the store reaches this rank only (an in-process store one rank
   * made for its own bookkeeping, e.g. the extension's for a Python
   * backend, which finds its peers itself): a communicator over it skips
   * what needs a store shared by the ranks (the hang board, asking the
   * store about peers). */
  int rank_private;
} tc__store_ext_t;

/* Like tc_store_create, with the extra functions. ext may be NULL. On
 * failure the caller keeps ownership of ctx. */
TC__PRIVATE int tc__store_create_ext(const tc_store_vtable_t *vtable,
                                     const tc__store_ext_t *ext, void *ctx,
                                     tc_store_t **out);

/* An in-process store (as tc_store_memory) marked rank_private. */
TC__PRIVATE int tc__store_memory_private(tc_store_t **out);
/* 1 when store is marked rank_private. */
TC__PRIVATE int tc__store_is_private(const tc_store_t *store);

/* Store request counter (src/bootstrap/store.c): a per-process count of
 * every request that reaches a store doing the work (TCP client, memory,
 * a custom or Python store; a prefix store's requests are counted once, on
 * its base), by kind, made by the tc_store_* functions: one vtable call is
 * one request (a TCP get is WAIT + GET on the wire, a set is SET + PING: one
 * request each here). A tc_store_wait on a store without its own wait
 * polls `check`: each poll counts as a check. CONNECT counts the TCP store
 * client's connections opened (tc_store_tcp_connect and the spare
 * connections of concurrent requests); it is not in `requests`. For
 * measurement (tools/tcscale.c, docs/scaling_before.md) and tests. */
typedef enum tc__store_req_kind {
  TC__SREQ_SET = 0,
  TC__SREQ_GET,
  TC__SREQ_ADD,
  TC__SREQ_CHECK,
  TC__SREQ_WAIT,
  TC__SREQ_DELETE,
  TC__SREQ_CONNECT,
  TC__SREQ_KINDS
} tc__store_req_kind_t;

typedef struct tc__store_counts {
  unsigned long long n[TC__SREQ_KINDS]; /* by kind */
  unsigned long long requests; /* sum of every kind but CONNECT */
  unsigned long long keys;     /* keys named by them (a wait of k keys: k) */
} tc__store_counts_t;

/* Copies the counts since the last reset (or the process start). */
TC__PRIVATE void tc__store_counts(tc__store_counts_t *out);
/* Sets every count to 0. */
TC__PRIVATE void tc__store_counts_reset(void);
/* "set", "get", "add", "check", "wait", "delete", "connect"; "?" else. */
TC__PRIVATE const char *tc__store_req_kind_name(int kind);
/* Counts one request of `kind` naming nkeys keys (store layer only; the
 * TCP client counts its connections with it). */
TC__PRIVATE void tc__store_count(int kind, size_t nkeys);

/* ---- transport (src/transport/shm.h) ---- */

/* Removes from /dev/shm every shared-memory segment of this library whose
 * creating process is dead; returns how many (tcrun at job end). */
TC__PRIVATE int tc__shm_sweep(void);

#endif /* TC_PRIVATE_API_H */
