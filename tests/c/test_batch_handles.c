/* test_batch_handles.c -- batch handles are slot + generation (ops.c): memory
 * stays bounded over many create/free cycles, and a freed handle stays an
 * error even once its slot holds a new batch. */
#include <stdint.h>
#include <unistd.h>

#include "runner.h"

static tc_comm_t *world1(void) {
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_world1_create("batches", "cpu", &c));
  return c;
}

TC_TEST(batch_handles_memory_flat_over_100k_cycles) {
  tc_comm_t *c = world1();
  float a[4] = {1, 2, 3, 4}, b[4];
  long before = 0;
  for (int i = 0; i < 110000; i++) {
    if (i == 10000) before = tc_rss_kib(); /* after warm-up */
    tc_batch_t *bt = NULL;
    TC_ASSERT_OK(tc_batch_create(c, &bt));
    TC_ASSERT_OK(tc_batch_send(bt, a, 4, TC_FLOAT32, 0));
    TC_ASSERT_OK(tc_batch_recv(bt, b, 4, TC_FLOAT32, 0));
    if (i % 100 == 0) TC_ASSERT_OK(tc_batch_issue(bt, NULL, NULL));
    TC_ASSERT_OK(tc_batch_free(bt));
  }
  long after = tc_rss_kib();
  printf("  RSS after warm-up %ld KiB, after 100000 more batches %ld KiB\n", before, after);
  TC_ASSERT(after - before < 1024);
  TC_ASSERT_EQ((long long)b[3], 4);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(batch_handles_stale_and_foreign_are_errors) {
  tc_comm_t *c = world1();
  float x = 1;
  tc_batch_t *old = NULL, *fresh = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &old));
  TC_ASSERT_OK(tc_batch_free(old));
  TC_ASSERT_OK(tc_batch_create(c, &fresh)); /* very likely the same slot */
  TC_ASSERT(fresh != old);
  TC_ASSERT_ERR(tc_batch_send(old, &x, 1, TC_FLOAT32, 0), TC_ERR_INVALID_USAGE,
                "batch.send: argument 'batch' is not a live batch handle (freed already");
  TC_ASSERT_ERR(tc_batch_issue(old, NULL, NULL), TC_ERR_INVALID_USAGE, "not a live batch");
  TC_ASSERT_ERR(tc_batch_free(old), TC_ERR_INVALID_USAGE, "freed already");
  TC_ASSERT_OK(tc_batch_send(fresh, &x, 1, TC_FLOAT32, 0)); /* the new one is unharmed */
  TC_ASSERT_OK(tc_batch_recv(fresh, &x, 1, TC_FLOAT32, 0));
  TC_ASSERT_OK(tc_batch_issue(fresh, NULL, NULL));
  TC_ASSERT_OK(tc_batch_free(fresh));
  TC_ASSERT_ERR(tc_batch_free(fresh), TC_ERR_INVALID_USAGE, "freed already");
  /* something that never was a handle: an error, never a dereference */
  static int not_a_batch[8];
  TC_ASSERT_ERR(tc_batch_free((tc_batch_t *)(void *)not_a_batch), TC_ERR_INVALID_USAGE,
                "is not a live batch handle");
  TC_ASSERT_ERR(tc_batch_free((tc_batch_t *)(uintptr_t)0xdead0004u), TC_ERR_INVALID_USAGE,
                "batch");
  TC_ASSERT_ERR(tc_batch_free(NULL), TC_ERR_INVALID_ARGUMENT, "is NULL");
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}
