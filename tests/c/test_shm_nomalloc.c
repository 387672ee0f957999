/* test_shm_nomalloc.c -- no allocation per operation on the hot path: after
 * a warm-up, 1000 all_reduces (8 B and 64 KiB, synchronous and with a work
 * object, over shared memory and over TCP; 1 and 4 MiB fewer times) call malloc,
 * calloc, realloc, aligned_alloc and posix_memalign zero times in the rank's
 * process, progress thread included.
 *
 * The warm-up includes a burst of 16 outstanding operations, which fills the
 * core's (process-wide) pool of work objects, and one operation on the
 * progress thread.
 *
 * The counting wrappers replace the allocator entry points of the whole
 * test binary (forwarding to glibc's __libc_* functions) and count only
 * while `tc_alloc_counting` is set. Under AddressSanitizer, whose runtime
 * owns malloc, they are left out and the test uses its allocation hooks. */
#include <errno.h>
#include <stdatomic.h>

#include "coll_util.h"

static atomic_int tc_alloc_counting;
static atomic_long tc_alloc_count;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* from <sanitizer/allocator_interface.h>, which not every compiler ships */
int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void *, size_t),
    void (*free_hook)(const volatile void *));
static void tc_count_hook(const volatile void *p, size_t n) {
  (void)p;
  (void)n;
  if (atomic_load_explicit(&tc_alloc_counting, memory_order_relaxed))
    atomic_fetch_add(&tc_alloc_count, 1);
}
static void tc_free_hook(const volatile void *p) { (void)p; }
static void tc_alloc_hooks(void) {
  static int done;
  if (!done) __sanitizer_install_malloc_and_free_hooks(tc_count_hook, tc_free_hook);
  done = 1;
}
#else
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t a, size_t n);

static inline void tc_count(void) {
  if (atomic_load_explicit(&tc_alloc_counting, memory_order_relaxed))
    atomic_fetch_add_explicit(&tc_alloc_count, 1, memory_order_relaxed);
}
void *malloc(size_t n) {
  tc_count();
  return __libc_malloc(n);
}
void *calloc(size_t n, size_t m) {
  tc_count();
  return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n) {
  tc_count();
  return __libc_realloc(p, n);
}
void *aligned_alloc(size_t a, size_t n) {
  tc_count();
  return __libc_memalign(a, n);
}
int posix_memalign(void **out, size_t a, size_t n) {
  tc_count();
  void *p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
static void tc_alloc_hooks(void) {}
#endif

typedef struct {
  const char *transport;
} nm_arg_t;

static void nomalloc_rank(tc_ctx_t *ctx) {
  const nm_arg_t *a = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", a->transport, 1);
  tc_alloc_hooks();
  tc_comm_t *c = tc_ctx_comm(ctx, "nomalloc", NULL);
  /* warm the core's pool of work objects (process-wide; a waiter may run
   * ahead of the backend dropping its reference, so more than one is in
   * use at times) with a burst of outstanding operations */
  {
    float x[16];
    tc_work_t *w[16];
    for (int i = 0; i < 16; i++)
      TC_ASSERT_OK(tc_all_reduce(c, &x[i], 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w[i]));
    for (int i = 0; i < 16; i++) {
      TC_ASSERT_OK(tc_work_wait(w[i]));
      TC_ASSERT_OK(tc_work_release(w[i]));
    }
  }
  /* and the progress thread: synchronous operations and small ones run on
   * the caller's thread, so it may not have run yet (a new thread
   * allocates in its first run under ASan) */
  {
    size_t big = 4u << 20;
    float *b = tc_xmalloc(big);
    memset(b, 0, big);
    tc_work_t *w = NULL;
    TC_ASSERT_OK(tc_all_reduce(c, b, big / sizeof(float), TC_FLOAT32, TC_OP(TC_SUM), NULL, &w));
    TC_ASSERT_OK(tc_work_wait(w));
    TC_ASSERT_OK(tc_work_release(w));
    free(b);
  }
  /* on the caller's thread: 8 B to 1 MiB, and 4 MiB when synchronous; on
   * the progress thread: 4 MiB asynchronous (shared memory) */
  static const size_t sizes[] = {8, 64 * 1024, 1024 * 1024, 4096 * 1024};
  for (size_t si = 0; si < 4; si++) {
    size_t count = sizes[si] / sizeof(float);
    int iters = sizes[si] > 1024 * 1024 ? 30 : sizes[si] > 64 * 1024 ? 100 : 1000;
    float *buf = tc_xmalloc(sizes[si]);
    for (int async = 0; async < 2; async++) {
      for (int phase = 0; phase < 2; phase++) { /* warm-up, then counted */
        long before = atomic_load(&tc_alloc_count);
        atomic_store(&tc_alloc_counting, phase);
        for (int it = 0; it < (phase ? iters : 50); it++) {
          for (size_t i = 0; i < count; i += 1024) buf[i] = 1.0f;
          tc_work_t *w = NULL;
          int rc = tc_all_reduce(c, buf, count, TC_FLOAT32, TC_OP(TC_SUM), NULL,
                                 async ? &w : NULL);
          if (rc == TC_OK && w) {
            rc = tc_work_wait(w);
            tc_work_release(w);
          }
          if (rc != TC_OK) {
            atomic_store(&tc_alloc_counting, 0);
            tc_test_fail(__FILE__, __LINE__, "all_reduce: %s", tc_last_error());
          }
          if (buf[0] != (float)ctx->size) {
            atomic_store(&tc_alloc_counting, 0);
            tc_test_fail(__FILE__, __LINE__, "wrong result %g", (double)buf[0]);
          }
        }
        atomic_store(&tc_alloc_counting, 0);
        long got = atomic_load(&tc_alloc_count) - before;
        if (phase && got != 0)
          tc_test_fail(__FILE__, __LINE__,
                       "%s, %zu bytes, %s: %ld allocations in %d all_reduces", a->transport,
                       sizes[si], async ? "async" : "sync", got, iters);
      }
    }
    free(buf);
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

static const nm_arg_t nm_shm = {"shm"}, nm_tcp = {"tcp"};

TC_TEST(shm_nomalloc_w2) { tc_spawn(2, nomalloc_rank, (void *)&nm_shm, 120); }
TC_TEST(shm_nomalloc_w3) { tc_spawn(3, nomalloc_rank, (void *)&nm_shm, 120); }
TC_TEST(shm_nomalloc_tcp_w2) { tc_spawn(2, nomalloc_rank, (void *)&nm_tcp, 120); }
