/* cma_copy_probe.c -- what a 2-rank all_gather's copies cost without the
 * library: the floor behind issue 16's point 4 at 4 MiB (docs/benchmarks.md,
 * "Full run 54").
 *
 * Two processes (fork), each with a send block of BYTES and an output of
 * 2 x BYTES. One operation, per mode:
 *   both    the own block memcpy'd into the output, then the peer's send
 *           block read into it with one process_vm_readv (what the cpu
 *           backend's single copy does, shm_algos.c cma_run);
 *   copy    the memcpy alone;
 *   read    the process_vm_readv alone;
 *   stream  the own block copied with non-temporal stores (AVX-512 where
 *           the CPU has it, else memcpy), then the read.
 * A spin barrier on a shared page starts and ends each operation, so both
 * processes run it at once; a process that does not reach it within 30 s
 * ends the probe with exit status 1 (as does a failed read, with its
 * errno). Prints, from the first process, the best and
 * the mean time of ITERS operations (after 5 not counted):
 *   "MODE BYTES best_us mean_us".
 * Usage: tccma_probe [BYTES [ITERS [MODE ...]]]
 *        (defaults 2097152, 100, every mode)
 * Prints "SKIP: ..." and exits 0 where process_vm_readv is refused (no
 * ptrace permission between the two processes). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_STREAM 1
#endif

typedef struct {
  _Atomic long bar[2];
  uint64_t src[2];
  pid_t pid[2];
  _Atomic int read_errno; /* the first failed read's errno (0: none) */
} ctl_t;

enum { BARRIER_S = 30 }; /* a peer this late is gone: give up */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* 0 once both processes reached it, -1 when the other one did not within
 * BARRIER_S seconds (it exited or failed). */
static int barrier(ctl_t *c, int r, long *gen) {
  ++*gen;
  atomic_store(&c->bar[r], *gen);
  const double end = now() + BARRIER_S;
  for (unsigned spins = 0; atomic_load(&c->bar[1 - r]) < *gen; spins++)
    if ((spins & 0xFFFF) == 0 && now() > end) return -1;
  return 0;
}

#ifdef HAVE_STREAM
static __attribute__((target("avx512f"))) void stream_copy(char *d, const char *s, size_t n) {
  size_t i = 0;
  if (((uintptr_t)d & 63) == 0)
    for (; i + 64 <= n; i += 64)
      _mm512_stream_si512((void *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
  _mm_sfence();
  memcpy(d + i, s + i, n - i);
}
#endif

static void own_copy(char *d, const char *s, size_t n, int stream) {
#ifdef HAVE_STREAM
  if (stream && __builtin_cpu_supports("avx512f")) {
    stream_copy(d, s, n);
    return;
  }
#endif
  (void)stream;
  memcpy(d, s, n);
}

static int read_peer(ctl_t *c, int p, char *dst, size_t n) {
  struct iovec l = {dst, n}, rv = {(void *)(uintptr_t)c->src[p], n};
  while (l.iov_len) {
    ssize_t got = process_vm_readv(c->pid[p], &l, 1, &rv, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return got < 0 ? errno : EFAULT;
    }
    l.iov_base = (char *)l.iov_base + got;
    l.iov_len -= (size_t)got;
    rv.iov_base = (char *)rv.iov_base + got;
    rv.iov_len -= (size_t)got;
  }
  return 0;
}

/* One mode, both processes: 0 on success, 77 refused, 1 another failure
 * (said on stderr). */
static int run_mode(const char *mode, size_t bytes, int iters) {
  const int copy = strcmp(mode, "read") != 0, rd = strcmp(mode, "copy") != 0;
  const int stream = strcmp(mode, "stream") == 0;
  ctl_t *c = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED) return 1;
  pid_t child = fork();
  if (child < 0) return 1;
  const int r = child == 0 ? 1 : 0, p = 1 - r;
  char *src = aligned_alloc(4096, bytes), *dst = aligned_alloc(4096, 2 * bytes);
  const int oom = !src || !dst;
  int fail = oom;
  if (!fail) {
    memset(src, r + 1, bytes);
    memset(dst, 0, 2 * bytes);
    c->src[r] = (uint64_t)(uintptr_t)src;
    c->pid[r] = getpid();
  }
  long gen = 0;
  fail = fail || barrier(c, r, &gen);
  double best = 1e30, sum = 0;
  for (int i = 0; i < iters + 5 && !fail; i++) {
    fail = barrier(c, r, &gen);
    const double t0 = now();
    if (copy) own_copy(dst + (size_t)r * bytes, src, bytes, stream);
    if (rd && !atomic_load(&c->read_errno)) {
      int e = read_peer(c, p, dst + (size_t)p * bytes, bytes);
      if (e) atomic_store(&c->read_errno, e);
    }
    fail = fail || barrier(c, r, &gen);
    const double t = now() - t0;
    if (i >= 5) {
      sum += t;
      if (t < best) best = t;
    }
  }
  /* a last check that the peer's block arrived */
  const int bad = !fail && rd && !atomic_load(&c->read_errno) &&
                  dst[(size_t)p * bytes + bytes - 1] != (char)(p + 1);
  free(src);
  free(dst);
  if (r) _exit(fail || bad ? 1 : 0);
  if (fail) kill(child, SIGKILL); /* it may still wait in a barrier */
  int st = 0;
  waitpid(child, &st, 0);
  const int e = atomic_load(&c->read_errno);
  munmap(c, 4096);
  if (e == EPERM) return 77;
  if (fail || e || bad || !WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "tccma_probe: %s: %s\n", mode,
            e     ? strerror(e)
            : oom ? "out of memory for its buffers"
            : fail ? "the other process did not reach a barrier within 30 s (out of memory, or it died)"
            : bad ? "the peer's block arrived with wrong bytes"
                  : "the second process failed");
    return 1;
  }
  printf("%s %zu %.1f %.1f\n", mode, bytes, best * 1e6, sum / iters * 1e6);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  const size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 2097152;
  const int iters = argc > 2 ? atoi(argv[2]) : 100;
  static const char *all[] = {"both", "copy", "read", "stream"};
  if (bytes == 0 || iters <= 0) {
    fprintf(stderr, "usage: tccma_probe [BYTES [ITERS [both|copy|read|stream ...]]]\n");
    return 2;
  }
  const int nm = argc > 3 ? argc - 3 : 4;
  for (int k = 3; k < argc; k++) {
    if (strcmp(argv[k], "both") && strcmp(argv[k], "copy") && strcmp(argv[k], "read") &&
        strcmp(argv[k], "stream")) {
      fprintf(stderr, "tccma_probe: unknown mode '%s' (both, copy, read, stream)\n", argv[k]);
      return 2;
    }
  }
  printf("# mode BYTES best_us mean_us (2 processes; own block memcpy, peer's block process_vm_readv)\n");
  for (int k = 0; k < nm; k++) {
    const char *m = argc > 3 ? argv[3 + k] : all[k];
    int rc = run_mode(m, bytes, iters);
    if (rc == 77) {
      printf("SKIP: process_vm_readv refused between the two processes (ptrace permission)\n");
      return 0;
    }
    if (rc) return rc;
  }
  return 0;
}
