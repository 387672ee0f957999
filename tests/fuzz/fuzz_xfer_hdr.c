/* fuzz_xfer_hdr.c -- the check of a received message header of the TCP
 * (and shared-memory) transport against the transfer that expects it
 * (tc__xfer_hdr_problem, src/transport/tcp.c). Input: the 16 header bytes,
 * then what the receiver expects: kind (1 byte: 1 data, 2 goodbye, else the
 * byte itself), length (8 bytes), peer (4 bytes) and the size of the reason
 * buffer (1 byte). The header must be accepted exactly when magic, kind and
 * length match, and a reason must be a NUL-terminated sentence that fits.
 * The bytes after those 30, when 48 more are there, are two operation
 * fingerprints (tc_opfp_t, transport.h): a peer's fingerprint is network
 * input too. tc__opfp_mismatch must report a mismatch exactly when they
 * differ in what is compared, with a NUL-terminated sentence. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp_internal.h"

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "fuzz_xfer_hdr: %s:%d: %s\n", __FILE__, __LINE__, #c);   \
      abort();                                                                 \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 16 + 1 + 8 + 4 + 1) return 0;
  char *h = malloc(16); /* exactly a header, so a longer read is caught */
  memcpy(h, data, 16);
  tc_xfer_t x = {0};
  x.kind = data[16];
  memcpy(&x.len, data + 17, sizeof x.len < 8 ? sizeof x.len : 8);
  int32_t peer;
  memcpy(&peer, data + 25, 4);
  x.peer = peer;
  size_t wl = data[29];
  char *why = malloc(wl ? wl : 1);
  if (wl) memset(why, 'x', wl);
  int bad = tc__xfer_hdr_problem(h, TCP_MSG_MAGIC, 0, &x, "all_reduce", why, wl);
  uint32_t magic, kind;
  uint64_t len;
  memcpy(&magic, h, 4);
  memcpy(&kind, h + 4, 4);
  memcpy(&len, h + 8, 8);
  int match = magic == TCP_MSG_MAGIC && kind == x.kind && len == (uint64_t)x.len;
  CHECK(bad == !match);
  if (bad && wl) CHECK(memchr(why, 0, wl) != NULL && (wl == 1 || why[0] != 0));
  free(why);
  free(h);
  if (size >= 30 + 2 * sizeof(tc_opfp_t)) {
    tc_opfp_t a, b;
    memcpy(&a, data + 30, sizeof a);
    memcpy(&b, data + 30 + sizeof a, sizeof b);
    char text[512];
    memset(text, 'x', sizeof text);
    int differ = tc__opfp_mismatch(&a, 0, &b, 1, text, sizeof text);
    int same = a.seq == b.seq && a.op == b.op && a.dtype == b.dtype && a.redop == b.redop &&
               a.root == b.root && a.flags == b.flags &&
               ((a.flags & TC_OPFP_COUNTS_PER_PEER) || a.count == b.count);
    CHECK(differ == !same);
    if (differ) CHECK(memchr(text, 0, sizeof text) != NULL);
    CHECK(tc__opfp_mismatch(&a, 0, &a, 1, text, sizeof text) == 0);
  }
  return 0;
}
