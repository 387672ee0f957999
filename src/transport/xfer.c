/* xfer.c -- what both transports share about messages: the check of a
 * received header against the transfer that expects it, the list of
 * transfers still pending (timeout messages), and the operation
 * fingerprints that catch ranks calling different collectives (transport.h). */
#include "transport/transport.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int tc__xfer_hdr_problem(const char *h, uint32_t want_magic, uint32_t epoch,
                         const tc_xfer_t *x, const char *opname, char *why, size_t wl) {
  uint32_t magic, word;
  uint64_t len;
  memcpy(&magic, h, 4);
  memcpy(&word, h + 4, 4);
  memcpy(&len, h + 8, 8);
  uint32_t kind = TC_XFER_KIND(word);
  if (magic != want_magic)
    snprintf(why, wl, "peer %d sent a corrupt message header (magic 0x%08x)", x->peer, magic);
  else if (TC_XFER_EPOCH(word) != (epoch & 0xffffffu))
    snprintf(why, wl, "peer %d sent a message of another configuration of this "
             "communicator (epoch %06x, this one is %06x): a late message of a dead "
             "epoch, dropped unread", x->peer, TC_XFER_EPOCH(word), epoch & 0xffffffu);
  else if (kind != x->kind && kind == TC_XFER_GOODBYE)
    snprintf(why, wl, "peer %d is already in finalize while this rank is in %s (mismatched "
             "operations between ranks?)", x->peer, opname);
  else if (kind != x->kind && kind == TC_XFER_LEFT)
    snprintf(why, wl, "peer %d left the communicator (destroyed or aborted it without "
             "finalize) before its part of %s (it issued fewer operations than this rank?)",
             x->peer, opname);
  else if (kind != x->kind && x->kind == TC_XFER_GOODBYE)
    snprintf(why, wl, "peer %d sent a %llu-byte message while this rank is in finalize (an "
             "operation issued on some ranks only?)", x->peer, (unsigned long long)len);
  else if (kind != x->kind && kind == TC_XFER_FP)
    snprintf(why, wl, "peer %d started a collective operation while this rank is in %s "
             "(mismatched operations between ranks: a collective on some ranks, a "
             "point-to-point operation on others?)", x->peer, opname);
  else if (kind != x->kind && x->kind == TC_XFER_FP)
    snprintf(why, wl, "peer %d sent data of a point-to-point operation while this rank "
             "starts the collective %s (mismatched operations between ranks?)", x->peer,
             opname);
  else if (kind != x->kind)
    snprintf(why, wl, "peer %d sent a message of unknown kind %u", x->peer, kind);
  else if (len != (uint64_t)x->len && kind == TC_XFER_FP)
    snprintf(why, wl, "peer %d sent a %llu-byte operation fingerprint instead of %zu (a "
             "different version of torchcomms?)", x->peer, (unsigned long long)len, x->len);
  else if (len != (uint64_t)x->len)
    snprintf(why, wl, "peer %d sent %llu bytes but %zu were expected (mismatched count or "
             "dtype between ranks?)", x->peer, (unsigned long long)len, x->len);
  else
    return 0;
  return 1;
}


void tc__xfer_pending_text(char *list, size_t len, const tc_xfer_t *x,
                           const int *send_head, const int *recv_head, int size,
                           size_t hdr) {
  size_t l = 0;
  int shown = 0;
  list[0] = 0;
  for (int p = 0; p < size; p++) {
    for (int d = 0; d < 2; d++) {
      int k = d ? send_head[p] : recv_head[p];
      if (k < 0) continue;
      if (shown == 4) {
        snprintf(list + l, len - l, ", ...");
        return;
      }
      size_t got = x[k].done > hdr ? x[k].done - hdr : 0;
      if (got > x[k].len) got = x[k].len;
      int w = snprintf(list + l, len - l, "%speer %d (%s, %zu of %zu bytes done)",
                       shown ? ", " : "", p, d ? "sending" : "receiving", got,
                       x[k].len);
      if (w > 0 && (size_t)w < len - l) l += (size_t)w;
      shown++;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Operation fingerprints                                                    */
/* ------------------------------------------------------------------------ */

static int fp_has_root(uint8_t op) {
  switch (op) {
  case TC_OP_BROADCAST: case TC_OP_REDUCE: case TC_OP_SCATTER: case TC_OP_GATHER:
  case TC_OP_GATHER_SINGLE: return 1;
  default: return 0;
  }
}

/* Appends to buf (length *l so far, capacity len), truncating. */
static void fp_append(char *buf, size_t len, size_t *l, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fp_append(char *buf, size_t len, size_t *l, const char *fmt, ...) {
  if (*l + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(buf + *l, len - *l, fmt, ap);
  va_end(ap);
  if (w > 0) *l += (size_t)w < len - *l ? (size_t)w : len - *l - 1;
}

void tc__opfp_describe(const tc_opfp_t *f, char *buf, size_t len) {
  const char *dt = tc_dtype_name((tc_dtype_t)f->dtype);
  size_t l = 0;
  buf[0] = 0;
  fp_append(buf, len, &l, "%s #%llu", tc_backend_op_name((tc_op_type_t)f->op),
            (unsigned long long)f->seq);
  if (f->op != TC_OP_BARRIER) {
    if (f->flags & TC_OPFP_COUNTS_HASHED)
      fp_append(buf, len, &l, " of %s with per-rank counts #%08llx", dt,
                (unsigned long long)(f->count & 0xffffffffu));
    else if (f->flags & TC_OPFP_COUNTS_PER_PEER)
      fp_append(buf, len, &l, " of %s", dt);
    else
      fp_append(buf, len, &l, " of %llu %s", (unsigned long long)f->count, dt);
  }
  if (f->redop != TC_OPFP_NO_REDOP)
    fp_append(buf, len, &l, " with %s", tc_redop_name((tc_redop_type_t)f->redop));
  if (fp_has_root(f->op))
    fp_append(buf, len, &l, "%s root %d",
              f->op == TC_OP_BROADCAST || f->op == TC_OP_SCATTER ? " from" : " to",
              (int)f->root);
}

int tc__opfp_mismatch(const tc_opfp_t *mine, int rank, const tc_opfp_t *theirs, int peer,
                      char *why, size_t wl) {
  if (mine->seq == theirs->seq && mine->op == theirs->op && mine->dtype == theirs->dtype &&
      mine->redop == theirs->redop && mine->root == theirs->root &&
      mine->flags == theirs->flags &&
      ((mine->flags & TC_OPFP_COUNTS_PER_PEER) || mine->count == theirs->count))
    return 0;
  char a[160], b[160];
  tc__opfp_describe(mine, a, sizeof a);
  tc__opfp_describe(theirs, b, sizeof b);
  /* the lower rank first, so that both sides print the same sentence */
  int lo = rank < peer ? rank : peer;
  snprintf(why, wl, "mismatched collectives: rank %d calls %s, rank %d calls %s; every rank "
           "must issue the same collectives in the same order with the same dtype, count, "
           "root and reduction", lo, lo == rank ? a : b, lo == rank ? peer : rank,
           lo == rank ? b : a);
  return 1;
}
