/* store_server.h -- internals of the TCPStore server shared by its two
 * files: tcp_store_server.c (sockets, the poll loop, memory accounting,
 * limits, logging, the public API) and tcp_store_exec.c (what each request
 * does to the store). Not for use elsewhere, except by tests and fuzzers.
 *
 * Memory: every byte the server holds for its clients is accounted in
 * `used` -- stored keys, values and queues (approximately: entry size plus
 * a share of the hash table), buffered requests and unsent answers (their
 * buffers' capacity), the keys a WAIT waits for, and a fixed cost per
 * connection -- and `used` never exceeds `lim.max_bytes`: a growth that
 * does not fit first evicts stalled connections (unsent answers and no
 * progress for TC__STORE_STALL_S), then waits while memory may still be
 * freed, else the requesting connection is refused (closed, with the reason
 * logged and kept for our client to ask, see TC__STORE_REFUSAL_KEY).
 */
#ifndef TC_STORE_SERVER_H
#define TC_STORE_SERVER_H

#include "bootstrap/store_internal.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

/* A connection with unsent answers that sent nothing for this long is
 * "stalled" and may be evicted when memory is short. */
#define TC__STORE_STALL_S 1.0
/* Fixed cost of one connection in the budget (struct, poll slot, socket). */
#define TC__STORE_CONN_COST 1024u
/* Accounted cost of a stored entry: struct, key + NUL, value, and about
 * three hash-table pointers. */
#define TC__STORE_ENTRY_COST(klen, vlen)                                       \
  (sizeof(tc__kv_entry_t) + 24 + (size_t)(klen) + 1 + (size_t)(vlen))
/* Log lines of one server per window, then counted (rate limit). */
#define TC__STORE_LOG_BURST 10
#define TC__STORE_LOG_WINDOW_S 10.0
/* Refusal reasons kept for clients to ask about (a ring). */
#define TC__STORE_NREFUSALS 32

/* The limits, from the environment at server start (see README.md). */
typedef struct tc__store_limits {
  uint64_t max_bytes;  /* TORCHCOMMS_STORE_MAX_BYTES: the whole server */
  uint64_t max_value;  /* TORCHCOMMS_STORE_MAX_VALUE_BYTES: one value */
  uint64_t max_unsent; /* TORCHCOMMS_STORE_MAX_UNSENT_BYTES: per connection,
                        * then its requests wait (backpressure) */
} tc__store_limits_t;

typedef struct tc__conn {
  int fd;          /* -1 for a connection fed by a fuzzer */
  int validated;   /* sent VALIDATE with the magic number */
  int dead;        /* to be closed at the end of this round */
  int held;        /* a request waits for memory (retried every round) */
  char peer[64];   /* "ip:port" (IPv4-mapped IPv6 shown as IPv4) */
  tc__buf_t in;    /* received bytes; in.p[in_off..in.len) not parsed yet */
  size_t in_off;
  size_t in_need;  /* the pending request has at least this many bytes */
  tc__buf_t out;   /* answers; out.p[out_off..out.len) not sent yet */
  size_t out_off;
  double out_since; /* last send progress, or when answers became unsent */
  double in_since;  /* last bytes received */
  char **wkeys;    /* keys a WAIT / BARRIER still waits for */
  size_t *wklen;
  size_t nwait;
  size_t wcost;    /* accounted bytes of the wait list */
} tc__conn_t;

typedef struct tc__store_refusal {
  char peer[64];
  char why[256];
} tc__store_refusal_t;

struct tc_store_server {
  uint32_t magic;
  int lfd;
  int port;
  int wake[2];
  pthread_t thread;
  tc__conn_t **conns;
  size_t nconns, cap;
  struct pollfd *pfds;
  size_t npfds;
  tc__kv_t kv;
  tc__kv_t queues; /* value: items, each a uint64 length + bytes */
  tc__store_limits_t lim;
  size_t used;     /* accounted bytes (server thread only) */
  atomic_size_t used_pub, peak_pub; /* copies for tc__store_server_memory */
  /* log rate limit */
  double log_window;
  unsigned log_lines;
  unsigned long log_suppressed;
  tc__store_refusal_t refusals[TC__STORE_NREFUSALS];
  unsigned nrefusals;
  size_t nexec;    /* requests executed */
};

/* ---- tcp_store_server.c ---- */

/* Adds delta bytes to the accounting (negative: freed). */
TC_INTERNAL void tc__srv_acct(tc_store_server_t *s, long long delta);
/* Makes room for n more accounted bytes for c (evicting stalled other
 * connections if needed): 1 when they fit now, 0 when they may fit later
 * (c should wait and retry), -1 when they cannot. */
TC_INTERNAL int tc__srv_room(tc_store_server_t *s, size_t n, tc__conn_t *c);
/* Capacity growth of c->out needed for n more answer bytes (and the byte a
 * pending WAIT will need). */
TC_INTERNAL size_t tc__srv_out_growth(const tc__conn_t *c, size_t n);
/* Grows c->out for n more answer bytes, leaving `keep` bytes of the budget
 * free (room for both must have been made). 0, or -1 when out of memory (c
 * is then dropped). */
TC_INTERNAL int tc__srv_reserve_out(tc_store_server_t *s, tc__conn_t *c,
                                    size_t n, size_t keep);
/* Marks c to be closed at the end of the round, logging why (rate-limited)
 * and, for level <= 1, keeping the reason for our client to ask. */
TC_INTERNAL void tc__srv_drop(tc_store_server_t *s, tc__conn_t *c, int level,
                              const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The reason kept for a connection from peer "ip:port", or NULL. */
TC_INTERNAL const char *tc__srv_refusal(const tc_store_server_t *s,
                                        const void *peer, size_t len);

/* ---- tcp_store_exec.c ---- */

/* Executes the complete request req[0..len) of c, unless the memory it
 * needs is not available: 1 done (c may be dead), 0 held (retry later). */
TC_INTERNAL int tc__srv_exec(tc_store_server_t *s, tc__conn_t *c,
                             const uint8_t *req, size_t len);
/* Forgets what c waits for (and its accounting). */
TC_INTERNAL void tc__srv_clear_wait(tc_store_server_t *s, tc__conn_t *c);

/* ---- for tests and fuzzers ---- */

/* The server's accounted memory now, its peak, and its budget. */
TC_INTERNAL void tc__store_server_memory(tc_store_server_t *s, size_t *used,
                                         size_t *peak, size_t *budget);
/* Feeds data to a fresh server state without sockets or threads, under
 * small limits, as the bytes two clients sent: chunks of one byte (bit 7:
 * which client; bits 0-6: length) and that many bytes; answers are
 * discarded. After every chunk checks the accounting against a recount and
 * the budget (aborts when wrong). Returns how many requests ran. */
TC_INTERNAL size_t tc__store_server_fuzz(const uint8_t *data, size_t len);

#endif /* TC_STORE_SERVER_H */
