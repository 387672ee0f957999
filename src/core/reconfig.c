/* reconfig.c -- fault tolerance: reconfigurable communicators (torchcomms'
 * get_init_handle / reconfigure).
 *
 * A communicator created with enable_reconfigure has no members. At
 * creation it starts its own endpoint, a small TCPStore server (bootstrap's,
 * on TORCHCOMMS_SOCKET_ADDR or the address it reaches its store from, any
 * free port), and its init handle names it:
 *
 *     torchcomms:<backend>:<nonce>:<host>:<port>
 *
 * (nonce: 16 random hex digits, so a process restarted on the same address
 * has another handle). Reconfigure (every member, same uuid, same list):
 *
 *  1. checks the list (well-formed handles, none twice, the caller's own
 *     exactly once: its index is the new rank);
 *  2. drops the previous configuration: pending operations fail as aborted,
 *     the backend state (threads, sockets, segments) is destroyed;
 *  3. meets the others on the endpoint of the list's rank 0, under
 *     "rc/<uuid>/": it sets "m/<own handle>" = "<digest> <n>" (digest: a
 *     hash of the uuid and the whole list, in order) and reads every other
 *     member's key until the deadline. Each member also says on its own
 *     endpoint what it does ("intent" = "<uuid> <digest> <n>" while it
 *     reconfigures, "done/<uuid>" = the digest of the group it formed), and
 *     members still missing are asked there about every half second. A
 *     member whose digest differs (same uuid, another list: split brain)
 *     fails the reconfigure at once; one missing at the deadline is named
 *     with what it was found doing (unreachable: dead; reconfiguring with
 *     another uuid; not reconfiguring). Two subsets with different lists
 *     or uuids never form one group, since each member checks every other
 *     member's digest;
 *  4. builds the backend state again (init) for the new rank and size on
 *     that store under "rc/<uuid>/<digest>", with epoch = the digest's low
 *     32 bits: every member computes the same value, and it is carried in
 *     every message header and connection greeting of the cpu backend, so
 *     nothing of an earlier configuration is ever taken for this one.
 *
 * On failure the communicator is left unconfigured (operations refuse with
 * a clear message) and reconfigure may be called again with a new uuid. */
#include "core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static const char fn_rc[] = "reconfigure";

int tc__reconfig_open(tc_comm_t *c, const char *fn) {
  const char *addr = tc__comm_advertise_addr(c->root_store);
  tc_store_server_t *srv = NULL;
  int rc = tc_store_server_start(addr, 0, &srv);
  if (rc != TC_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tc_last_error());
    return tc__comm_error(c, rc, fn,
                          "could not open the endpoint of a reconfigurable communicator "
                          "on %s (%s); set TORCHCOMMS_SOCKET_ADDR to an address of this "
                          "host", addr, why);
  }
  unsigned char nonce[8];
  size_t got = 0;
  while (got < sizeof nonce) {
    ssize_t k = getrandom(nonce + got, sizeof nonce - got, 0);
    if (k < 0 && errno != EINTR) {
      tc_store_server_stop(srv);
      return tc__comm_error(c, TC_ERR_SYSTEM, fn, "getrandom failed: %s", strerror(errno));
    }
    if (k > 0) got += (size_t)k;
  }
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", nonce[i]);
  int n = snprintf(c->init_handle, sizeof c->init_handle, "torchcomms:%s:%s:%s:%d",
                   c->backend_name, hex, addr, tc_store_server_port(srv));
  if (n < 0 || (size_t)n >= sizeof c->init_handle) {
    tc_store_server_stop(srv);
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                          "the endpoint address '%s' is too long for an init handle", addr);
  }
  c->rc_server = srv;
  return TC_OK;
}

void tc__reconfig_close(tc_comm_t *c) {
  if (c->rc_server) tc_store_server_stop(c->rc_server);
  c->rc_server = NULL;
}

