/* hier.c -- hierarchical algorithms of the cpu backend, for a communicator
 * whose ranks are on several hosts (TORCHCOMMS_CPU_HIER=auto|0|1).
 *
 * At creation, from the hosts the TCP transport found (tc__tcp_host_ids),
 * the communicator builds two child communicators of this backend:
 *  - `local`: the ranks of this host, in communicator-rank order (shared
 *    memory; none when this rank is alone on its host);
 *  - `leaders`: the lowest rank of every host, hosts in the order of their
 *    lowest rank (TCP; only the leaders create it).
 * Their stores are the parent's, prefixed "hier/local/<host>" and
 * "hier/leaders". They have no progress thread: the parent's executing
 * thread runs their steps synchronously, each an ordinary operation of the
 * child (its own fingerprint, checked over its own transport, tagged with
 * the parent's call so that two different calls never match), under the
 * parent operation's deadline. A failed step fails the parent operation
 * with the step's reason, its peers renamed to parent ranks.
 *
 * Hierarchical: all_reduce (local reduce, leaders all_reduce, local
 * broadcast), broadcast, reduce, barrier, and all_gather / reduce_scatter
 * with equal counts (per-host blocks, uneven across hosts, laid out host by
 * host in scratch, then put in communicator-rank order). Everything else
 * (all_to_all, p2p, gather, scatter, the _v forms, windows) stays flat over
 * the parent's TCP transport. Reductions combine values in another order
 * than the flat algorithms; for exact values (integers, and the tests'
 * floats) the results are the same. */
#include "backends/cpu/cpu.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cpu_hier {
  cpu_comm_t *local;   /* this host's ranks (NULL: alone on the host) */
  cpu_comm_t *leaders; /* one rank per host (NULL: not a leader) */
  tc_store_t *lstore, *gstore;
  int nhosts, host, lrank, lsize;
  int *host_of, *lidx;        /* [size]: host and index on it of each rank */
  int *hsize, *hoff, *leader; /* [nhosts]: ranks, first slot, leader rank */
  int *lranks;                /* [lsize]: the parent ranks of `local` */
  tc_block_t *blk;            /* [size]: blocks of a step */
} cpu_hier_t;

int tc__cpu_hier_fake_hosts(void) {
  if (tc__setting_choice(TC_SET_CPU_HIER) == 1) return 0; /* "0": off */
  return (int)tc__setting_double(TC_SET_CPU_HIER_FAKE_HOSTS);
}

/* ------------------------------------------------------------------------ */
/* Setup and teardown                                                        */
/* ------------------------------------------------------------------------ */

static int hier_child(cpu_comm_t *c, const tc_backend_init_args_t *a, tc_tp_choice_t choice,
                      const char *what, const char *prefix, int rank, int size,
                      tc_store_t **store, cpu_comm_t **out, char *err, size_t errlen) {
  int rc = tc_store_prefix(a->store, prefix, store);
  if (rc != TC_OK) {
    snprintf(err, errlen, "hierarchy: could not make the store of the %s group", what);
    return rc;
  }
  char name[160];
  snprintf(name, sizeof name, "%s/hier-%s", c->name, what);
  tc_backend_init_args_t ca = *a;
  ca.comm_name = name;
  ca.rank = rank;
  ca.world_size = size;
  ca.store = *store;
  char why[600] = "";
  rc = tc__cpu_open(&ca, choice, 1, out, why, sizeof why);
  if (rc != TC_OK)
    snprintf(err, errlen, "hierarchy: setting up the %s group (rank %d of %d) failed: %s",
             what, rank, size, why);
  return rc;
}

