/* tcp_listen.h -- the accepting side of the TCP transport's mesh setup
 * (tcp_connect.c): the 36-byte hello (built and parsed by pure functions,
 * fuzzed by tests/fuzz/fuzz_hello.c), the listening socket bound to the
 * published address, and the log of refused connections (once per source,
 * then a count). Not for use outside src/transport/ (and the fuzzers). */
#ifndef TC_TRANSPORT_TCP_LISTEN_H
#define TC_TRANSPORT_TCP_LISTEN_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

#define TC__TCP_HELLO_BYTES 36u
#define TC__TCP_HELLO_MAGIC 0x31484354u /* "TCH1" */
#define TC__TCP_HELLO_VERSION 2u
/* An incoming connection must send a valid hello within this long. */
#define TC__TCP_HELLO_TIMEOUT_S 3.0
/* Unauthenticated connections kept per listener, beyond the peers still
 * expected; past that the oldest is dropped for the newest. */
#define TC__TCP_PENDING_EXTRA 64
/* Sources whose refusals are counted one by one (the rest together). */
#define TC__TCP_REFUSAL_SOURCES 32

/* Writes the hello {magic, version, rank, size, token, epoch} into b[36]. */
TC_INTERNAL void tc__tcp_put_hello(unsigned char *b, int rank, int size, uint32_t epoch,
                                   const unsigned char tok[16]);
/* Parses a hello of len bytes for a communicator of `size` ranks in
 * configuration `epoch` with token tok: the peer's rank (0..size-1), or -1
 * with *why set to a static reason ("a wrong token (another job or
 * communicator?)"). */
TC_INTERNAL int tc__tcp_parse_hello(const unsigned char *b, size_t len,
                                    int size, uint32_t epoch, const unsigned char tok[16],
                                    const char **why);

/* The address this rank binds and publishes: TORCHCOMMS_CPU_IFNAME's
 * address when set (IPv4 first, else IPv6 other than link-local), else
 * `advertise` (NULL or "": 127.0.0.1). TC_OK, or TC_ERR_INVALID_ARGUMENT
 * with one sentence in err naming the interfaces there are. */
TC_INTERNAL int tc__tcp_pick_addr(const char *advertise, char *addr,
                                  size_t len, char *err, size_t errlen);
/* Listens on an ephemeral port of addr (a numeric address or a name).
 * When addr is no address of this host (bind: EADDRNOTAVAIL, e.g. a NAT's
 * address in TORCHCOMMS_SOCKET_ADDR) listens on every interface instead
 * and sets *everywhere to 1; to 2 for a name of several addresses (peers
 * may reach any). TC_OK with *fd and *port, or an error with err. */
TC_INTERNAL int tc__tcp_listen_on(const char *addr, int backlog, int *fd,
                                  int *port, int *everywhere, char *err,
                                  size_t errlen);

/* Refused incoming connections of one setup, by source address. */
typedef struct tc__tcp_refusals {
  struct {
    char ip[64];
    unsigned long n;
    char first[96]; /* why the first one was refused */
  } src[TC__TCP_REFUSAL_SOURCES];
  int nsrc;
  unsigned long other; /* from sources beyond the table */
  unsigned long total;
  int at_close; /* 0: reported at the end of creation; 1: when the
                 * communicator closes (a lazy mesh listens all its life) */
} tc__tcp_refusals_t;

/* Counts a connection from ip refused for `why`; the first one from each
 * source is logged at once (a warning of subsystem tcp, through the host's
 * log with prefix `who`), the others only counted. */
TC_INTERNAL void tc__tcp_refused(tc__tcp_refusals_t *r, const tc_backend_host_t *host,
                                 const char *who, const char *ip,
                                 const char *why);
/* Logs one line per source refused more than once: the count. */
TC_INTERNAL void tc__tcp_refusals_report(const tc__tcp_refusals_t *r,
                                         const tc_backend_host_t *host,
                                         const char *who);

#endif /* TC_TRANSPORT_TCP_LISTEN_H */
