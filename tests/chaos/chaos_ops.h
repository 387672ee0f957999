/* chaos_ops.h -- the operations of the chaos worker (chaos_ops.c): one
 * randomly chosen operation of libtorchcomms at a random size, with its
 * buffers, its exact expected result and its check.
 *
 * Every rank draws the same operation for step k from the same seed
 * (chaos_op_draw), so that all ranks issue matching operations; the values
 * each rank sends are a function of (source, destination, index, step), so
 * that every rank can compute what it must receive without talking to the
 * others. Reductions use small integers (1..4, or 1..2 for PRODUCT), exact
 * in every dtype used (float32, float64, bfloat16, int32, int64, uint8) for
 * up to 8 ranks, so results are compared for equality, never with a
 * tolerance. */
#ifndef TC_CHAOS_OPS_H
#define TC_CHAOS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "torchcomms.h"

#define CHAOS_OP_MAP(X)                                                        \
  X(ALL_REDUCE, "all_reduce")                                                  \
  X(REDUCE, "reduce")                                                          \
  X(BROADCAST, "broadcast")                                                    \
  X(ALL_GATHER, "all_gather")                                                  \
  X(ALL_GATHER_V, "all_gather_v")                                              \
  X(ALL_GATHER_SINGLE, "all_gather_single")                                    \
  X(REDUCE_SCATTER, "reduce_scatter")                                          \
  X(REDUCE_SCATTER_V, "reduce_scatter_v")                                      \
  X(REDUCE_SCATTER_SINGLE, "reduce_scatter_single")                            \
  X(ALL_TO_ALL, "all_to_all")                                                  \
  X(ALL_TO_ALL_SINGLE, "all_to_all_single")                                    \
  X(ALL_TO_ALL_V_SINGLE, "all_to_all_v_single")                                \
  X(SCATTER, "scatter")                                                        \
  X(GATHER, "gather")                                                          \
  X(GATHER_SINGLE, "gather_single")                                            \
  X(BARRIER, "barrier")                                                        \
  X(SEND_RECV, "send/recv")                                                    \
  X(BATCH, "batch")

typedef enum {
#define CHAOS_OP_ENUM(e, s) CHAOS_##e,
  CHAOS_OP_MAP(CHAOS_OP_ENUM)
#undef CHAOS_OP_ENUM
  CHAOS_NOPS
} chaos_kind_t;

#define CHAOS_MAX_RANKS 8
#define CHAOS_MAX_MSGS (CHAOS_MAX_RANKS * 2) /* batch: messages per peer pair */

/* One operation in flight on one rank: what was drawn, the buffers, and
 * (asynchronous) its work objects. */
typedef struct chaos_op {
  chaos_kind_t kind;
  uint64_t step;
  int rank, size;
  tc_dtype_t dt;
  tc_redop_t red;
  int root;
  int inplace;
  size_t count;                                /* per-rank count */
  size_t counts[CHAOS_MAX_RANKS];              /* _v forms: per-rank counts */
  size_t m[CHAOS_MAX_RANKS][CHAOS_MAX_RANKS];  /* all_to_all: src x dst */
  int partner[CHAOS_MAX_RANKS]; /* send/recv: a random matching (-1: none) */
  uint8_t nmsg[CHAOS_MAX_RANKS][CHAOS_MAX_RANKS]; /* batch: messages src->dst */
  size_t mcount[CHAOS_MAX_RANKS][CHAOS_MAX_RANKS][2];
  /* buffers */
  void *buf;                      /* in/out, recvbuf or sendbuf of _single */
  void *buf2;                     /* the other of a _single pair */
  void *sendv[CHAOS_MAX_RANKS];   /* list forms */
  void *recvv[CHAOS_MAX_RANKS];
  void *bsend[CHAOS_MAX_RANKS][2], *brecv[CHAOS_MAX_RANKS][2]; /* batch */
  tc_batch_t *batch;
  tc_work_t *work[2];
  int nwork;
} chaos_op_t;

/* The operation of step k, the same on every rank (seed shared by all). */
void chaos_op_draw(chaos_op_t *op, uint64_t seed, uint64_t step, int rank,
                   int size, size_t max_count);
/* Allocates and fills the buffers. Returns 0, or -1 when out of memory. */
int chaos_op_prepare(chaos_op_t *op);
/* Issues the operation (work objects in op->work when async). Returns the
 * first failing status; *msg then holds its text. */
int chaos_op_issue(chaos_op_t *op, tc_comm_t *comm, int async,
                   const char **msg);
/* Waits for the work objects of an async operation. */
int chaos_op_wait(chaos_op_t *op, const char **msg);
/* Checks the result exactly; returns 0, or -1 with a description in why. */
int chaos_op_check(const chaos_op_t *op, char *why, size_t len);
/* Proves the check can fail: corrupts one element of each buffer holding a
 * result in turn and expects chaos_op_check to notice (then restores it).
 * Returns 0, or -1 with what went unnoticed in why. */
int chaos_op_selftest(chaos_op_t *op, char *why, size_t len);
/* Releases buffers and work objects. */
void chaos_op_free(chaos_op_t *op);
const char *chaos_op_name(chaos_kind_t k);

#endif