int tc__cpu_hier_setup(cpu_comm_t *c, const tc_backend_init_args_t *a, tc_tp_choice_t choice,
                       char *err, size_t errlen) {
  int mode = tc__setting_choice(TC_SET_CPU_HIER); /* 0 auto, 1 off, 2 on */
  if (mode == 1 || c->shm || c->size < 2) return TC_OK;
  int fake = tc__cpu_hier_fake_hosts(), n = c->size;
  const uint64_t *ids = tc__tcp_host_ids(c->tp_ops, c->tp);
  if (!ids && !fake) return TC_OK;
  cpu_hier_t *h = calloc(1, sizeof *h);
  uint64_t *key = calloc((size_t)n, sizeof *key);
  if (h) {
    h->host_of = calloc((size_t)n, sizeof(int));
    h->lidx = calloc((size_t)n, sizeof(int));
    h->hsize = calloc((size_t)n, sizeof(int));
    h->hoff = calloc((size_t)n, sizeof(int));
    h->leader = calloc((size_t)n, sizeof(int));
    h->lranks = calloc((size_t)n, sizeof(int));
    h->blk = calloc((size_t)n, sizeof(tc_block_t));
  }
  if (!h || !key || !h->host_of || !h->lidx || !h->hsize || !h->hoff || !h->leader ||
      !h->lranks || !h->blk) {
    free(key);
    c->hier = h;
    if (h) tc__cpu_hier_free(c);
    snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  for (int r = 0; r < n; r++)
    key[r] = !fake ? ids[r] : fake > 0 ? (uint64_t)((long long)r * fake / n)
                                       : (uint64_t)(r % -fake);
  for (int r = 0; r < n; r++) { /* hosts in the order of their lowest rank */
    int j = 0;
    while (j < h->nhosts && key[h->leader[j]] != key[r]) j++;
    if (j == h->nhosts) h->leader[h->nhosts++] = r;
    h->host_of[r] = j;
    h->lidx[r] = h->hsize[j]++;
  }
  free(key);
  for (int j = 1; j < h->nhosts; j++) h->hoff[j] = h->hoff[j - 1] + h->hsize[j - 1];
  h->host = h->host_of[c->rank];
  h->lrank = h->lidx[c->rank];
  h->lsize = h->hsize[h->host];
  for (int r = 0; r < n; r++)
    if (h->host_of[r] == h->host) h->lranks[h->lidx[r]] = r;
  if (h->nhosts < 2 || (mode == 0 && h->nhosts == n)) { /* one host, or one rank each */
    c->hier = h;
    tc__cpu_hier_free(c);
    return TC_OK;
  }
  c->hier = h;
  /* the ranks of a host over shared memory unless TCP was asked for */
  static const tc_tp_choice_t choices[] = {TC_TP_AUTO, TC_TP_SHM, TC_TP_TCP};
  tc_tp_choice_t lchoice = choices[tc__setting_choice(TC_SET_CPU_TRANSPORT)] == TC_TP_TCP
                               ? TC_TP_TCP : TC_TP_AUTO;
  (void)choice;
  int rc = TC_OK;
  if (h->lsize > 1) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "hier/local/%d", h->host);
    rc = hier_child(c, a, lchoice, "local", prefix, h->lrank, h->lsize, &h->lstore, &h->local,
                    err, errlen);
  }
  if (rc == TC_OK && h->lrank == 0)
    rc = hier_child(c, a, TC_TP_TCP, "leaders", "hier/leaders", h->host, h->nhosts,
                    &h->gstore, &h->leaders, err, errlen);
  if (rc != TC_OK) return rc; /* the caller closes and frees */
  TC_BACKEND_LOGS(a->host, TC_LOG_DEBUG, TC_LOG_INIT,
                  "cpu backend '%s' rank %d: hierarchical: %d hosts, %d local ranks, "
                  "leader rank %d (local group over %s, leaders over tcp)",
                  c->name, c->rank, h->nhosts, h->lsize, h->leader[h->host],
                  h->local ? h->local->tp_ops->name : "none");
  return TC_OK;
}

