/* shm.h -- the shared-memory transport of the cpu backend, for communicators
 * whose ranks all run on one machine (same host name and boot id).
 *
 * Every rank owns one segment (shm_open + ftruncate + mmap, sized once at
 * init: TORCHCOMMS_SHM_BYTES), which every other rank maps too; once all
 * have mapped all, each unlinks its own name, so nothing is left in /dev/shm
 * even if ranks are killed later. A rank killed before that leaves its name;
 * the name says which process made it, and the next shared-memory setup on
 * the host (or tcrun at the end of its job) removes it (shm_sweep.c). A
 * segment holds:
 *  - a control page: the owner's doorbell (a futex word others ring when the
 *    owner sleeps) and its sync flag (see below);
 *  - one single-producer / single-consumer byte ring per peer, carrying that
 *    peer's messages to the owner: the exchange of transport.h, with the same
 *    stream FIFO semantics and 16-byte length headers as TCP;
 *  - a collective area for the backend's fast paths: two small slots and two
 *    big halves, which peers read directly.
 * The TCP mesh stays open as the liveness channel: a dead peer's sockets
 * close, which every wait notices within milliseconds.
 *
 * Waiting: spin for the TCP transport's busy-poll time (only when the ranks
 * on the machine are no more than its cores), then sleep on the own doorbell
 * (FUTEX_WAIT, shared, at most SHM_NAP_S at a time), checking the abort
 * flag, the deadline and the peers' sockets in between. */
#ifndef TC_TRANSPORT_SHM_H
#define TC_TRANSPORT_SHM_H

#include "transport/transport.h"
#include "private_api.h" /* tc__shm_sweep, declared there too */

TC_INTERNAL extern const tc_transport_ops_t tc__shm_transport;

/* ---- shared areas for the core (shm_board.c) ---- */

/* Creates and maps a new area of `bytes` (zeroed) whose name (written to
 * name) says who made it, like the transport's segments, so a leftover is
 * swept. TC_OK or TC_ERR_SYSTEM (errno set). */
TC_INTERNAL int tc__shm_area_create(const char *tag, size_t bytes, char *name, size_t len,
                                    void **mem);
/* Maps the area `name` made on this host; TC_ERR_SYSTEM when there is none
 * (another host or pid namespace) or it is smaller than bytes. */
TC_INTERNAL int tc__shm_area_open(const char *name, size_t bytes, void **mem);
TC_INTERNAL void tc__shm_area_unlink(const char *name);
TC_INTERNAL void tc__shm_area_unmap(void *mem, size_t bytes);

/* ---- the collective area, for the backend's fast paths ---- */

typedef struct tc_shm tc_shm_t;

/* The shm transport behind (ops, tp), or NULL when it is another one. */
TC_INTERNAL tc_shm_t *tc__shm_of(const tc_transport_ops_t *ops, void *tp);

/* Small slots per rank: the k-th sync point of the communicator uses slot
 * k % TC_SHM_SLOTS (a ring, so that a broadcast root may run up to
 * TC_SHM_SLOTS - 1 operations ahead of its receivers). */
#define TC_SHM_SLOTS 4
/* Header lines per rank: a second, deeper ring, of single cache lines, for
 * operations whose header and data fit in one line (8-byte collectives,
 * barriers): the k-th sync point of such an operation uses line k %
 * TC_SHM_LINES, so that the root of an 8-byte broadcast may run up to
 * TC_SHM_LINES - 1 operations ahead (its receivers then find the root's
 * next lines written and fetch them ahead: 2 ranks, 0.26 -> 0.19 us per
 * broadcast; docs/benchmarks.md, "Broadcast 8 B: a ring of header lines").
 * A deeper ring of the 64 KiB slots would cost operations of 4-64 KiB
 * their caches (a lap no longer fits; 16 slots: 4 KiB all_reduce 1.1 -> 1.3
 * us). The
 * lines lie as far apart as the slots: packed into one page, or 8-16 KiB
 * apart, they made the 8-byte all_reduce 0.28 -> 0.34 us on the machine we
 * measure (32 KiB apart and more: no difference); address space and
 * /dev/shm cost 2 MiB per segment, of which 32 pages are ever touched. */
#define TC_SHM_LINES 32
#define TC_SHM_LINE_STRIDE (64u * 1024u)
/* Where the slots, lines and halves lie (the geometry is identical on every
 * rank), for callers that address them on every operation (the cpu
 * backend's fast paths): small slot i (0 ..
 * TC_SHM_SLOTS-1) of rank r's segment at base[r] + off_slot + i *
 * slot_bytes, header line i (0 .. TC_SHM_LINES-1) at base[r] + off_line +
 * i * TC_SHM_LINE_STRIDE, big half i (0 or 1) at base[r] + off_half + i *
 * half_bytes, each area 4 KiB aligned; base[r] is valid until the
 * transport closes. */
typedef struct tc_shm_areas {
  char *const *base;
  size_t off_slot, off_half, slot_bytes, half_bytes, off_line;
} tc_shm_areas_t;
TC_INTERNAL void tc__shm_areas(const tc_shm_t *s, tc_shm_areas_t *a);

/* Sync flags. Every rank has one monotonic counter, written only by itself;
 * a collective sync point s is "rank r has reached s" (flag >= s). */
TC_INTERNAL uint64_t tc__shm_flag(tc_shm_t *s, int r);
/* Rank r's second word, written only by r, read by every rank (the cpu
 * backend's lowest sync point whose peers' headers r has not yet checked,
 * 0: none; shm_algos.c). Zero at creation. */
