/* log_op.c -- one trace line per operation event (TORCHCOMMS_LOG=trace):
 *
 *   coll: all_reduce #12 on 'main' (rank 1 of 4) float32 x1024 (4096 B) sum issued
 *   coll: all_reduce #12 on 'main' (rank 1 of 4) float32 x1024 (4096 B) sum done ok in 35.2 us
 *   p2p: send #3 on 'main' (rank 0 of 2) to peer 1 int32 x8 (32 B) failed after 1.2 ms: <error>
 *
 * The op path calls tc__log_op("issue", info) when it posts an operation and
 * tc__log_op("done", info) when it ends, with the info its hooks get
 * (tc_op_info_t, torchcomms.h). Send, recv and batches log under subsystem
 * p2p, everything else under coll. */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* 1 when info (of info->size bytes) holds the member ending at `end`. */
#define HAS(info, member)                                                     \
  ((info)->size >= offsetof(tc_op_info_t, member) + sizeof((info)->member))

static int is_p2p(tc_op_type_t t) {
  return t == TC_OP_SEND || t == TC_OP_RECV || t == TC_OP_BATCH;
}

/* "35.2 us", "1.20 ms", "2.50 s". */
static void duration_text(double s, char *buf, size_t len) {
  if (s < 0) s = 0;
  if (s < 1e-3) snprintf(buf, len, "%.1f us", s * 1e6);
  else if (s < 1.0) snprintf(buf, len, "%.2f ms", s * 1e3);
  else snprintf(buf, len, "%.2f s", s);
}

/* "all_reduce #12 on 'main' (rank 1 of 4) float32 x1024 (4096 B) sum". */
static void describe(const tc_op_info_t *in, char *buf, size_t len) {
  size_t at = 0;
#define PUT(...) tc__appendf(buf, len, &at, __VA_ARGS__)
  const char *name = in->name ? in->name : tc_backend_op_name(in->type);
  PUT("%s #%llu on '%s' (rank %d of %d)", name, (unsigned long long)in->op_id,
      in->comm_name ? in->comm_name : "?", in->rank, in->comm_size);
  uint32_t flags = tc_backend_op_flags(in->type);
  if (in->root >= 0 && (flags & TC_OPF_PEER))
    PUT(" %s peer %d", in->type == TC_OP_RECV ? "from" : "to", in->root);
  else if (in->root >= 0)
    PUT(" root %d", in->root);
  if (in->type != TC_OP_BARRIER && in->type != TC_OP_BATCH)
    PUT(" %s x%zu", tc_dtype_name(in->dtype), in->count);
  size_t inb = in->in_bytes, outb = in->out_bytes;
  if (inb == outb || !inb || !outb)
    PUT(" (%zu B)", inb > outb ? inb : outb);
  else
    PUT(" (%zu B in, %zu B out)", inb, outb);
  if (in->redop >= 0) { /* "sum", as torch spells it in lower case */
    char op[32];
    snprintf(op, sizeof op, "%s", tc_redop_name((tc_redop_type_t)in->redop));
    for (char *p = op; *p; p++) *p = (char)tolower((unsigned char)*p);
    PUT(" %s", op);
  }
  if (in->async_op) PUT(" async");
#undef PUT
}

void tc__log_op(const char *event, const tc_op_info_t *info) {
  if (!tc__log_on(TC_LOG_TRACE, TC_LOG_COLL | TC_LOG_P2P)) return;
  if (!info || !event || !HAS(info, timeout_s)) return;
  int subsys = is_p2p(info->type) ? TC_LOG_P2P : TC_LOG_COLL;
  if (!tc__log_on(TC_LOG_TRACE, subsys)) return;
  char what[512];
  describe(info, what, sizeof what);
  if (strcmp(event, "done") != 0 || !HAS(info, error)) {
    tc__logs(TC_LOG_TRACE, subsys, "%s %s", what,
             strcmp(event, "issue") == 0 ? "issued" : event);
    return;
  }
  char took[32];
  duration_text(info->duration_s, took, sizeof took);
  if (info->status == TC_OK)
    tc__logs(TC_LOG_TRACE, subsys, "%s done ok in %s", what, took);
  else
    tc__logs(TC_LOG_TRACE, subsys, "%s %s after %s: %s", what,
             info->work_status == TC_WORK_TIMEDOUT ? "timed out" : "failed", took,
             info->error && info->error[0] ? info->error : tc_strerror(info->status));
}