int tc_comm_get_init_handle(const tc_comm_t *h, char *buf, size_t len) {
  tc_comm_t *c = (tc_comm_t *)h;
  TC_CHECK(tc__comm_enter(&c, "get_init_handle"));
  if (!buf || !len)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, "get_init_handle",
                          "argument 'buf' is NULL or 'len' is 0");
  if (!TC_BACKEND_HAS_CAP(c->ops, TC_BACKEND_CAP_RECONFIGURE))
    return tc__comm_error(c, TC_ERR_NOT_SUPPORTED, "get_init_handle",
                          "getInitHandle not implemented for communicator:%s (backend "
                          "'%s' cannot reconfigure)", c->name, c->backend_name);
  if (!c->reconfigurable)
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, "get_init_handle",
                          "the communicator was not created with enable_reconfigure=True: "
                          "only a reconfigurable communicator has an init handle");
  if (!c->rc_server)
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, "get_init_handle",
                          "the communicator was finalized: it has no endpoint any more");
  if (strlen(c->init_handle) >= len)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, "get_init_handle",
                          "the buffer has %zu bytes; the handle needs %zu", len,
                          strlen(c->init_handle) + 1);
  memcpy(buf, c->init_handle, strlen(c->init_handle) + 1);
  return TC_OK;
}

int tc_comm_is_abort_supported(const tc_comm_t *h) {
  tc_comm_t *c = (tc_comm_t *)h;
  if (tc__comm_enter(&c, "is_abort_supported") != TC_OK) return -1;
  return c->ops->abort != NULL;
}

/* ---- handles ---- */

typedef struct {
  char host[200];
  int port;
} rc_endpoint_t;

/* Parses "torchcomms:<backend>:<16 hex>:<host>:<port>"; 0 or -1. */
static int parse_handle(const char *h, rc_endpoint_t *ep) {
  static const char pre[] = "torchcomms:";
  if (strncmp(h, pre, sizeof pre - 1) != 0) return -1;
  const char *p = h + sizeof pre - 1;
  const char *q = strchr(p, ':'); /* end of the backend */
  if (!q || q == p) return -1;
  p = q + 1;
  for (int i = 0; i < 16; i++)
    if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return -1;
  if (p[16] != ':') return -1;
  p += 17;
  const char *colon = strrchr(p, ':');
  if (!colon || colon == p || (size_t)(colon - p) >= sizeof ep->host) return -1;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || end == colon + 1 || port <= 0 || port > 65535) return -1;
  memcpy(ep->host, p, (size_t)(colon - p));
  ep->host[colon - p] = 0;
  ep->port = (int)port;
  return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* The digest every member of one reconfiguration computes alike. */
static uint64_t list_digest(int64_t uuid, const char *const *hs, size_t n) {
  uint64_t h = fnv(1469598103934665603ull, &uuid, sizeof uuid);
  h = fnv(h, &n, sizeof n);
  for (size_t i = 0; i < n; i++) h = fnv(h, hs[i], strlen(hs[i]) + 1);
  return h;
}

/* ---- reconfigure ---- */

/* Checks the options; *me receives the caller's index. */
static int check_args(tc_comm_t *c, const tc_reconfigure_options_t *o, int *me) {
  if (!o)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc, "argument 'opts' is NULL");
  if (o->size < offsetof(tc_reconfigure_options_t, hints) || o->version < 1 ||
      o->version > TC_RECONFIGURE_OPTIONS_VERSION)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                          "options have size %u version %u; initialise them with "
                          "TC_RECONFIGURE_OPTIONS_INIT", o->size, o->version);
  if (isnan(o->timeout_s) || isinf(o->timeout_s))
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                          "option 'timeout_s' is not a finite number");
  if (o->num_handles == 0 || !o->init_handles)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                          "argument 'init_handles' is empty: it must list every member "
                          "of the new group, this process included");
  if (o->num_handles > (size_t)1 << 20)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                          "argument 'init_handles' has %zu entries (at most 1048576)",
                          o->num_handles);
  *me = -1;
  for (size_t i = 0; i < o->num_handles; i++) {
    const char *h = o->init_handles[i];
    rc_endpoint_t ep;
    if (!h || parse_handle(h, &ep) != 0)
      return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                            "init_handles[%zu] ('%.200s') is not an init handle of a "
                            "torchcomms communicator (get_init_handle() returns one)",
                            i, h ? h : "(null)");
    if (strcmp(h, c->init_handle) == 0) {
      if (*me >= 0)
        return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                              "init_handles lists this communicator's handle twice "
                              "(entries %d and %zu)", *me, i);
      *me = (int)i;
    }
  }
  for (size_t i = 0; i < o->num_handles; i++)
    for (size_t j = i + 1; j < o->num_handles; j++)
      if (strcmp(o->init_handles[i], o->init_handles[j]) == 0)
        return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                              "init_handles lists '%s' twice (entries %zu and %zu): "
                              "every member must appear once",
                              o->init_handles[i], i, j);
  if (*me < 0)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_rc,
                          "init_handles does not contain this communicator's handle "
                          "'%s': a process reconfigures only into a group it is a "
                          "member of", c->init_handle);
  return TC_OK;
}