int tc__cpu_hier_finalize(cpu_comm_t *c, char *err, size_t errlen) {
  cpu_hier_t *h = c->hier;
  cpu_comm_t *gs[2] = {h->local, h->leaders};
  for (int i = 0; i < 2; i++) {
    cpu_comm_t *g = gs[i];
    if (!g || !g->tp) continue;
    int rc = TC_OK;
    char why[600] = "";
    if (g->lazy_lo || g->owed_n) { /* broadcasts it rooted, still to be checked */
      cpu_ctx_t ctx;
      tc__cpu_ctx_init(&ctx, g, "finalize");
      ctx.timeout_s = c->timeout_s;
      ctx.deadline = tc__now() + c->timeout_s;
      rc = tc__cpu_settle(&ctx);
      if (rc != TC_OK) snprintf(why, sizeof why, "%.590s", ctx.msg);
    }
    tc_tp_op_t t = {.opname = "finalize", .deadline = tc__now() + c->timeout_s,
                    .timeout_s = c->timeout_s, .msg = why, .msglen = sizeof why};
    if (rc == TC_OK) rc = g->tp_ops->goodbye(g->tp, &t);
    if (rc != TC_OK) {
      snprintf(err, errlen, "%s (the hierarchy's group of %s)", why,
               i == 0 ? "the ranks of this host" : "the hosts' leaders");
      return rc;
    }
  }
  return TC_OK;
}

void tc__cpu_hier_abort(cpu_comm_t *c) {
  cpu_hier_t *h = c->hier;
  cpu_comm_t *gs[2] = {h->local, h->leaders};
  for (int i = 0; i < 2; i++) {
    cpu_comm_t *g = gs[i];
    if (!g) continue;
    atomic_store(&g->aborted, 1);
    uint64_t one = 1;
    ssize_t w = write(g->wake_fd, &one, sizeof one);
    (void)w;
    pthread_mutex_lock(&g->tp_mu);
    if (g->tp && g->tp_ops->interrupt) g->tp_ops->interrupt(g->tp);
    pthread_mutex_unlock(&g->tp_mu);
  }
}

void tc__cpu_hier_close(cpu_comm_t *c, int leave) {
  cpu_hier_t *h = c->hier;
  cpu_comm_t *gs[2] = {h->local, h->leaders};
  for (int i = 0; i < 2; i++) {
    cpu_comm_t *g = gs[i];
    if (!g) continue;
    pthread_mutex_lock(&g->tp_mu);
    if (g->tp && leave && g->tp_ops->leave) g->tp_ops->leave(g->tp);
    if (g->tp) g->tp_ops->close(g->tp);
    g->tp = NULL;
    g->shm = NULL;
    g->closed = 1;
    pthread_mutex_unlock(&g->tp_mu);
  }
}

void tc__cpu_hier_free(cpu_comm_t *c) {
  cpu_hier_t *h = c->hier;
  if (!h) return;
  c->hier = NULL;
  cpu_comm_t *gs[2] = {h->local, h->leaders};
  for (int i = 0; i < 2; i++) {
    cpu_comm_t *g = gs[i];
    if (!g) continue;
    if (g->tp) g->tp_ops->close(g->tp);
    g->tp = NULL;
    tc__cpu_free(g);
  }
  if (h->lstore) tc_store_release(h->lstore);
  if (h->gstore) tc_store_release(h->gstore);
  free(h->host_of);
  free(h->lidx);
  free(h->hsize);
  free(h->hoff);
  free(h->leader);
  free(h->lranks);
  free(h->blk);
  free(h);
}

void tc__cpu_hier_describe(const cpu_comm_t *c, char *buf, size_t len) {
  const cpu_hier_t *h = c->hier;
  if (!h) {
    if (len) buf[0] = 0;
    return;
  }
  snprintf(buf, len,
           "hierarchical: %d hosts, %d local ranks, leader rank %d; local group over %s, "
           "leaders over tcp; all_reduce, broadcast, reduce, barrier, and all_gather and "
           "reduce_scatter with equal counts go through them, the rest flat over tcp",
           h->nhosts, h->lsize, h->leader[h->host], h->local ? h->local->tp_ops->name : "none");
}

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */
/* ------------------------------------------------------------------------ */

