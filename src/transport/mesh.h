/* mesh.h -- the TCP mesh as the other transports use it.
 *
 * Every communicator of the cpu backend first connects its ranks with the
 * TCP transport's full mesh (tcp_connect.c). Where TCP then carries the
 * data, the mesh is the transport; where shared memory does (shm*.c), the
 * mesh stays open underneath as the setup channel (all-gathers, the final
 * barrier of creation) and the liveness channel (a dead peer's sockets
 * close). This header is that interface: the mesh is opaque here, and the
 * shared-memory transport reaches it only through these functions
 * (mesh.c), never through tcp_internal.h. It also holds what both
 * transports share about the machine: how many of the communicator's ranks
 * run on it, and the busy-wait budget that follows from that. */
#ifndef TC_TRANSPORT_MESH_H
#define TC_TRANSPORT_MESH_H

#include "transport/transport.h"

typedef struct tcp tc_mesh_t;

/* Creates the mesh (tc__tcp_create): lazy, a pair is connected when an
 * exchange first needs it (TORCHCOMMS_CPU_EAGER=1: every pair now). TC_OK
 * with *out, or an error with one sentence in err. */
TC_INTERNAL int tc__mesh_create(const tc_tp_args_t *a, tc_mesh_t **out, char *err,
                                size_t errlen);
/* Closes every socket and frees the mesh (NULL: nothing). */
TC_INTERNAL void tc__mesh_close(tc_mesh_t *m);
/* A zero-timeout check of every connection whose peer has not said goodbye:
 * TC_OK, or TC_ERR_REMOTE with op->msg naming the lost peer(s). */
TC_INTERNAL int tc__mesh_check_alive(tc_mesh_t *m, const tc_tp_op_t *op);
/* Tells every peer that this rank leaves (tc_transport_ops_t.leave). */
TC_INTERNAL void tc__mesh_leave(tc_mesh_t *m);
/* Peer p said goodbye (may close any time) / mark that it did. */
TC_INTERNAL int tc__mesh_gone(const tc_mesh_t *m, int p);
TC_INTERNAL void tc__mesh_mark_gone(tc_mesh_t *m, int p);
/* 1 if peer p has left (a TC_XFER_LEFT notice, or a hang-up after data:
 * for a transport whose sockets carry nothing after setup, a cut-off). */
TC_INTERNAL int tc__mesh_left(const tc_mesh_t *m, int p);
/* The communicator's random 16-byte token. */
TC_INTERNAL const unsigned char *tc__mesh_token(const tc_mesh_t *m);
/* Ranks of the communicator on this machine (same host name and boot id),
 * or -1 when unknown. */
TC_INTERNAL int tc__mesh_local(const tc_mesh_t *m);
/* The busy-wait budget before sleeping, seconds (tc__mesh_spin_policy). */
TC_INTERNAL double tc__mesh_spin_s(const tc_mesh_t *m);

/* len bytes from every rank to every rank over the mesh (a barrier that
 * also tells everyone everyone's status): all[p * len] gets rank p's, in
 * ceil(log2 n) steps with the ranks at distances 1, 2, 4, ... (a lazy mesh
 * connects only those). final: the last exchange of creation, after which
 * a peer that completed it may close (hangup_ok). err gets "<what>: " and
 * the one-sentence reason of a failure (tc__mesh_all_gather: "the final
 * barrier of creation" or "the shared-memory setup"). */
TC_INTERNAL int tc__mesh_all_gather_as(tc_mesh_t *m, const char *what, const void *mine,
                                       size_t len, void *all, int final, double deadline,
                                       char *err, size_t errlen);
TC_INTERNAL int tc__mesh_all_gather(tc_mesh_t *m, const void *mine, size_t len, void *all,
                                    int final, double deadline, char *err, size_t errlen);
/* Connects every pair not connected yet (the shared-memory transport's
 * liveness channel: a dead peer's socket closes). */
TC_INTERNAL int tc__mesh_connect_all(tc_mesh_t *m, double deadline, char *err,
                                     size_t errlen);
/* Creation returns on no rank before every rank's setup is complete: an
 * all-to-all after the last step, whose completion tells each rank that
 * all got there. A rank that then drops the communicator (or dies) never
 * fails another's creation: hangup_ok (tcp.c, "Hang-ups"). Closes m on
 * failure. */
TC_INTERNAL int tc__mesh_final_barrier(tc_mesh_t *m, double deadline, char *err,
                                       size_t errlen);

/* ---- the machine, for both transports ---- */

/* "cpu/host/<hostname>/<boot id>": the store key through which the ranks
 * that share it count themselves (they share a machine). */
TC_INTERNAL void tc__mesh_host_key(char *key, size_t len);
/* Busy-polling before sleeping cuts small-message latency several times
 * over, but only pays while every local rank can have a core of its own:
 * TORCHCOMMS_CPU_SPIN_US (microseconds) if set, else 200 us when the `local`
 * ranks on this machine are no more than `ncpu` cores, else 0. */
TC_INTERNAL double tc__mesh_spin_policy(const tc_tp_args_t *a, int local, int ncpu);
/* More ranks than cores (spin_s, the budget tc__mesh_spin_policy gave, is
 * 0 and TORCHCOMMS_CPU_SPIN_US did not say so): how long a waiter polls
 * with sched_yield before it sleeps (TORCHCOMMS_CPU_YIELD_US), shared
 * memory and TCP alike; else 0. */
TC_INTERNAL double tc__mesh_yield_policy(double spin_s);
/* The CPUs this process may run on, a bitmap of cores 0..1023 (the online
 * cores when the mask cannot be read); and the number of cores in such a
 * bitmap. */
#define TC_MESH_CPU_WORDS 16
TC_INTERNAL void tc__mesh_own_cpus(uint64_t cpus[TC_MESH_CPU_WORDS]);
TC_INTERNAL int tc__mesh_cpu_count(const uint64_t cpus[TC_MESH_CPU_WORDS]);

#endif /* TC_TRANSPORT_MESH_H */
