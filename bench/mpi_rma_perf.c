/* Anchor: MPI one-sided communication (RMA) with passive-target
   synchronisation, the reference for tcperf -c put / -c get, measured in the
   style of ../shared/bench/mpi_perf.c. Rank 0 prints
   size count time_us algbw busbw (GB/s = 1e9 B/s; busbw = algbw; count in
   bytes).

   Every rank allocates a window of MAX bytes with MPI_Win_allocate and
   opens one passive-target epoch on it (MPI_Win_lock_all(0, win)) for the
   whole run. Rank 0 is the origin, rank 1 the target; other ranks only join
   the barriers and the timing reduction. One iteration:
     put: MPI_Put(size bytes to rank 1, displacement 0) + MPI_Win_flush(1, win)
     get: MPI_Get(size bytes of rank 1, displacement 0) + MPI_Win_flush(1, win)
   Iterations: 1000 below 64 KiB, 100 below 4 MiB, 10 from 4 MiB; 5 warm-up;
   the time is the loop's average on rank 0 (the maximum over ranks). After
   the largest size the bytes are checked once (put: at the target, after a
   barrier and MPI_Win_sync; get: at the origin); a mismatch prints
   "# check FAILED" and exits 1.

     mpicc -O2 -o mpi_rma_perf bench/mpi_rma_perf.c
     mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_rma_perf put 8 67108864
   (Open MPI: shared memory by default; `--mca btl self,tcp` for TCP, which
   may need `--mca osc pt2pt` or `--mca osc rdma`: see docs/benchmarks.md.) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int r, size_t i) { return (unsigned char)((i * 13 + (size_t)r * 7 + 1) % 251); }

static void run(int put, unsigned char *buf, size_t b, MPI_Win win) {
  if (put) MPI_Put(buf, (int)b, MPI_BYTE, 1, 0, (int)b, MPI_BYTE, win);
  else MPI_Get(buf, (int)b, MPI_BYTE, 1, 0, (int)b, MPI_BYTE, win);
  MPI_Win_flush(1, win);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char *c = argc > 1 ? argv[1] : "put";
  size_t minb = argc > 2 ? strtoull(argv[2], 0, 0) : 8, maxb = argc > 3 ? strtoull(argv[3], 0, 0) : (64u << 20);
  int put = !strcmp(c, "put");
  if ((!put && strcmp(c, "get")) || n < 2 || minb == 0 || maxb < minb || maxb > (size_t)1 << 30) {
    if (!r) fprintf(stderr, "usage: mpirun -np N (N >= 2) mpi_rma_perf put|get [MIN [MAX]] (1 <= MIN <= MAX <= 1 GiB)\n");
    MPI_Finalize();
    return 2;
  }
  unsigned char *buf = malloc(maxb), *base = NULL;
  for (size_t i = 0; i < maxb; i++) buf[i] = pattern(0, i);
  MPI_Win win;
  MPI_Win_allocate((MPI_Aint)maxb, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  for (size_t i = 0; i < maxb; i++) base[i] = pattern(1, i); /* touch every page before timing */
  MPI_Win_lock_all(0, win);
  MPI_Win_sync(win);
  MPI_Barrier(MPI_COMM_WORLD);
  if (!r) printf("# mpi rma %s (passive target: lock_all, %s + MPI_Win_flush) nproc=%d\n%12s %11s %12s %8s %8s\n", c,
                 put ? "MPI_Put" : "MPI_Get", n, "size", "count", "time_us", "algbw", "busbw");
  size_t last = minb;
  for (size_t b = minb; b <= maxb; b *= 4) {
    int it = b < (1 << 16) ? 1000 : (b < (1 << 22) ? 100 : 10);
    if (!r)
      for (int i = 0; i < 5; i++) run(put, buf, b, win);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (!r)
      for (int i = 0; i < it; i++) run(put, buf, b, win);
    double t = (MPI_Wtime() - t0) / it, mx;
    MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double alg = b / mx / 1e9;
    if (!r) printf("%12zu %11zu %12.2f %8.3f %8.3f\n", b, b, mx * 1e6, alg, alg);
    fflush(stdout);
    last = b;
  }
  /* the check, once: the last size's bytes arrived where they should */
  long wrong = 0, total = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_sync(win);
  if (put && r == 1)
    for (size_t i = 0; i < last; i++) wrong += base[i] != pattern(0, i);
  if (!put && r == 0)
    for (size_t i = 0; i < last; i++) wrong += buf[i] != pattern(1, i);
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (!r) printf("# check %s (%ld wrong bytes of %zu)\n", total ? "FAILED" : "ok", total, last);
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  free(buf);
  MPI_Finalize();
  return total ? 1 : 0;
}
