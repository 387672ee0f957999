/* Anchor: MPI point-to-point, in the style and columns of
   ../shared/bench/mpi_perf.c (size count time_us algbw busbw, GB/s = 1e9 B/s,
   sizes MIN, 4*MIN ... <= MAX, 5 warm-ups, then 1000 / 100 / 10 timed
   iterations below 64 KiB / below 4 MiB / above, time = max over ranks).
   Built with each MPI's mpicc (run_bench.py does it for the anchor cache's
   Open MPI 5, MPICH 5 and Intel MPI, and for Debian's Open MPI).

     sendrecv  what `tcperf -c send_recv` measures: every rank sends SIZE
               bytes to rank r+1 and receives SIZE bytes from rank r-1 in one
               MPI_Sendrecv (tcperf: one tc_batch of a send and a recv);
               time = one such exchange; busbw = algbw = size / time.
     pingpong  rank 0 sends to rank 1, which sends it back; time = round
               trip / 2 (one-way latency); the other ranks only take part
               in the barrier and the timing reduction.

     mpicc -O2 -o mpi_sendrecv mpi_sendrecv.c
     mpirun -np 2 ./mpi_sendrecv sendrecv 8 67108864 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char *c = argc > 1 ? argv[1] : "sendrecv";
  int pp = !strcmp(c, "pingpong");
  if (!pp && strcmp(c, "sendrecv")) {
    if (!r) fprintf(stderr, "mpi_sendrecv: unknown mode %s (sendrecv, pingpong)\n", c);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (n < 2) {
    if (!r) fprintf(stderr, "mpi_sendrecv: needs 2 ranks or more\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t minb = argc > 2 ? strtoull(argv[2], 0, 0) : 8, maxb = argc > 3 ? strtoull(argv[3], 0, 0) : (64u << 20);
  char *s = malloc(maxb + 64), *d = malloc(maxb + 64);
  if (!s || !d) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(s, 1, maxb + 64);
  memset(d, 0, maxb + 64);
  int to = (r + 1) % n, from = (r + n - 1) % n;
  if (!r) printf("# mpi %s nproc=%d\n%12s %11s %12s %8s %8s\n", c, n, "size", "count", "time_us", "algbw", "busbw");
  for (size_t b = minb; b <= maxb; b *= 4) {
    int cnt = (int)b;
    int it = b < (1 << 16) ? 1000 : (b < (1 << 22) ? 100 : 10);
    double t = 0, mx;
    for (int pass = 0; pass < 2; pass++) { /* 0: warm-up, 1: timed */
      int k = pass ? it : 5;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < k; i++) {
        if (!pp) {
          MPI_Sendrecv(s, cnt, MPI_BYTE, to, 0, d, cnt, MPI_BYTE, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (r == 0) {
          MPI_Send(s, cnt, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
          MPI_Recv(d, cnt, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (r == 1) {
          MPI_Recv(d, cnt, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(s, cnt, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
      }
      t = (MPI_Wtime() - t0) / k;
      if (pp && r > 1) t = 0;
      if (pp) t /= 2; /* round trip -> one way */
    }
    MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double alg = b / mx / 1e9;
    if (!r) printf("%12zu %11d %12.2f %8.3f %8.3f\n", b, cnt, mx * 1e6, alg, alg);
  }
  free(s);
  free(d);
  MPI_Finalize();
  return 0;
}
