/* tcp.h -- the TCP transport of the cpu backend (the interface every
 * transport implements is in transport.h). */
#ifndef TC_TRANSPORT_TCP_H
#define TC_TRANSPORT_TCP_H

#include "transport/transport.h"

/* ---- TCP ---- */

/* A mesh of TCP connections, each made when a pair first exchanges
 * (tcp_connect.c; TORCHCOMMS_CPU_EAGER=1: every pair at creation),
 * authenticated with a random per-communicator token published in the store
 * ("cpu/token"; addresses under "cpu/addr/<rank>"; the ranks' hosts are
 * all-gathered at creation and decide busy-polling, TORCHCOMMS_CPU_SPIN_US
 * overrides). Exchanges are in tcp.c. */
TC_INTERNAL extern const tc_transport_ops_t tc__tcp_transport;

/* The TCP transport's busy-poll budget before sleeping in poll, seconds
 * (TORCHCOMMS_CPU_TCP_SPIN_US, default the machine's spin policy); 0 when
 * (ops, tp) is another transport. */
TC_INTERNAL double tc__tcp_poll_spin_s(const tc_transport_ops_t *ops, void *tp);
/* The TCP transport's view of the machines: hosts[r] is a hash of rank r's
 * host name and boot id (equal hashes: the same machine), found at
 * creation. NULL when tp is not the TCP transport. */
TC_INTERNAL const uint64_t *tc__tcp_host_ids(const tc_transport_ops_t *ops, void *tp);

/* ---- sockets of the one-sided window service (tcp_winsock.c) ---- */

/* Listens on an ephemeral port of the address this rank publishes
 * (TORCHCOMMS_CPU_IFNAME, else `advertise`, else 127.0.0.1): TC_OK with
 * *fd, *port and the address peers connect to in addr, or an error with
 * one sentence in err. */
TC_INTERNAL int tc__winsock_listen(const char *advertise, int *fd, int *port, char *addr,
                                   size_t alen, char *err, size_t errlen);
/* Connects to addr:port (blocking socket, TCP_NODELAY) before `deadline`
 * (tc__now clock), giving up at once when wake_fd (-1: none) becomes
 * readable. TC_OK with *fd, TC_ERR_TIMEOUT, TC_ERR_ABORTED or
 * TC_ERR_SYSTEM with err. */
TC_INTERNAL int tc__winsock_connect(const char *addr, int port, double deadline, int wake_fd,
                                    int *fd, char *err, size_t errlen);
/* Moves exactly len bytes (write: is_send) on blocking socket fd before
 * deadline, watching wake_fd (-1: none). TC_OK; TC_ERR_REMOTE (the peer
 * closed or reset: *closed = 1), TC_ERR_TIMEOUT, TC_ERR_ABORTED or
 * TC_ERR_SYSTEM, with errno's text in err. */
TC_INTERNAL int tc__winsock_io(int fd, int is_send, void *buf, size_t len, double deadline,
                               int wake_fd, char *err, size_t errlen);

#endif /* TC_TRANSPORT_TCP_H */