int tc__cpu_hier_takes(const cpu_comm_t *c, const tc_backend_op_t *op) {
  (void)c;
  switch (op->kind) {
  case TC_KIND_ALL_REDUCE:
  case TC_KIND_BROADCAST:
  case TC_KIND_REDUCE:
  case TC_KIND_BARRIER: return 1;
  case TC_KIND_ALL_GATHER:
  case TC_KIND_REDUCE_SCATTER: return (op->flags & TC_OPF_UNIFORM) != 0;
  default: return 0;
  }
}

/* A step's failure as the parent's: the step's reason with its group's
 * ranks ("peer 1", "rank 0") renamed to the parent's, and which step. */
static int hier_fail(cpu_ctx_t *pctx, const cpu_ctx_t *cctx, int rc, int is_local,
                     const char *step) {
  const cpu_hier_t *h = pctx->c->hier;
  const int *map = is_local ? h->lranks : h->leader;
  int gsize = is_local ? h->lsize : h->nhosts;
  char out[800];
  size_t o = 0;
  const char *s = cctx->msg;
  while (*s && o + 16 < sizeof out) {
    if ((!strncmp(s, "peer ", 5) || !strncmp(s, "rank ", 5)) && isdigit((unsigned char)s[5])) {
      char *end;
      long v = strtol(s + 5, &end, 10);
      if (v >= 0 && v < gsize) {
        o += (size_t)snprintf(out + o, sizeof out - o, "%.5s%d", s, map[v]);
        s = end;
        continue;
      }
    }
    out[o++] = *s++;
  }
  out[o] = 0;
  return tc__cpu_fail(pctx, rc, "%s (hierarchical %s, step '%s' among %s)", out,
                      pctx->opname, step,
                      is_local ? "the ranks of this host" : "the hosts' leaders");
}

/* A child operation of type t carrying the parent's dtype and reduction. */
static tc_backend_op_t hop(tc_op_type_t t, const tc_backend_op_t *p) {
  tc_backend_op_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.type = t;
  o.kind = tc_backend_op_kind(t);
  o.flags = tc_backend_op_flags(t);
  o.dtype = p->dtype;
  o.redop = p->redop;
  o.root = -1;
  o.timeout_s = p->timeout_s;
  o.seq = p->seq;
  return o;
}

/* The first reduction (each rank's own input): AVG sums (the parent
 * divides once, at the end); every later one: AVG and PREMUL_SUM sum. */
static tc_redop_t first_redop(tc_redop_t r) {
  if (r.type == TC_AVG) r.type = TC_SUM;
  return r;
}
static tc_redop_t later_redop(tc_redop_t r) {
  if (r.type == TC_AVG || r.type == TC_PREMUL_SUM) r = TC_OP(TC_SUM);
  return r;
}

/* Runs op on group g (local or leaders), synchronously, under the parent's
 * deadline. */
