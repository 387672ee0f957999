/* fuzz_store_proto.c -- the store server's request handling: the scanner
 * of torch's TCPStore protocol (tc__store_req_scan) on the raw bytes, with
 * its promises checked, then the whole server path without sockets
 * (tc__store_server_fuzz: two clients' byte streams parsed, executed and
 * answered under small limits, the memory accounting checked after every
 * chunk). Input: chunks of one byte (bit 7: which client, bits 0-6:
 * length) and that many bytes (tests/fuzz/make_corpus.py writes seeds). */
#include <stdio.h>
#include <stdlib.h>

#include "bootstrap/store_server.h"

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "fuzz_store_proto: %s:%d: %s\n", __FILE__, __LINE__, #c); \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* The scanner's promises for one buffer and limit. */
static void check_scan(const uint8_t *data, size_t size, uint64_t max_value) {
  tc__store_req_t r;
  int w = tc__store_req_scan(data, size, max_value, &r);
  switch (w) {
  case TC__REQ_COMPLETE:
    CHECK(r.len >= 1 && r.len <= size);
    CHECK(data[0] < TC__Q_COUNT && r.type == data[0]);
    /* a complete request is complete in any longer buffer, same length */
    {
      tc__store_req_t r2;
      CHECK(tc__store_req_scan(data, r.len, max_value, &r2) == TC__REQ_COMPLETE);
      CHECK(r2.len == r.len);
    }
    break;
  case TC__REQ_INCOMPLETE:
    CHECK(r.need > size);
    CHECK(r.need <= max_value + TC__STORE_REQ_SLACK + 8);
    break;
  case TC__REQ_UNKNOWN:
    CHECK(size > 0 && data[0] >= TC__Q_COUNT);
    break;
  case TC__REQ_TOO_BIG:
    CHECK(r.why != NULL && r.bad > r.limit);
    break;
  default:
    CHECK(!"unknown scan result");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* the scanner on the bytes as they are, and after each chunk header */
  check_scan(data, size, 1024);
  check_scan(data, size, (uint64_t)1 << 34);
  if (size > 1) check_scan(data + 1, size - 1, 64);
  tc__store_server_fuzz(data, size);
  return 0;
}
