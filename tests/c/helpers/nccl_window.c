/* nccl_window.c -- one-sided windows on the nccl backend, for
 * tests/py/test_nccl_fake_windows.py (under tcrun, on the fake NCCL of
 * tests/c/fake_nccl/; on a GPU it runs the same on real NCCL >= 2.29).
 *
 *   tc_nccl_window rma      every rank puts a pattern into the next rank's
 *                           window (a 3 MiB + 5 put through the staging
 *                           area in chunks, small puts at odd offsets, a put
 *                           from inside its own window), signals it, waits
 *                           for the previous rank's signals (one of them
 *                           asynchronously) and checks every byte; a rank's
 *                           own window through put/signal/wait_signal; map
 *                           and access; get and flush refused.
 *   tc_nccl_window refuse   window creation must fail with
 *                           TC_ERR_NOT_SUPPORTED (NCCL too old).
 *   tc_nccl_window noput    the window is created and mapped but put,
 *                           signal and wait_signal are refused (NCCL 2.27).
 * Prints "nccl_window rank R: K checks passed" and exits 0, or every
 * failure and exits 1; refusals print "REFUSED <op>: <message>".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torchcomms.h"

static struct {
  int (*malloc_)(void **, size_t);
  int (*free_)(void *);
  int (*memcpy_)(void *, const void *, size_t, int);
} cuda;

static int checks, failures, rank_;

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) != TC_OK) {                                                     \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank_, #call, tc_last_error()); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static void expect(int ok, const char *what) {
  checks++;
  if (!ok) {
    failures++;
    fprintf(stderr, "rank %d: FAILED: %s\n", rank_, what);
  }
}

static void load_cuda(void) {
  const char *lib = getenv("TORCHCOMMS_CUDART_LIB");
  void *h = dlopen(lib && *lib ? lib : "libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
  if (h) {
    *(void **)&cuda.malloc_ = dlsym(h, "cudaMalloc");
    *(void **)&cuda.free_ = dlsym(h, "cudaFree");
    *(void **)&cuda.memcpy_ = dlsym(h, "cudaMemcpy");
  }
  if (!cuda.malloc_ || !cuda.free_ || !cuda.memcpy_) {
    fprintf(stderr, "no CUDA runtime (set TORCHCOMMS_CUDART_LIB)\n");
    exit(1);
  }
}

enum { DEFAULT = 4 }; /* cudaMemcpyDefault */

static unsigned char pat(int origin, int round, size_t i) {
  return (unsigned char)((origin * 37 + round * 11 + i) % 251);
}

/* A device buffer holding host[0..n). */
static void *to_device(const void *host, size_t n) {
  void *d = NULL;
  if (cuda.malloc_(&d, n ? n : 1) != 0 || cuda.memcpy_(d, host, n, DEFAULT) != 0) {
    fprintf(stderr, "cudaMalloc/cudaMemcpy failed\n");
    exit(1);
  }
  return d;
}

static void read_back(void *host, const void *dev, size_t n) {
  if (cuda.memcpy_(host, dev, n, DEFAULT) != 0) {
    fprintf(stderr, "cudaMemcpy failed\n");
    exit(1);
  }
}

static int refused(int rc, const char *op, const char *needle) {
  printf("REFUSED %s: %s\n", op, tc_last_error());
  return rc == TC_ERR_NOT_SUPPORTED && strstr(tc_last_error(), needle) != NULL;
}

#define BIG ((size_t)3 * 1024 * 1024 + 5)
#define SMALL 4096u