static int hier_step(cpu_ctx_t *pctx, int is_local, tc_backend_op_t *op, const char *step) {
  cpu_hier_t *h = pctx->c->hier;
  cpu_comm_t *g = is_local ? h->local : h->leaders;
  cpu_ctx_t ctx;
  tc__cpu_ctx_init(&ctx, g, tc__op_name(op->type));
  ctx.op = op;
  ctx.es = tc_dtype_size(op->dtype);
  ctx.timeout_s = pctx->timeout_s;
  ctx.deadline = pctx->deadline;
  int rc;
  if (atomic_load(&pctx->c->aborted)) {
    rc = tc__cpu_fail(&ctx, TC_ERR_ABORTED, "communicator was aborted");
  } else if (!g->tp) {
    rc = tc__cpu_fail(&ctx, TC_ERR_INTERNAL, "the hierarchy's group is closed");
  } else {
    if (tc_backend_op_is_collective(op)) {
      tc__cpu_fingerprint(g, op, ++g->coll_seq, &ctx.fp);
      /* the parent's call: a step of one call never matches another's */
      ctx.fp.flags |= (uint8_t)(((unsigned)pctx->op->type + 1u) << 2);
      ctx.fp_todo = g->check_fp && g->size > 1;
    }
    cpu_fast_t st;
    memset(&st, 0, sizeof st);
    rc = tc__cpu_fast_kind(g, op, &st) ? tc__cpu_fast_run(&ctx, &st, -1.0) : tc__cpu_run(&ctx);
  }
  if (g->scratch_cap > CPU_SCRATCH_KEEP) {
    free(g->scratch);
    g->scratch = NULL;
    g->scratch_cap = 0;
  }
  if (rc == TC_OK) return TC_OK;
  /* the communicator is broken from here on: close the groups, so that
   * their other ranks, waiting in a step of their own, fail at once (a
   * closed peer) instead of at their deadline */
  tc__cpu_hier_close(pctx->c, 0);
  if (rc == TC_ERR_ABORTED) return tc__cpu_fail(pctx, rc, "communicator was aborted");
  return hier_fail(pctx, &ctx, rc, is_local, step);
}

static int h_all_reduce(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  cpu_hier_t *h = ctx->c->hier;
  tc_backend_op_t o;
  if (h->local) {
    o = hop(TC_OP_REDUCE, op);
    o.redop = first_redop(op->redop);
    o.root = 0;
    o.recvbuf = op->recvbuf;
    o.count = op->count;
    TC_CHECK(hier_step(ctx, 1, &o, "reduce to the host's leader"));
  } else if (op->redop.type == TC_PREMUL_SUM && op->count) {
    tc__scale(op->recvbuf, op->recvbuf, op->count, op->dtype, op->redop.factor);
  }
  if (h->leaders) {
    o = hop(TC_OP_ALL_REDUCE, op);
    o.redop = later_redop(op->redop);
    o.recvbuf = op->recvbuf;
    o.count = op->count;
    TC_CHECK(hier_step(ctx, 0, &o, "all_reduce between the hosts' leaders"));
    if (op->redop.type == TC_AVG && op->count)
      tc__divide(op->recvbuf, op->count, op->dtype, (uint64_t)ctx->size);
  }
  if (h->local) {
    o = hop(TC_OP_BROADCAST, op);
    o.root = 0;
    o.recvbuf = op->recvbuf;
    o.count = op->count;
    TC_CHECK(hier_step(ctx, 1, &o, "broadcast from the host's leader"));
  }
  return TC_OK;
}

static int h_broadcast(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  cpu_hier_t *h = ctx->c->hier;
  int hr = h->host_of[op->root];
  tc_backend_op_t lo = hop(TC_OP_BROADCAST, op), go = lo;
  lo.recvbuf = go.recvbuf = op->recvbuf;
  lo.count = go.count = op->count;
  go.root = hr;
  if (h->host == hr) { /* the root's host: from the root, then to the other hosts */
    lo.root = h->lidx[op->root];
    if (h->local) TC_CHECK(hier_step(ctx, 1, &lo, "broadcast from the root on its host"));
    if (h->leaders) TC_CHECK(hier_step(ctx, 0, &go, "broadcast between the hosts' leaders"));
  } else {
    lo.root = 0;
    if (h->leaders) TC_CHECK(hier_step(ctx, 0, &go, "broadcast between the hosts' leaders"));
    if (h->local) TC_CHECK(hier_step(ctx, 1, &lo, "broadcast from the host's leader"));
  }
  return TC_OK;
}

