/* Idle CPU cost of a blocking wait (issue 16, point 3): what the spin /
   yield / sleep policy of a waiting rank burns while nothing arrives.

   Every rank creates a communicator and runs one 8 B all_reduce (so the
   connections and fast paths are set up), then a barrier. Then rank 0
   sleeps IDLE seconds (default 2) in nanosleep and enters a barrier; the
   other ranks enter the barrier at once and wait there for rank 0 for
   ~IDLE seconds. Each rank reads its process's CPU time (getrusage
   RUSAGE_SELF: user + system, every thread of the process, helper threads
   included) and the wall clock just before and just after that barrier.
   Rank 0 prints one row per rank:

     # idle_cost IMPL nproc=N idle_s=IDLE
     rank  wall_s  user_s  sys_s  cpu_pct

   cpu_pct = 100 * (user + sys) / wall: 100 means the waiting rank kept a
   core busy the whole time, ~0 that it slept. Rank 0's row is the sleeper
   (its barrier is the last to arrive: ~0 wall, cpu_pct "-").

   Two builds of the same file:
     ours:  cc -O2 -Iinclude -o idle_cost bench/idle_cost.c -Lbuild -ltorchcomms
              -Wl,-rpath,$PWD/build;   build/tcrun -n 2 ./idle_cost [IDLE]
     MPI:   mpicc -O2 -DIDLE_MPI -o idle_cost_mpi bench/idle_cost.c;
              mpirun -np 2 ./idle_cost_mpi [IDLE]   (MPI_Barrier)
   bench/run_bench.py --load (make bench-load) builds and runs both (ours,
   Open MPI 5 of the anchors, Debian's Open MPI). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#ifdef IDLE_MPI
#include <mpi.h>
#define IMPL "mpi"
#else
#include "torchcomms.h"
#define IMPL "ours"
#endif

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void cpu_s(double *user, double *sys) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  *user = (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec;
  *sys = (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

#ifdef IDLE_MPI
typedef MPI_Comm comm_t;
static int setup(int *argc, char ***argv, comm_t *c, int *r, int *n) {
  MPI_Init(argc, argv);
  *c = MPI_COMM_WORLD;
  MPI_Comm_rank(*c, r);
  MPI_Comm_size(*c, n);
  return 0;
}
static int sum_f64(comm_t c, double *v, int k) {
  return MPI_Allreduce(MPI_IN_PLACE, v, k, MPI_DOUBLE, MPI_SUM, c) != MPI_SUCCESS;
}
static int barrier(comm_t c) { return MPI_Barrier(c) != MPI_SUCCESS; }
static void teardown(comm_t c) {
  (void)c;
  MPI_Finalize();
}
#else
typedef tc_comm_t *comm_t;
static int setup(int *argc, char ***argv, comm_t *c, int *r, int *n) {
  (void)argc, (void)argv;
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = "idle_cost";
  o.timeout_s = 120;
  int rc = tc_comm_create("cpu", "cpu", &o, c);
  if (rc) {
    fprintf(stderr, "idle_cost: tc_comm_create(\"cpu\") failed: %s (%s)\n", tc_status_name(rc), tc_last_error());
    return 1;
  }
  *r = tc_comm_rank(*c);
  *n = tc_comm_size(*c);
  return 0;
}
static int sum_f64(comm_t c, double *v, int k) {
  int rc = tc_all_reduce(c, v, (size_t)k, TC_FLOAT64, TC_OP(TC_SUM), NULL, NULL);
  if (rc) fprintf(stderr, "idle_cost: tc_all_reduce failed: %s\n", tc_last_error());
  return rc;
}
static int barrier(comm_t c) {
  int rc = tc_barrier(c, NULL, NULL);
  if (rc) fprintf(stderr, "idle_cost: tc_barrier failed: %s\n", tc_last_error());
  return rc;
}
static void teardown(comm_t c) {
  tc_comm_finalize(c);
  tc_comm_destroy(c);
}
#endif

int main(int argc, char **argv) {
  comm_t c;
  int r = 0, n = 0;
  if (setup(&argc, &argv, &c, &r, &n)) return 1;
  double idle = argc > 1 ? atof(argv[1]) : 2.0;
  if (idle < 0 || idle > 60) idle = 2.0;
  double *v = calloc((size_t)(3 * n + 1), sizeof *v);
  if (!v) return 1;
  v[0] = 1.0;
  if (sum_f64(c, v, 1) || barrier(c)) return 1; /* warm: one 8 B all_reduce, one barrier */
  double u0, s0, u1, s1, t0, t1;
  cpu_s(&u0, &s0);
  t0 = now_s();
  if (r == 0) {
    struct timespec ts = {(time_t)idle, (long)((idle - (double)(time_t)idle) * 1e9)};
    while (nanosleep(&ts, &ts)) {
    }
    cpu_s(&u0, &s0); /* rank 0: only its barrier, not its sleep */
    t0 = now_s();
  }
  if (barrier(c)) return 1;
  t1 = now_s();
  cpu_s(&u1, &s1);
  memset(v, 0, (size_t)(3 * n + 1) * sizeof *v);
  v[3 * r] = t1 - t0, v[3 * r + 1] = u1 - u0, v[3 * r + 2] = s1 - s0;
  if (sum_f64(c, v, 3 * n)) return 1;
  if (r == 0) {
    printf("# idle_cost %s nproc=%d idle_s=%.2f\n%5s %8s %8s %8s %8s\n", IMPL, n, idle, "rank", "wall_s", "user_s",
           "sys_s", "cpu_pct");
    for (int k = 0; k < n; k++) {
      double w = v[3 * k], cpu = v[3 * k + 1] + v[3 * k + 2];
      if (w >= 0.05)
        printf("%5d %8.3f %8.3f %8.3f %8.1f\n", k, w, v[3 * k + 1], v[3 * k + 2], 100.0 * cpu / w);
      else /* rank 0, the sleeper: its barrier found everyone there */
        printf("%5d %8.3f %8.3f %8.3f %8s\n", k, w, v[3 * k + 1], v[3 * k + 2], "-");
    }
    fflush(stdout);
  }
  free(v);
  teardown(c);
  return 0;
}
