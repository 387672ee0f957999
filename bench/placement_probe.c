/* placement_probe.c -- how fast two of this machine's CPUs exchange data
 * right now: a probe `make bench` runs before every measurement it launches
 * (placement.csv), because on a virtual machine the host decides where the
 * virtual CPUs run, and that decision changes from second to second.
 *
 * Two threads, pinned to the first two CPUs of the process's mask, take
 * turns: each copies a 64 KiB buffer the other just wrote, then rewrites it
 * and hands it back (handoff GB/s: 2 x 64 KiB per round trip); then they
 * bounce one cache line (ping-pong ns: one round trip). Both are what a
 * 2-rank shared-memory collective does, without any library code. On the
 * 2-vCPU VM this project is measured on, back-to-back launches give either
 * about 20-25 GB/s or about 8-10 GB/s (docs/benchmarks.md, "Two
 * placements"), and a collective measured in the slow one is 2-4x slower at
 * 64 KiB and above.
 *
 * Output, one line: "placement: handoff_GBps=X pingpong_ns=Y cpus=A,B".
 * Usage: tcplacement_probe [ROUNDS]   (default 4000 handoffs)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "two_cpus.h"

enum { SZ = 64 << 10, PINGS = 20000 };

static char *buf, *dst[2];
static _Atomic int turn;
static int rounds = 4000, cpu[2];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* Side `me` of the handoffs, then of the ping-pongs, each waiting for its
 * turn. Side 0 (t != NULL) also waits for the other's last turn of each and
 * times them: t[0] start, t[1] handoffs done, t[2] ping-pongs done. */
static void side(int me, double *t) {
  if (t) t[0] = now_s();
  for (int i = 0; i < rounds; i++) {
    while (atomic_load_explicit(&turn, memory_order_acquire) != me) {
    }
    memcpy(dst[me], buf, SZ);
    memset(buf, i & 0xFF, SZ);
    atomic_store_explicit(&turn, !me, memory_order_release);
  }
  if (t) {
    while (atomic_load_explicit(&turn, memory_order_acquire) != me) {
    }
    t[1] = now_s();
  }
  for (int i = 0; i < PINGS; i++) {
    while (atomic_load_explicit(&turn, memory_order_acquire) != me) {
    }
    atomic_store_explicit(&turn, !me, memory_order_release);
  }
  if (t) {
    while (atomic_load_explicit(&turn, memory_order_acquire) != me) {
    }
    t[2] = now_s();
  }
}

static void *peer(void *arg) {
  (void)arg;
  pin(cpu[1]);
  side(1, NULL);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) rounds = atoi(argv[1]) > 0 ? atoi(argv[1]) : rounds;
  int k = first_two_cpus(cpu);
  if (k == 0) return 1;
  if (k < 2) {
    printf("placement: handoff_GBps=nan pingpong_ns=nan cpus=%d (one CPU)\n", cpu[0]);
    return 0;
  }
  buf = aligned_alloc(64, SZ);
  dst[0] = aligned_alloc(64, SZ);
  dst[1] = aligned_alloc(64, SZ);
  if (!buf || !dst[0] || !dst[1]) return 1;
  memset(buf, 1, SZ);
  memset(dst[0], 1, SZ);
  memset(dst[1], 1, SZ);
  pthread_t t;
  pin(cpu[0]);
  if (pthread_create(&t, NULL, peer, NULL) != 0) return 1;
  double tm[3];
  side(0, tm);
  pthread_join(t, NULL);
  printf("placement: handoff_GBps=%.2f pingpong_ns=%.0f cpus=%d,%d\n",
         2.0 * rounds * SZ / (tm[1] - tm[0]) / 1e9, (tm[2] - tm[1]) / PINGS * 1e9, cpu[0],
         cpu[1]);
  return 0;
}
