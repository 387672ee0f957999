/* bcast_line_probe.c -- what the 8-byte broadcast's exchange costs between
 * two processes of this machine, without the library around it: the floor
 * under the cpu backend's ring of header lines (src/backends/cpu/
 * shm_algos.c, small_run; docs/benchmarks.md, "Broadcast 8 B: what Open MPI
 * executes").
 *
 * Two processes, pinned to the first two CPUs of the mask, share a ring of
 * 32 lines, 64 KiB apart as the backend's (TC_SHM_LINE_STRIDE). For
 * broadcast i the root waits until the receiver's flag says it is done
 * with line i's last use (flag >= i - 31: the root runs up to 31 ahead),
 * writes 8 bytes and the sequence number into line i % 32; the receiver
 * waits for that number, reads the 8 bytes, fetches the root's next line
 * ahead and stores i in its flag. Modes add what the backend does besides:
 *
 *   bare        the above;
 *   fence       a full fence after each rank's stores (tc__shm_post's,
 *               which lets a peer about to sleep be woken);
 *   hdr         the receiver also writes its own header line i % 32 of a
 *               second ring, which nobody reads;
 *   hdr-read    ... and the root reads one of them per broadcast (the line
 *               of i - 31), as a mismatch check of every receiver would;
 *   hdr-batch   ... the root reads them 31 at a time, once per lap (as
 *               fp_lazy_check does);
 *   hdr-batch-fence  both.
 *
 * Output, one line per mode: "mode us_per_broadcast" (the slower rank's
 * time per broadcast, N broadcasts after both are ready).
 * A rank that dies, or waits on its peer past PROBE_DEADLINE_S, ends the
 * probe with exit status 1 and a message naming the mode.
 * Usage: tcbcast_probe [N]   (default 2000000)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINES 32
#define STRIDE (64u * 1024u)
#define PROBE_DEADLINE_S 120 /* per mode and rank */

enum { M_FENCE = 1, M_HDR = 2, M_READ = 4, M_BATCH = 8 };

typedef struct {
  _Atomic uint64_t seq;
  uint64_t data;
} line_t;

typedef struct {
  _Alignas(64) _Atomic uint64_t flag; /* the receiver's */
  _Alignas(64) _Atomic int ready;
  _Alignas(64) double us[2];
} ctl_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* The i-th CPU of this process's mask, or -1. */
static int nth_cpu(int i) {
  cpu_set_t s;
  if (sched_getaffinity(0, sizeof s, &s)) return -1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s) && i-- == 0) return c;
  return -1;
}

static void run_rank(int r, int mode, long n, char *root_ring, char *hdr_ring, ctl_t *ctl,
                     int cpu) {
  if (cpu >= 0) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
  }
#define ROOT_LINE(i) ((line_t *)(root_ring + (size_t)((i) % LINES) * STRIDE))
#define HDR_LINE(i) ((line_t *)(hdr_ring + (size_t)((i) % LINES) * STRIDE))
  atomic_fetch_add(&ctl->ready, 1);
  while (atomic_load(&ctl->ready) < 2) relax();
  uint64_t known = 0, sink = 0;
  const double t0 = now_s();
  for (long k = 1; k <= n; k++) {
    const uint64_t i = (uint64_t)k;
    if (r == 0) {
      const uint64_t need = i >= LINES ? i - LINES + 1 : 0;
      while (known < need) {
        known = atomic_load_explicit(&ctl->flag, memory_order_acquire);
        if (known < need) relax();
      }
      line_t *l = ROOT_LINE(i);
      l->data = i * 3;
      atomic_store_explicit(&l->seq, i, memory_order_release);
      if (mode & M_FENCE) atomic_thread_fence(memory_order_seq_cst);
      if ((mode & M_READ) && i >= LINES)
        sink += atomic_load_explicit(&HDR_LINE(i - LINES + 1)->seq, memory_order_acquire);
      if ((mode & M_BATCH) && i % LINES == 0)
        for (uint64_t j = i - LINES + 1; j < i; j++)
          sink += atomic_load_explicit(&HDR_LINE(j)->seq, memory_order_acquire);
    } else {
      line_t *l = ROOT_LINE(i);
      while (atomic_load_explicit(&l->seq, memory_order_acquire) != i) relax();
      sink += l->data;
      __builtin_prefetch(ROOT_LINE(i + 1), 0, 3);
      if (mode & M_HDR) {
        line_t *h = HDR_LINE(i);
        h->data = i;
        atomic_store_explicit(&h->seq, i, memory_order_release);
      }
      atomic_store_explicit(&ctl->flag, i, memory_order_release);
      if (mode & M_FENCE) atomic_thread_fence(memory_order_seq_cst);
    }
  }
  ctl->us[r] = (now_s() - t0) / (double)n * 1e6;
  if (sink == 42) fprintf(stderr, "(unlikely)\n"); /* keeps the reads */
#undef ROOT_LINE
#undef HDR_LINE
}

static double run_mode(int mode, long n) {
  const size_t ring = (size_t)LINES * STRIDE, bytes = 2 * ring + sizeof(ctl_t);
  char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    perror("tcbcast_probe: mmap");
    exit(1);
  }
  memset(m, 0, bytes);
  ctl_t *ctl = (ctl_t *)(m + 2 * ring);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    pid_t p = pid[r] = fork();
    if (p < 0) {
      perror("tcbcast_probe: fork");
      exit(1);
    }
    if (p == 0) {
      /* a deadline for the spins on the other process: a rank that lost
       * its peer ends (SIGALRM) instead of spinning on */
      alarm(PROBE_DEADLINE_S);
      run_rank(r, mode, n, m, m + ring, ctl, nth_cpu(r));
      _exit(0);
    }
  }
  for (int r = 0; r < 2; r++) {
    int st = 0;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "tcbcast_probe: a rank of mode %d failed (%s %d%s)\n", mode,
              WIFSIGNALED(st) ? "signal" : "exit status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
              WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? ": its peer stopped answering" : "");
      kill(pid[0], SIGKILL); /* the other rank would spin until its deadline */
      kill(pid[1], SIGKILL);
      while (wait(NULL) > 0) {
      }
      exit(1);
    }
  }
  const double us = ctl->us[0] > ctl->us[1] ? ctl->us[0] : ctl->us[1];
  munmap(m, bytes);
  return us;
}

int main(int argc, char **argv) {
  const long n = argc > 1 ? atol(argv[1]) : 2000000;
  if (n <= LINES) {
    fprintf(stderr, "usage: tcbcast_probe [N > %d]\n", LINES);
    return 2;
  }
  static const struct {
    const char *name;
    int mode;
  } modes[] = {{"bare", 0},
               {"fence", M_FENCE},
               {"hdr", M_HDR},
               {"hdr-read", M_HDR | M_READ},
               {"hdr-batch", M_HDR | M_BATCH},
               {"hdr-batch-fence", M_HDR | M_BATCH | M_FENCE}};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    printf("%-16s %.3f\n", modes[i].name, run_mode(modes[i].mode, n));
  return 0;
}