static int h_reduce(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  cpu_hier_t *h = ctx->c->hier;
  int root = op->root, hr = h->host_of[root];
  size_t bytes = op->count * ctx->es;
  char *acc = op->recvbuf; /* the host's partial (a leader's) */
  if (h->leaders && ctx->rank != root) { /* a non-root buffer is input only */
    TC_CHECK(tc__cpu_scratch(ctx, bytes + 1, (void **)&acc));
    if (bytes) memcpy(acc, op->recvbuf, bytes);
  }
  tc_backend_op_t o;
  if (h->local) {
    o = hop(TC_OP_REDUCE, op);
    o.redop = first_redop(op->redop);
    o.root = 0;
    o.recvbuf = acc;
    o.count = op->count;
    TC_CHECK(hier_step(ctx, 1, &o, "reduce to the host's leader"));
  } else if (op->redop.type == TC_PREMUL_SUM && op->count) {
    tc__scale(acc, acc, op->count, op->dtype, op->redop.factor);
  }
  if (h->leaders) {
    o = hop(TC_OP_REDUCE, op);
    o.redop = later_redop(op->redop);
    o.root = hr;
    o.recvbuf = acc;
    o.count = op->count;
    TC_CHECK(hier_step(ctx, 0, &o, "reduce between the hosts' leaders"));
    if (h->host == hr && op->redop.type == TC_AVG && op->count)
      tc__divide(acc, op->count, op->dtype, (uint64_t)ctx->size);
  }
  if (h->host == hr && h->lidx[root] != 0) { /* the leader hands the result to the root */
    if (ctx->rank == root || h->leaders) {
      int me_root = ctx->rank == root;
      o = hop(me_root ? TC_OP_RECV : TC_OP_SEND, op);
      o.root = me_root ? 0 : h->lidx[root];
      o.count = op->count;
      o.recvbuf = me_root ? op->recvbuf : NULL;
      o.sendbuf = me_root ? NULL : acc;
      TC_CHECK(hier_step(ctx, 1, &o, "the result from the host's leader to the root"));
    }
  }
  return TC_OK;
}

static int h_barrier(cpu_ctx_t *ctx) {
  cpu_hier_t *h = ctx->c->hier;
  tc_backend_op_t o = hop(TC_OP_BARRIER, ctx->op);
  if (h->local) TC_CHECK(hier_step(ctx, 1, &o, "barrier of the host's ranks"));
  if (h->leaders) TC_CHECK(hier_step(ctx, 0, &o, "barrier between the hosts' leaders"));
  if (h->local) TC_CHECK(hier_step(ctx, 1, &o, "barrier of the host's ranks"));
  return TC_OK;
}

/* all_gather with equal counts: the blocks gathered host by host into
 * scratch (host j's ranks from slot hoff[j]), then copied out in
 * communicator-rank order. */
static int h_all_gather(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  cpu_hier_t *h = ctx->c->hier;
  int n = ctx->size;
  size_t cnt = op->count, b = cnt * ctx->es;
  char *all;
  TC_CHECK(tc__cpu_scratch(ctx, (size_t)n * b + 1, (void **)&all));
  char *mine = all + (size_t)h->hoff[h->host] * b;
  tc_backend_op_t o;
  if (h->local) {
    o = hop(TC_OP_GATHER, op);
    o.root = 0;
    o.sendbuf = op->sendbuf;
    o.count = cnt;
    for (int i = 0; i < h->lsize; i++) h->blk[i] = (tc_block_t){mine + (size_t)i * b, cnt};
    o.recv = h->blk;
    TC_CHECK(hier_step(ctx, 1, &o, "gather to the host's leader"));
  } else if (b) {
    memcpy(mine, op->sendbuf, b);
  }
  if (h->leaders) {
    o = hop(TC_OP_ALL_GATHER_V, op);
    for (int j = 0; j < h->nhosts; j++)
      h->blk[j] = (tc_block_t){all + (size_t)h->hoff[j] * b, (size_t)h->hsize[j] * cnt};
    o.sendbuf = mine;
    o.count = (size_t)h->lsize * cnt;
    o.recv = h->blk;
    TC_CHECK(hier_step(ctx, 0, &o, "all_gather between the hosts' leaders"));
  }
  if (h->local) {
    o = hop(TC_OP_BROADCAST, op);
    o.root = 0;
    o.recvbuf = all;
    o.count = (size_t)n * cnt;
    TC_CHECK(hier_step(ctx, 1, &o, "broadcast from the host's leader"));
  }
  if (b)
    for (int r = 0; r < n; r++) {
      const char *src = all + (size_t)(h->hoff[h->host_of[r]] + h->lidx[r]) * b;
      if (op->recv[r].buf != src) memcpy(op->recv[r].buf, src, b);
    }
  return TC_OK;
}