static void rma(tc_comm_t *comm, int me, int n) {
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const size_t bytes = BIG + SMALL; /* [0, BIG) big put, [BIG, +SMALL) small ones */
  tc_window_t *win;
  CHECK(tc_window_create(comm, NULL, bytes, NULL, &win));
  unsigned char *base = tc_window_base(win);
  unsigned char *host = malloc(bytes), *got = malloc(bytes);
  for (int round = 0; round < 3; round++) {
    /* the big put from a device buffer outside the window (staged) */
    for (size_t i = 0; i < BIG; i++) host[i] = pat(me, round, i);
    void *src = to_device(host, BIG);
    CHECK(tc_window_put(win, src, BIG, next, 0, NULL, NULL));
    /* small puts at odd offsets, then one signal for all of them */
    for (size_t i = 0; i < SMALL; i++) host[i] = pat(me, round + 7, i);
    void *s2 = to_device(host, SMALL);
    CHECK(tc_window_put(win, (char *)s2 + 1, 1000, next, BIG + 1, NULL, NULL));
    CHECK(tc_window_put(win, (char *)s2 + 1001, SMALL - 1001, next, BIG + 1001, NULL, NULL));
    CHECK(tc_window_put(win, s2, 1, next, BIG, NULL, NULL));
    CHECK(tc_window_signal(win, next, NULL, NULL));
    tc_work_t *wk = NULL;
    if (round == 1) { /* asynchronously: tested, then waited for */
      CHECK(tc_window_wait_signal(win, prev, NULL, &wk));
      CHECK(tc_work_wait(wk));
      CHECK(tc_work_release(wk));
    } else {
      CHECK(tc_window_wait_signal(win, prev, NULL, NULL));
    }
    read_back(got, base, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < BIG; i++) bad += got[i] != pat(prev, round, i);
    for (size_t i = 0; i < SMALL; i++) bad += got[BIG + i] != pat(prev, round + 7, i);
    char what[128];
    snprintf(what, sizeof what, "round %d: %zu bytes differ from rank %d's puts", round, bad,
             prev);
    expect(bad == 0, what);
    cuda.free_(src);
    cuda.free_(s2);
    /* nobody puts the next round before everyone checked this one */
    CHECK(tc_window_signal(win, prev, NULL, NULL));
    CHECK(tc_window_wait_signal(win, next, NULL, NULL));
  }
  /* two signals before a wait: two waits return, in order */
  CHECK(tc_window_signal(win, next, NULL, NULL));
  CHECK(tc_window_signal(win, next, NULL, NULL));
  CHECK(tc_window_wait_signal(win, prev, NULL, NULL));
  CHECK(tc_window_wait_signal(win, prev, NULL, NULL));
  /* a put from inside this rank's own window (no staging) */
  CHECK(tc_window_put(win, base + BIG, 64, next, 0, NULL, NULL));
  CHECK(tc_window_signal(win, next, NULL, NULL));
  CHECK(tc_window_wait_signal(win, prev, NULL, NULL));
  read_back(got, base, 64);
  size_t bad = 0;
  /* what prev put: its own prev's round-2 small puts */
  for (size_t i = 0; i < 64; i++) bad += got[i] != pat((me + 2 * n - 2) % n, 2 + 7, i);
  expect(bad == 0, "a put from inside the origin's window");
  /* this rank's own window */
  for (size_t i = 0; i < 100; i++) host[i] = (unsigned char)(200 + i);
  void *s3 = to_device(host, 100);
  CHECK(tc_barrier(comm, NULL, NULL)); /* the peer's last put has landed */
  CHECK(tc_window_put(win, s3, 100, me, 5000, NULL, NULL));
  CHECK(tc_window_signal(win, me, NULL, NULL));
  CHECK(tc_window_wait_signal(win, me, NULL, NULL));
  read_back(got, base + 5000, 100);
  expect(!memcmp(got, host, 100), "a put into this rank's own window");
  cuda.free_(s3);
  CHECK(tc_barrier(comm, NULL, NULL)); /* every rank's own put is done */
  /* map and access: the fake maps every peer (TCFAKE_NCCL_PEER_PTR=0: none) */
  void *p = NULL;
  tc_win_access_t acc;
  int rc = tc_window_map(win, next, &p);
  CHECK(tc_window_access(win, next, &acc));
  const char *pp = getenv("TCFAKE_NCCL_PEER_PTR");
  if (pp && !strcmp(pp, "0")) {
    expect(rc == TC_ERR_NOT_SUPPORTED && !p, "map of a peer NCCL does not map is refused");
    expect(acc == TC_WIN_ACCESS_SEPARATE, "access of an unmapped peer is SEPARATE");
  } else {
    expect(rc == TC_OK && p, "map of a peer");
    expect(acc == TC_WIN_ACCESS_UNIFIED, "access of a mapped peer is UNIFIED");
    if (p) { /* next's window at 5000: its own put of 200.. */
      read_back(got, (char *)p + 5000, 100);
      expect(!memcmp(got, host, 100), "the mapped peer memory holds what it wrote");
    }
  }
  /* get and flush: NCCL has neither */
  expect(refused(tc_window_get(win, got, 8, next, 0, NULL, NULL), "get",
                 "NCCL has no one-sided get"), "get is refused clearly");
  expect(refused(tc_window_flush(win, next, NULL, NULL), "flush", "NCCL has no flush"),
         "flush is refused clearly");
  CHECK(tc_window_free(win));
  free(host);
  free(got);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "rma";
  load_cuda();
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "nccl_window";
  tc_comm_t *comm;
  CHECK(tc_comm_create("nccl", "cuda", &opts, &comm));
  int me = tc_comm_rank(comm), n = tc_comm_size(comm);
  rank_ = me;
  if (!strcmp(mode, "rma")) {
    rma(comm, me, n);
  } else if (!strcmp(mode, "refuse")) {
    tc_window_t *win = NULL;
    int rc = tc_window_create(comm, NULL, 1024, NULL, &win);
    expect(refused(rc, "new_window", "windows need NCCL >= 2.27 (ncclCommWindowRegister)"),
           "creation is refused clearly");
    expect(win == NULL, "no window");
  } else if (!strcmp(mode, "noput")) {
    tc_window_t *win;
    CHECK(tc_window_create(comm, NULL, 1024, NULL, &win));
    char b[8] = {0};
    void *d = to_device(b, sizeof b), *p = NULL;
    const char *need = "needs NCCL >= 2.29 (ncclPutSignal";
    expect(refused(tc_window_put(win, d, 8, (me + 1) % n, 0, NULL, NULL), "put", need),
           "put is refused clearly");
    expect(refused(tc_window_signal(win, (me + 1) % n, NULL, NULL), "signal", need),
           "signal is refused clearly");
    expect(refused(tc_window_wait_signal(win, (me + 1) % n, NULL, NULL), "wait_signal", need),
           "wait_signal is refused clearly");
    expect(tc_window_map(win, (me + 1) % n, &p) == TC_OK && p, "map works on NCCL 2.27");
    cuda.free_(d);
    CHECK(tc_window_free(win));
  } else {
    fprintf(stderr, "usage: tc_nccl_window rma|refuse|noput\n");
    return 2;
  }
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  if (failures) return 1;
  printf("nccl_window rank %d: %d checks passed\n", me, checks);
  return 0;
}
