/* test_op_list.c -- the one list of operations (TC_OP_MAP, torchcomms.h) and
 * what is generated from it: names, flags, kinds, and the descriptor the
 * core builds from every call form (tc__op_describe). */
#include <string.h>

#include "core/core.h"
#include "runner.h"

/* Every entry: its name, its kind, flags that agree with the kind. */
TC_TEST(op_list_generated_tables) {
  int n = 0;
#define CHECK_OP(id, name, kind, flags)                                        \
  TC_ASSERT_STR_EQ(tc_op_name(TC_OP_##id), #name);                             \
  TC_ASSERT_EQ(tc_backend_op_kind(TC_OP_##id), TC_KIND_##kind);                \
  TC_ASSERT_EQ(tc_op_flags(TC_OP_##id), (uint32_t)(flags));                    \
  TC_ASSERT_EQ((int)TC_OP_##id, n);                                            \
  n++;
  TC_OP_MAP(CHECK_OP)
#undef CHECK_OP
  TC_ASSERT_EQ(n, TC_OP_TYPE_COUNT);
  for (int t = 0; t < TC_OP_TYPE_COUNT; t++) {
    tc_op_kind_t k = tc_backend_op_kind((tc_op_type_t)t);
    uint32_t f = tc_op_flags((tc_op_type_t)t);
    TC_ASSERT(k < TC_KIND_COUNT);
    /* a reduction only where something is reduced */
    TC_ASSERT_EQ(!!(f & TC_OPF_REDUCE),
                 k == TC_KIND_ALL_REDUCE || k == TC_KIND_REDUCE || k == TC_KIND_REDUCE_SCATTER);
    /* contiguous blocks only on the sides that have blocks */
    if (f & TC_OPF_SEND_CONTIG) TC_ASSERT(k == TC_KIND_REDUCE_SCATTER || k == TC_KIND_ALL_TO_ALL);
    if (f & TC_OPF_RECV_CONTIG)
      TC_ASSERT(k == TC_KIND_ALL_GATHER || k == TC_KIND_ALL_TO_ALL || k == TC_KIND_GATHER);
  }
  TC_ASSERT_STR_EQ(tc_op_name(TC_OP_TYPE_COUNT), "unknown");
  TC_ASSERT_STR_EQ(tc_op_name((tc_op_type_t)-1), "unknown");
  TC_ASSERT_EQ(tc_op_flags(TC_OP_TYPE_COUNT), 0u);
  TC_ASSERT_EQ(tc_backend_op_kind(TC_OP_TYPE_COUNT), TC_KIND_COUNT);
}

/* The three all_gather forms give the same blocks; the uniform one says so. */
TC_TEST(op_list_descriptor_forms) {
  float out[12], a[4], b[4], c[4];
  void *list[3] = {a, b, c};
  size_t v[3] = {1, 0, 3};
  const float in[4] = {1, 2, 3, 4};
  char arrays[512];
  tc_backend_op_t op;
  tc__op_args_t single = {.type = TC_OP_ALL_GATHER_SINGLE, .dtype = TC_FLOAT32, .root = -1,
                          .count = 4, .sendbuf = in, .recvbuf = out};
  TC_ASSERT(tc__op_arrays_size(&single, 1, 3) <= sizeof arrays);
  tc__op_describe(&single, 1, 3, arrays, &op);
  TC_ASSERT_EQ(op.kind, TC_KIND_ALL_GATHER);
  TC_ASSERT(op.send == NULL && op.recv != NULL);
  for (int i = 0; i < 3; i++) {
    TC_ASSERT(op.recv[i].buf == out + 4 * i);
    TC_ASSERT_EQ(op.recv[i].count, 4u);
  }
  TC_ASSERT_EQ(op.flags & (TC_OPF_UNIFORM | TC_OPF_RECV_CONTIG),
               TC_OPF_UNIFORM | TC_OPF_RECV_CONTIG);
  TC_ASSERT_EQ(op.root, -1);
  tc__op_args_t lst = {.type = TC_OP_ALL_GATHER, .dtype = TC_FLOAT32, .root = 7, .count = 4,
                       .sendbuf = in, .recvbufs = list};
  tc__op_describe(&lst, 1, 3, arrays, &op);
  for (int i = 0; i < 3; i++) TC_ASSERT(op.recv[i].buf == list[i] && op.recv[i].count == 4);
  TC_ASSERT_EQ(op.flags & TC_OPF_RECV_CONTIG, 0u);
  TC_ASSERT_EQ(op.root, -1); /* no root: whatever was passed is dropped */
  tc__op_args_t vv = {.type = TC_OP_ALL_GATHER_V, .dtype = TC_FLOAT32, .root = -1, .count = 0,
                      .sendbuf = in, .recvbufs = list, .recvcounts = v};
  tc__op_describe(&vv, 1, 3, arrays, &op);
  for (int i = 0; i < 3; i++) TC_ASSERT(op.recv[i].buf == list[i] && op.recv[i].count == v[i]);
  TC_ASSERT_EQ(op.flags & TC_OPF_UNIFORM, 0u);
  /* all_to_all_v_single: blocks at the running displacements */
  size_t sc[3] = {2, 0, 1}, rc[3] = {1, 1, 1};
  tc__op_args_t a2a = {.type = TC_OP_ALL_TO_ALL_V_SINGLE, .dtype = TC_FLOAT32, .root = -1,
                       .sendbuf = in, .sendcounts = sc, .recvbuf = out, .recvcounts = rc};
  tc__op_describe(&a2a, 0, 3, arrays, &op);
  TC_ASSERT(op.send[0].buf == in && op.send[1].buf == in + 2 && op.send[2].buf == in + 2);
  TC_ASSERT(op.recv[2].buf == out + 2 && op.recv[2].count == 1);
  TC_ASSERT_EQ(op.kind, TC_KIND_ALL_TO_ALL);
  /* scatter: blocks at the root only */
  const void *sb[3] = {a, b, c};
  tc__op_args_t sc0 = {.type = TC_OP_SCATTER, .dtype = TC_FLOAT32, .root = 2, .count = 4,
                       .recvbuf = out, .sendbufs = sb};
  tc__op_describe(&sc0, 0, 3, arrays, &op);
  TC_ASSERT(op.send == NULL);
  TC_ASSERT_EQ(tc__op_arrays_size(&sc0, 0, 3), 0u);
  tc__op_describe(&sc0, 2, 3, arrays, &op);
  TC_ASSERT(op.send != NULL && op.send[1].buf == b && op.root == 2);
}