/* reduce_scatter with equal counts: the input put host by host into
 * scratch, reduced to each host's leader, reduce-scattered between the
 * leaders (each its host's blocks), scattered on the host. */
static int h_reduce_scatter(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  cpu_hier_t *h = ctx->c->hier;
  int n = ctx->size;
  size_t cnt = op->count, b = cnt * ctx->es;
  char *all;
  TC_CHECK(tc__cpu_scratch(ctx, (size_t)(n + h->lsize) * b + 1, (void **)&all));
  char *part = all + (size_t)n * b; /* this host's blocks, reduced over all */
  if (b)
    for (int r = 0; r < n; r++)
      memcpy(all + (size_t)(h->hoff[h->host_of[r]] + h->lidx[r]) * b, op->send[r].buf, b);
  tc_backend_op_t o;
  if (h->local) {
    o = hop(TC_OP_REDUCE, op);
    o.redop = first_redop(op->redop);
    o.root = 0;
    o.recvbuf = all;
    o.count = (size_t)n * cnt;
    TC_CHECK(hier_step(ctx, 1, &o, "reduce to the host's leader"));
  } else if (op->redop.type == TC_PREMUL_SUM && cnt) {
    tc__scale(all, all, (size_t)n * cnt, op->dtype, op->redop.factor);
  }
  if (h->leaders) {
    o = hop(TC_OP_REDUCE_SCATTER_V, op);
    o.redop = later_redop(op->redop);
    for (int j = 0; j < h->nhosts; j++)
      h->blk[j] = (tc_block_t){all + (size_t)h->hoff[j] * b, (size_t)h->hsize[j] * cnt};
    o.send = h->blk;
    o.recvbuf = part;
    o.count = (size_t)h->lsize * cnt;
    TC_CHECK(hier_step(ctx, 0, &o, "reduce_scatter between the hosts' leaders"));
    if (op->redop.type == TC_AVG && cnt)
      tc__divide(part, (size_t)h->lsize * cnt, op->dtype, (uint64_t)n);
  }
  if (h->local) {
    o = hop(TC_OP_SCATTER, op);
    o.root = 0;
    for (int i = 0; i < h->lsize; i++) h->blk[i] = (tc_block_t){part + (size_t)i * b, cnt};
    o.send = h->blk;
    o.recvbuf = op->recvbuf;
    o.count = cnt;
    TC_CHECK(hier_step(ctx, 1, &o, "scatter from the host's leader"));
  } else if (b) {
    memcpy(op->recvbuf, part, b);
  }
  return TC_OK;
}

int tc__cpu_hier_run(cpu_ctx_t *ctx) {
  switch (ctx->op->kind) {
  case TC_KIND_ALL_REDUCE: return h_all_reduce(ctx);
  case TC_KIND_BROADCAST: return h_broadcast(ctx);
  case TC_KIND_REDUCE: return h_reduce(ctx);
  case TC_KIND_BARRIER: return h_barrier(ctx);
  case TC_KIND_ALL_GATHER: return h_all_gather(ctx);
  case TC_KIND_REDUCE_SCATTER: return h_reduce_scatter(ctx);
  default: break;
  }
  return tc__cpu_fail(ctx, TC_ERR_INTERNAL, "internal error: no hierarchical %s",
                      ctx->opname);
}