/* Drops the previous configuration (pending operations fail as aborted,
 * the backend's threads, sockets and segments go). */
static void drop_config(tc_comm_t *c, int was) {
  if (was == TC_STATE_ACTIVE && c->bcomm) {
    tc__board_state(c, TC_STATE_ABORTED);
    c->ops->abort(c->bcomm);
  }
  if (c->bcomm) tc__windows_drop(c, "its communicator was reconfigured");
  if (c->bcomm) c->ops->destroy(c->bcomm);
  c->bcomm = NULL;
  tc__board_free(c);
  if (c->store) tc_store_release(c->store);
  c->store = NULL;
}

/* What a member that has not arrived is doing, read from its own endpoint
 * (its "intent" key: "<uuid> <digest> <n>" while it reconfigures). */
enum { PROBE_UNREACHABLE, PROBE_IDLE, PROBE_OTHER_UUID, PROBE_OTHER_LIST, PROBE_SAME };
static int probe(const char *handle, int64_t uuid, uint64_t digest, int64_t *their_uuid) {
  rc_endpoint_t ep;
  if (parse_handle(handle, &ep) != 0) return PROBE_UNREACHABLE;
  tc_store_t *s = NULL;
  if (tc_store_tcp_connect(ep.host, ep.port, 0, &s) != TC_OK) return PROBE_UNREACHABLE;
  int ready = 0, res = PROBE_IDLE;
  char done[48];
  snprintf(done, sizeof done, "done/%lld", (long long)uuid);
  const char *k[1] = {done};
  void *v = NULL;
  size_t len = 0;
  /* it already formed a group with this uuid: which one? */
  if (tc_store_check(s, k, 1, &ready) == TC_OK && ready &&
      tc_store_get(s, done, &v, &len, 1.0) == TC_OK) {
    char buf[96];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 95 ? len : 95), (const char *)v);
    free(v);
    v = NULL;
    unsigned long long d = 0;
    if (sscanf(buf, "%llx", &d) == 1 && d != digest) {
      tc_store_release(s);
      *their_uuid = uuid;
      return PROBE_OTHER_LIST;
    }
  }
  k[0] = "intent";
  if (tc_store_check(s, k, 1, &ready) != TC_OK) {
    res = PROBE_UNREACHABLE;
  } else if (ready && tc_store_get(s, "intent", &v, &len, 1.0) == TC_OK) {
    char buf[96];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 95 ? len : 95), (const char *)v);
    long long u = 0;
    unsigned long long d = 0;
    if (sscanf(buf, "%lld %llx", &u, &d) == 2) {
      *their_uuid = u;
      res = u != uuid ? PROBE_OTHER_UUID : d != digest ? PROBE_OTHER_LIST : PROBE_SAME;
    }
    free(v);
  }
  tc_store_release(s);
  return res;
}

/* Sets (text) or clears this member's intent on its own endpoint; done:
 * also records the group formed ("done/<uuid>" = digest, kept, so that a
 * member of another list with this uuid learns it is not coming). */
static void set_intent(tc_comm_t *c, const char *text, int64_t uuid, const uint64_t *done) {
  rc_endpoint_t ep;
  tc_store_t *s = NULL;
  if (parse_handle(c->init_handle, &ep) != 0 ||
      tc_store_tcp_connect(ep.host, ep.port, 1.0, &s) != TC_OK)
    return;
  if (done) {
    char key[48], val[24];
    snprintf(key, sizeof key, "done/%lld", (long long)uuid);
    int vl = snprintf(val, sizeof val, "%016llx", (unsigned long long)*done);
    tc_store_set(s, key, val, (size_t)vl);
  }
  if (text) {
    tc_store_set(s, "intent", text, strlen(text));
  } else {
    int del;
    tc_store_delete(s, "intent", &del);
  }
  tc_store_release(s);
}

