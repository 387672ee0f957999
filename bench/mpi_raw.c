/* mpi_raw.c -- the raw-MPI side of bench/mpi_bench.py: ITERS back-to-back
 * blocking calls of one collective on BYTES of float32 (sum for the
 * all_reduce), after a barrier, timed as a whole; prints "BYTES TIME_US",
 * the average per call, the maximum over ranks (as tcperf -m avg).
 * Built with each MPI's mpicc by the script; MPI_Init (a plain MPI program).
 *
 *   mpirun -np N mpi_raw allreduce|bcast|allgather BYTES ITERS [WARMUP] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc < 4) {
    fprintf(stderr, "usage: mpi_raw allreduce|bcast|allgather BYTES ITERS [WARMUP]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char *coll = argv[1];
  size_t bytes = strtoull(argv[2], NULL, 10);
  long iters = strtol(argv[3], NULL, 10), warm = argc > 4 ? strtol(argv[4], NULL, 10) : 5;
  int count = (int)(bytes / 4);
  float *a = calloc(count * (size_t)n + 16, 4), *b = calloc(count * (size_t)n + 16, 4);
  int kind = !strcmp(coll, "allreduce") ? 0 : !strcmp(coll, "bcast") ? 1 : 2;
  double t = 0;
  for (long i = -warm; i < iters; i++) {
    if (i == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      t = MPI_Wtime();
    }
    if (kind == 0) MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (kind == 1) MPI_Bcast(a, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
    else MPI_Allgather(a, count / n, MPI_FLOAT, b, count / n, MPI_FLOAT, MPI_COMM_WORLD);
  }
  t = (MPI_Wtime() - t) / (double)iters * 1e6;
  double worst;
  MPI_Reduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("%zu %.3f\n", bytes, worst);
  free(a);
  free(b);
  MPI_Finalize();
  return 0;
}
