/* test_store_counts.c -- the per-process store request counter
 * (tc__store_counts, src/private_api.h) that tools/tcscale.c measures
 * bootstrap cost with: exact counts by kind on the memory store, a prefix
 * store counted once (on its base), a custom store's polled wait, argument
 * errors not counted, and the TCP client's connections. */
#include "private_api.h"
#include "runner.h"

/* The counts must be exactly set, get, add, check, wait, delete, connect
 * and `keys` keys in all. */
static void expect_counts(unsigned long long set, unsigned long long get,
                          unsigned long long add, unsigned long long check,
                          unsigned long long wait, unsigned long long del,
                          unsigned long long connect,
                          unsigned long long keys) {
  tc__store_counts_t c;
  tc__store_counts(&c);
  TC_ASSERT_EQ(c.n[TC__SREQ_SET], set);
  TC_ASSERT_EQ(c.n[TC__SREQ_GET], get);
  TC_ASSERT_EQ(c.n[TC__SREQ_ADD], add);
  TC_ASSERT_EQ(c.n[TC__SREQ_CHECK], check);
  TC_ASSERT_EQ(c.n[TC__SREQ_WAIT], wait);
  TC_ASSERT_EQ(c.n[TC__SREQ_DELETE], del);
  TC_ASSERT_EQ(c.n[TC__SREQ_CONNECT], connect);
  TC_ASSERT_EQ(c.requests, set + get + add + check + wait + del);
  TC_ASSERT_EQ(c.keys, keys);
}

TC_TEST(store_counts_memory_by_kind) {
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_memory(&s));
  tc__store_counts_reset();
  expect_counts(0, 0, 0, 0, 0, 0, 0, 0);

  /* one set + one get = 2 requests */
  TC_ASSERT_OK(tc_store_set(s, "a", "x", 1));
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(s, "a", &v, &n, 1.0));
  tc_free(v);
  expect_counts(1, 1, 0, 0, 0, 0, 0, 2);

  int64_t r = 0;
  TC_ASSERT_OK(tc_store_add(s, "n", 3, &r));
  TC_ASSERT_OK(tc_store_add(s, "n", 4, &r));
  TC_ASSERT_EQ(r, 7);
  const char *keys[3] = {"a", "n", "missing"};
  int ready = -1;
  TC_ASSERT_OK(tc_store_check(s, keys, 3, &ready)); /* one request, 3 keys */
  TC_ASSERT_EQ(ready, 0);
  TC_ASSERT_OK(tc_store_wait(s, keys, 2, 1.0)); /* the store's own wait */
  int deleted = 0;
  TC_ASSERT_OK(tc_store_delete(s, "a", &deleted));
  TC_ASSERT_EQ(deleted, 1);
  expect_counts(1, 1, 2, 1, 1, 1, 0, 2 + 2 + 3 + 2 + 1);

  /* a failed request counts (it reached the store); a refused argument and
   * an empty check or wait (nothing asked of the store) do not */
  TC_ASSERT_ERR(tc_store_get(s, "missing", &v, &n, 0.0), TC_ERR_TIMEOUT,
                "store get('missing') timed out after 0.0 s");
  TC_ASSERT_ERR(tc_store_set(s, NULL, "x", 1), TC_ERR_INVALID_ARGUMENT,
                "tc_store_set: key is NULL");
  TC_ASSERT_OK(tc_store_check(s, keys, 0, &ready));
  TC_ASSERT_OK(tc_store_wait(s, keys, 0, 1.0));
  expect_counts(1, 2, 2, 1, 1, 1, 0, 11);

  tc__store_counts_reset();
  expect_counts(0, 0, 0, 0, 0, 0, 0, 0);
  tc_store_release(s);
}

TC_TEST(store_counts_prefix_once) {
  tc_store_t *base = NULL, *p = NULL;
  TC_ASSERT_OK(tc_store_memory(&base));
  TC_ASSERT_OK(tc_store_prefix(base, "comm", &p));
  tc__store_counts_reset();
  TC_ASSERT_OK(tc_store_set(p, "k", "v", 1));
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(base, "comm/k", &v, &n, 1.0));
  tc_free(v);
  const char *k = "k";
  TC_ASSERT_OK(tc_store_wait(p, &k, 1, 1.0));
  /* the prefix store's set and wait count once each, on the base */
  expect_counts(1, 1, 0, 0, 1, 0, 0, 3);
  tc_store_release(p);
  tc_store_release(base);
}

/* A custom store without its own wait: a map of one key, "k", present
 * after `polls_left` checks. */
typedef struct slow_store {
  int polls_left;
} slow_store_t;

static int slow_set(void *ctx, const char *key, const void *v, size_t n) {
  (void)ctx, (void)key, (void)v, (void)n;
  return TC_OK;
}
static int slow_get(void *ctx, const char *key, void **v, size_t *n,
                    double t) {
  (void)ctx, (void)key, (void)t;
  *v = NULL;
  *n = 0;
  return TC_OK;
}
static int slow_add(void *ctx, const char *key, int64_t d, int64_t *r) {
  (void)ctx, (void)key;
  *r = d;
  return TC_OK;
}
static int slow_check(void *ctx, const char *const *keys, size_t nkeys,
                      int *ready) {
  (void)keys, (void)nkeys;
  slow_store_t *s = ctx;
  *ready = s->polls_left-- <= 1;
  return TC_OK;
}
static int slow_delete(void *ctx, const char *key, int *deleted) {
  (void)ctx, (void)key;
  *deleted = 0;
  return TC_OK;
}

TC_TEST(store_counts_custom_polled_wait) {
  static slow_store_t ctx = {.polls_left = 3};
  static const tc_store_vtable_t vt = {
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = slow_set,
      .get = slow_get, .add = slow_add, .check = slow_check,
      .delete_key = slow_delete, .destroy = NULL};
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_create(&vt, &ctx, &s));
  tc__store_counts_reset();
  const char *keys[2] = {"k", "j"};
  TC_ASSERT_OK(tc_store_wait(s, keys, 2, 10.0));
  /* ready on the third poll: three checks of two keys, no wait */
  expect_counts(0, 0, 0, 3, 0, 0, 0, 6);
  tc_store_release(s);
}

TC_TEST(store_counts_tcp_connect) {
  tc_store_server_t *srv = NULL;
  TC_ASSERT_OK(tc_store_server_start("127.0.0.1", 0, &srv));
  tc__store_counts_reset();
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", tc_store_server_port(srv),
                                    10, &s));
  expect_counts(0, 0, 0, 0, 0, 0, 1, 0);
  TC_ASSERT_OK(tc_store_set(s, "a", "x", 1));
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(s, "a", &v, &n, 5.0));
  TC_ASSERT_EQ(n, 1);
  tc_free(v);
  expect_counts(1, 1, 0, 0, 0, 0, 1, 2);
  TC_ASSERT_STR_EQ(tc__store_req_kind_name(TC__SREQ_CONNECT), "connect");
  TC_ASSERT_STR_EQ(tc__store_req_kind_name(TC__SREQ_KINDS), "?");
  tc_store_release(s);
  tc_store_server_stop(srv);
}