/* Step 3: meets every member on rank 0's endpoint; TC_OK once all are
 * there with the same digest. While waiting, members still missing are
 * asked (on their own endpoints, about every second) what they do: one
 * reconfiguring with this uuid but another list fails this reconfigure at
 * once (split brain); at the deadline each missing member is named with
 * what it was found doing. */
static int rendezvous(tc_comm_t *c, tc_store_t *st, const tc_reconfigure_options_t *o,
                      int me, uint64_t digest, double deadline) {
  size_t n = o->num_handles;
  char mine[64], key[TC_INIT_HANDLE_MAX + 8];
  int vl = snprintf(mine, sizeof mine, "%016llx %zu", (unsigned long long)digest, n);
  snprintf(key, sizeof key, "m/%s", o->init_handles[me]);
  int rc = tc_store_set(st, key, mine, (size_t)vl);
  if (rc != TC_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tc_last_error());
    return tc__comm_error(c, rc, fn_rc,
                          "could not register with rank 0's endpoint %s (%s)",
                          o->init_handles[0], why);
  }
  unsigned char *got = calloc(n, 1); /* 1: arrived and agrees */
  int *seen = calloc(n, sizeof *seen); /* last probe result, -1: none */
  int64_t *uu = calloc(n, sizeof *uu);
  if (!got || !seen || !uu) {
    free(got), free(seen), free(uu);
    return tc__comm_error(c, TC_ERR_NOMEM, fn_rc, "out of memory");
  }
  for (size_t r = 0; r < n; r++) seen[r] = -1;
  got[me] = 1;
  size_t left_n = n - 1;
  double next_probe = tc__now() + 0.2;
  rc = TC_OK;
  while (left_n) {
    if (atomic_load(&c->rc_cancel)) {
      rc = tc__comm_error(c, TC_ERR_ABORTED, fn_rc,
                          "the communicator was aborted (by another thread) while it "
                          "reconfigured");
      goto out;
    }
    /* everything that arrived so far */
    for (size_t r = 0; r < n && rc == TC_OK; r++) {
      if (got[r]) continue;
      snprintf(key, sizeof key, "m/%s", o->init_handles[r]);
      const char *k[1] = {key};
      int ready = 0;
      if ((rc = tc_store_check(st, k, 1, &ready)) != TC_OK || !ready) continue;
      void *v = NULL;
      size_t len = 0;
      if ((rc = tc_store_get(st, key, &v, &len, 1.0)) != TC_OK) break;
      int same = len == (size_t)vl && memcmp(v, mine, len) == 0;
      char theirs[64];
      snprintf(theirs, sizeof theirs, "%.*s", (int)(len < 63 ? len : 63), (const char *)v);
      free(v);
      if (!same) {
        const char *sp = strchr(theirs, ' ');
        rc = tc__comm_error(
            c, TC_ERR_PROTOCOL, fn_rc,
            "member %s (rank %zu) reconfigures with uuid %lld into a different group "
            "(its list of %s handles differs from this rank's %zu): the members of one "
            "group must all pass the same uuid and the same init_handles; this group is "
            "not formed", o->init_handles[r], r, (long long)o->uuid, sp ? sp + 1 : "?", n);
        goto out;
      }
      got[r] = 1;
      left_n--;
    }
    if (rc != TC_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", tc_last_error());
      rc = tc__comm_error(c, rc, fn_rc, "lost rank 0's endpoint %s (%s)",
                          o->init_handles[0], why);
      goto out;
    }
    if (!left_n) break;
    double now = tc__now();
    if (now >= next_probe || now >= deadline) {
      for (size_t r = 0; r < n; r++) {
        if (got[r] || seen[r] == PROBE_UNREACHABLE) continue;
        seen[r] = probe(o->init_handles[r], o->uuid, digest, &uu[r]);
        if (seen[r] == PROBE_OTHER_LIST) {
          rc = tc__comm_error(
              c, TC_ERR_PROTOCOL, fn_rc,
              "member %s (rank %zu) reconfigures with uuid %lld into a different group "
              "(its list of handles differs from this rank's %zu): the members of one "
              "group must all pass the same uuid and the same init_handles; this group "
              "is not formed", o->init_handles[r], r, (long long)o->uuid, n);
          goto out;
        }
      }
      next_probe = tc__now() + 0.5;
    }
    if (tc__now() >= deadline) break;
    /* wait for the first missing key a little, then look again */
    for (size_t r = 0; r < n; r++) {
      if (got[r]) continue;
      snprintf(key, sizeof key, "m/%s", o->init_handles[r]);
      const char *k[1] = {key};
      double w = deadline - tc__now();
      if (w > next_probe - tc__now()) w = next_probe - tc__now();
      if (w < 0.01) w = 0.01;
      tc_store_wait(st, k, 1, w); /* a timeout here is expected */
      break;
    }
  }
  if (left_n) {
    char miss[700] = "";
    size_t ml = 0;
    for (size_t r = 0; r < n && ml < sizeof miss - 1; r++) {
      if (got[r]) continue;
      char what[96];
      switch (seen[r]) {
      case PROBE_UNREACHABLE:
        snprintf(what, sizeof what, "unreachable (its endpoint does not answer: the "
                 "process died?)");
        break;
      case PROBE_OTHER_UUID:
        snprintf(what, sizeof what, "alive, but reconfiguring with uuid %lld",
                 (long long)uu[r]);
        break;
      case PROBE_SAME:
        snprintf(what, sizeof what, "alive and reconfiguring with this uuid, but it "
                 "cannot reach rank 0's endpoint");
        break;
      default:
        snprintf(what, sizeof what, "alive, but not calling reconfigure");
      }
      ml += (size_t)snprintf(miss + ml, sizeof miss - ml, "%s%s (rank %zu) %s",
                             ml ? "; " : "", o->init_handles[r], r, what);
      if (ml >= sizeof miss) ml = sizeof miss - 1;
    }
    rc = tc__comm_error(
        c, TC_ERR_TIMEOUT, fn_rc,
        "timed out after %.1f s waiting for %zu of %zu members: %s. Every member must "
        "call reconfigure with uuid %lld and the same init_handles; reconfigure again "
        "without the dead ones", o->timeout_s > 0 ? o->timeout_s : c->timeout_s, left_n,
        n, miss, (long long)o->uuid);
  }
