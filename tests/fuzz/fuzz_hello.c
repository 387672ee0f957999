/* fuzz_hello.c -- the hello of the TCP transport's connection setup
 * (tc__tcp_parse_hello, src/transport/tcp_listen.c), the first bytes any
 * stranger on a listening port can send. Input: one byte choosing the world
 * size (1 + b % 8), then the bytes received. A hello is accepted only when
 * it is exactly what tc__tcp_put_hello writes for some rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp_listen.h"

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "fuzz_hello: %s:%d: %s\n", __FILE__, __LINE__, #c);      \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static const unsigned char token[16] = "torchcomms-fuzz";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int world = 1 + data[0] % 8;
  const char *why = NULL;
  int r = tc__tcp_parse_hello(data + 1, size - 1, world, 0, token, &why);
  if (r >= 0) {
    CHECK(r < world && why == NULL);
    unsigned char want[TC__TCP_HELLO_BYTES];
    tc__tcp_put_hello(want, r, world, 0, token);
    CHECK(memcmp(want, data + 1, sizeof want) == 0);
  } else {
    CHECK(r == -1 && why != NULL && why[0] != 0);
  }
  return 0;
}