TC_INTERNAL _Atomic uint64_t *tc__shm_aux(tc_shm_t *s, int r);
/* Publishes the own flag (release: what was written before is visible to a
 * reader that sees the flag) and wakes sleeping peers. */
TC_INTERNAL void tc__shm_post(tc_shm_t *s, uint64_t v);
/* The same, without the fence where this process posts light (shm.c,
 * shm_post_flag): every rank of a small broadcast (its root does not wait
 * on its receivers next; a receiver's fence waited for its header line,
 * which the root had read). Ranks of all_reduce, all_gather,
 * reduce_scatter and the message rings gain nothing from it: measured
 * slower or the same at 8 B (docs/benchmarks.md, "Posts without a fence"
 * and "The broadcast's receivers post without a fence"). */
TC_INTERNAL void tc__shm_post_light(tc_shm_t *s, uint64_t v);
/* Waits until rank r's flag >= v: spins up to spin_s (never when the
 * machine is oversubscribed, see tc__shm_spin_s), then, if may_sleep,
 * sleeps until the deadline; otherwise returns 1 (not yet). Fails with
 * TC_ERR_ABORTED, TC_ERR_TIMEOUT or TC_ERR_REMOTE (a dead peer), op->msg
 * filled in. */
TC_INTERNAL int tc__shm_wait_flag(tc_shm_t *s, int r, uint64_t v, double spin_s,
                                  int may_sleep, const tc_tp_op_t *op);
/* 1 if every rank of the communicator can read every other's memory with
 * process_vm_readv (probed once at setup; TORCHCOMMS_CPU_CMA=0: never). */
TC_INTERNAL int tc__shm_cma(const tc_shm_t *s);
/* Copies len bytes at `remote` in rank q's address space to dst (single
 * copy). Fails with TC_ERR_REMOTE (the peer is gone or its memory cannot be
 * read), op->msg filled in. */
TC_INTERNAL int tc__shm_read_peer(tc_shm_t *s, int q, void *dst, uint64_t remote, size_t len,
                                  const tc_tp_op_t *op);
/* Copies len bytes from src to `remote` in rank q's address space (single
 * copy, process_vm_writev). TC_OK, or TC_ERR_REMOTE with the reason in why. */
TC_INTERNAL int tc__shm_write_peer(tc_shm_t *s, int q, uint64_t remote, const void *src,
                                   size_t len, char *why, size_t wl);
/* 1 while rank q's process may be running, 0 once it is certainly gone
 * (exited, even unreaped: shm_sweep.c's test of a segment's creator). */
TC_INTERNAL int tc__shm_peer_alive(const tc_shm_t *s, int q);
/* tc__shm_wait_flag on any word of rank r's segment that r writes before it
 * posts (release) its flag: a waiter that sees the word need not fetch the
 * flag's cache line too. The word must not decrease. or_flag 1: also done
 * (TC_OK) once r's flag is >= v, looked at only once the wait has turned
 * to sleeping (for a word that r may have written elsewhere instead: the
 * caller then finds out where). */
TC_INTERNAL int tc__shm_wait_word(tc_shm_t *s, int r, const _Atomic uint64_t *word,
                                  uint64_t v, double spin_s, int may_sleep, int or_flag,
                                  const tc_tp_op_t *op);
/* The spin time the transport uses before sleeping (0 when oversubscribed). */
TC_INTERNAL double tc__shm_spin_s(const tc_shm_t *s);
/* How many times a wait on s has read the clock (it did not find its word
 * within its first few pauses, or the machine is oversubscribed): a caller
 * that sees the count unchanged over an operation knows that no wait of it
 * took more than about a microsecond (SHM_PRESPIN). Any thread's waits
 * count; it only grows. */
TC_INTERNAL uint64_t tc__shm_clock_waits(const tc_shm_t *s);
/* How many messages this rank wrote straight into a peer's receive buffer
 * (direct delivery, shm.c) instead of through the ring; only grows. */
TC_INTERNAL uint64_t tc__shm_direct_writes(const tc_shm_t *s);
/* A peer q is writing into this rank's memory (process_vm_writev) while
 * this rank gives up on the operation: waits until writing(arg) says the
 * write ended or q's process has exited, at most timeout_s more (600 when
 * <= 0), so that a peer stopped inside its write (a debugger, SIGSTOP)
 * does not hold this rank forever. 1 if it ran out with the write still
 * going (the buffer may still change: the caller's error says so), else
 * 0. Direct delivery (shm.c, rtr_revoke) and the 2-rank broadcast's gate
 * (shm_algos.c, bcast_abandon). */
TC_INTERNAL int tc__shm_wait_write_end(tc_shm_t *s, int q, int (*writing)(void *), void *arg,
                                       double timeout_s);
/* The message ring from rank p to rank q (one of them this rank) in this
 * process's mappings, and its size: for the test that its pages are
 * mapped from setup on (shm_setup.c, shm_populate_ring). */
TC_INTERNAL char *tc__shm_ring_at(tc_shm_t *s, int p, int q, size_t *bytes);
/* The state of this rank's last post for a message from p (shm.c, "Direct
 * delivery"): 0 none, 1 posted, 2 claimed by p, 3 taken back. For tests. */
TC_INTERNAL int tc__shm_post_state(tc_shm_t *s, int p);

/* Removes from /dev/shm every segment name of this transport whose creating
 * process is dead (killed before it could unlink it); returns how many
 * (shm_sweep.c). Called at shared-memory setup and by tcrun at job end. */
TC_INTERNAL int tc__shm_sweep(void);

#endif /* TC_TRANSPORT_SHM_H */