out:
  free(got);
  free(seen);
  free(uu);
  return rc;
}

int tc_comm_reconfigure(tc_comm_t *c, const tc_reconfigure_options_t *o, tc_work_t **work) {
  if (work) *work = NULL;
  TC_CHECK(tc__comm_enter(&c, fn_rc));
  if (!c->reconfigurable) {
    if (!TC_BACKEND_HAS_CAP(c->ops, TC_BACKEND_CAP_RECONFIGURE))
      return tc__comm_error(c, TC_ERR_NOT_SUPPORTED, fn_rc,
                            "reconfigure not implemented for communicator:%s (backend "
                            "'%s' cannot reconfigure; backend 'cpu' can)", c->name,
                            c->backend_name);
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, fn_rc,
                          "the communicator was not created with "
                          "enable_reconfigure=True; create it with "
                          "enable_reconfigure=True to reconfigure it");
  }
  int me = -1;
  TC_CHECK(check_args(c, o, &me));
  tc__lock(&c->mu);
  int was = c->state;
  if (was != TC_STATE_FINALIZED && was != TC_STATE_RECONFIGURING) {
    __atomic_store_n(&c->state, TC_STATE_RECONFIGURING, __ATOMIC_RELEASE);
    atomic_store(&c->rc_cancel, 0);
  }
  tc__unlock(&c->mu);
  if (was == TC_STATE_FINALIZED)
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, fn_rc,
                          "the communicator was finalized (create a new one)");
  if (was == TC_STATE_RECONFIGURING)
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, fn_rc,
                          "another thread is reconfiguring this communicator");
  double timeout = o->timeout_s > 0 ? o->timeout_s : c->timeout_s;
  double deadline = tc__now() + timeout;
  drop_config(c, was);
  /* from here on, messages name the new membership */
  size_t n = o->num_handles;
  c->rank = me;
  c->size = (int)n;
  free(c->granks);
  c->granks = NULL;
  uint64_t digest = list_digest(o->uuid, o->init_handles, n);
  tc_store_t *client = NULL, *st = NULL;
  int rc;
  if (n == 1) {
    rc = tc_store_memory(&client);
  } else {
    rc_endpoint_t ep0;
    parse_handle(o->init_handles[0], &ep0); /* checked */
    rc = tc_store_tcp_connect(ep0.host, ep0.port, timeout, &client);
    if (rc != TC_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", tc_last_error());
      rc = tc__comm_error(c, rc, fn_rc,
                          "could not reach rank 0's endpoint %s by the deadline (%.1f s): "
                          "unreachable: %s (rank 0). %s. A process that died cannot "
                          "join; reconfigure again without it",
                          o->init_handles[0], timeout, o->init_handles[0], why);
      goto fail;
    }
  }
  char pfx[64];
  snprintf(pfx, sizeof pfx, "rc/%lld/", (long long)o->uuid);
  rc = tc_store_prefix(client, pfx, &st);
  if (rc != TC_OK) goto fail;
  if (n > 1) {
    char intent[96];
    snprintf(intent, sizeof intent, "%lld %016llx %zu", (long long)o->uuid,
             (unsigned long long)digest, n);
    set_intent(c, intent, o->uuid, NULL);
    rc = rendezvous(c, st, o, me, digest, deadline);
    if (rc != TC_OK) goto fail;
  }
  /* step 4: the backend for the new group */
  if (c->root_store) tc_store_release(c->root_store);
  c->root_store = client; /* splits of the new group meet there too */
  client = NULL;
  snprintf(c->prefix, sizeof c->prefix, "rc/%lld/%016llx", (long long)o->uuid,
           (unsigned long long)digest);
  c->epoch = (uint32_t)digest ? (uint32_t)digest : 1u;
  c->seq = c->p2p_seq = c->split_seq = 0;
  tc__comm_set_coll_seq(c, 0);
  atomic_store(&c->done_coll, 0);
  atomic_store(&c->hang_reported, 0);
  double left = deadline - tc__now();
  rc = tc__comm_start(c, NULL, NULL, 0, fn_rc, left > 0.5 ? left : 0.5);
  if (rc != TC_OK) goto fail;
  if (n > 1) { /* every member passed the check (all are connected) */
    char key[TC_INIT_HANDLE_MAX + 8];
    int del;
    snprintf(key, sizeof key, "m/%s", o->init_handles[me]);
    tc_store_delete(st, key, &del);
  }
  tc_store_release(st);
  if (n > 1) set_intent(c, NULL, o->uuid, &digest);
  atomic_store(&c->last_progress_ns, (int64_t)(tc__now() * 1e9));
  tc__lock(&c->mu);
  int cancelled = atomic_load(&c->rc_cancel);
  __atomic_store_n(&c->state, cancelled ? TC_STATE_ABORTED : TC_STATE_ACTIVE,
                   __ATOMIC_RELEASE);
  tc__unlock(&c->mu);
  if (cancelled) { /* abort() came while the new group was being built */
    tc__board_state(c, TC_STATE_ABORTED);
    c->ops->abort(c->bcomm);
    c->ops->destroy(c->bcomm);
    c->bcomm = NULL;
    return tc__comm_error(c, TC_ERR_ABORTED, fn_rc,
                          "the communicator was aborted (by another thread) while it "
                          "reconfigured; reconfigure it again");
  }
  tc__log(2, "communicator '%s': reconfigured (uuid %lld): rank %d of %d, epoch %08x",
          c->name, (long long)o->uuid, c->rank, c->size, c->epoch);
  if (work) {
    tc_work_t *w = tc__work_alloc(NULL, "reconfigure", 0);
    if (w) {
      tc__work_fail_local(w, TC_OK, NULL);
      *work = tc__work_handle(w);
    }
  }
  return TC_OK;
fail:;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", tc_last_error());
  if (n > 1) set_intent(c, NULL, o->uuid, NULL);
  if (st) tc_store_release(st);
  if (client) tc_store_release(client);
  if (c->bcomm) { /* init succeeded here but a later step failed */
    c->ops->abort(c->bcomm);
    c->ops->destroy(c->bcomm);
    c->bcomm = NULL;
  }
  tc__board_free(c);
  c->rank = -1;
  c->size = 0;
  c->epoch = 0;
  tc__lock(&c->mu);
  __atomic_store_n(&c->state,
                   atomic_load(&c->rc_cancel) ? TC_STATE_ABORTED : TC_STATE_UNCONFIGURED,
                   __ATOMIC_RELEASE);
  tc__unlock(&c->mu);
  return tc__set_error_text(rc, saved);
}
