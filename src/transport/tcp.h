/* tcp.h -- the TCP transport of the cpu backend (the interface every
 * transport implements is in transport.h). */
#ifndef TC_TRANSPORT_TCP_H
#define TC_TRANSPORT_TCP_H

#include "transport/transport.h"

/* ---- TCP ---- */

/* Full mesh of TCP connections (built by tcp_connect.c), authenticated with
 * a random per-communicator token published in the store ("cpu/token";
 * addresses under "cpu/addr/<rank>"; "cpu/host/<host>/<boot id>" counts the
 * ranks per machine to decide on busy-polling, TORCHCOMMS_CPU_SPIN_US
 * overrides). Exchanges are in tcp.c. */
TC_INTERNAL extern const tc_transport_ops_t tc__tcp_transport;

#endif /* TC_TRANSPORT_TCP_H */
