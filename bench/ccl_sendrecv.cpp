/* Anchor: oneCCL point-to-point (ccl::send / ccl::recv), what
   `tcperf -c send_recv` and bench/mpi_sendrecv.c measure: every rank sends
   SIZE bytes to rank r+1 and receives SIZE bytes from rank r-1; one
   iteration posts the send and the receive (both asynchronous oneCCL
   operations) and waits for both. Same rules and columns as
   ../shared/bench/anchors/ccl_perf.cpp and mpi_perf.c (size count time_us
   algbw busbw, GB/s = 1e9 B/s, sizes MIN, 4*MIN ... <= MAX, 5 warm-ups, then
   1000 / 100 / 10 timed iterations below 64 KiB / below 4 MiB / above,
   time = max over ranks; algbw = busbw = size / time). Before timing each
   size, one exchange of known data is checked byte by byte (untimed;
   CCL_PERF_NOCHECK=1 skips it).

   MPI (MPICH's libmpi.so.12) only launches, passes oneCCL's KVS address,
   barriers and takes the max time. bench/bench_anchors.py builds it into
   $ANCHOR_CACHE/bin/ccl_sendrecv as run_anchor.sh builds ccl_perf and runs
   it with the `ccl` anchor's environment (ATL ofi; shm provider, or tcp):

     c++ -O2 -std=c++17 -I$CCL/include -I$MPICH/include -o ccl_sendrecv \
         ccl_sendrecv.cpp -L$CCL/lib -lccl -L$MPICH/lib -lmpi \
         -Wl,-rpath,$CCL/lib:$MPICH/lib
     mpiexec -launcher fork -n 2 ./ccl_sendrecv sendrecv 8 67108864 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
/* The wheel's config.h is the GPU build's (see ccl_perf.cpp). */
#include "oneapi/ccl/config.h"
#undef CCL_ENABLE_SYCL
#undef CCL_ENABLE_ZE
#include "oneapi/ccl.hpp"

static void exchange(char *s, char *d, size_t b, int to, int from, const ccl::communicator &comm) {
  auto es = ccl::send(s, b, ccl::datatype::int8, to, comm);
  auto er = ccl::recv(d, b, ccl::datatype::int8, from, comm);
  es.wait();
  er.wait();
}

int main(int argc, char **argv) {
  int prov = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char *mode = argc > 1 ? argv[1] : "sendrecv";
  if (strcmp(mode, "sendrecv")) {
    if (!r) fprintf(stderr, "ccl_sendrecv: unknown mode %s (sendrecv)\n", mode);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (n < 2) {
    if (!r) fprintf(stderr, "ccl_sendrecv: needs 2 ranks or more\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t minb = argc > 2 ? strtoull(argv[2], 0, 0) : 8, maxb = argc > 3 ? strtoull(argv[3], 0, 0) : (64u << 20);
  ccl::init();
  {
    ccl::shared_ptr_class<ccl::kvs> kvs;
    ccl::kvs::address_type addr;
    if (!r) {
      kvs = ccl::create_main_kvs();
      addr = kvs->get_address();
    }
    MPI_Bcast(addr.data(), (int)addr.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (r) kvs = ccl::create_kvs(addr);
    auto comm = ccl::create_communicator(n, r, kvs);
    char *s = (char *)malloc(maxb + 64), *d = (char *)malloc(maxb + 64);
    if (!s || !d) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(s, 1, maxb + 64);
    memset(d, 0, maxb + 64);
    int to = (r + 1) % n, from = (r + n - 1) % n;
    if (!r) {
      const char *atl = getenv("CCL_ATL_TRANSPORT"), *shm = getenv("CCL_ATL_SHM");
      std::string t = atl && !strcmp(atl, "mpi") ? "atl=mpi" : std::string("atl=ofi shm=") + (shm ? shm : "0");
      printf("# ccl %s nproc=%d %s\n%12s %11s %12s %8s %8s\n", mode, n, t.c_str(), "size", "count", "time_us",
             "algbw", "busbw");
      fflush(stdout);
    }
    const bool chk = !getenv("CCL_PERF_NOCHECK");
    for (size_t b = minb; b <= maxb; b *= 4) {
      int it = b < (1 << 16) ? 1000 : (b < (1 << 22) ? 100 : 10);
      if (chk) { /* byte k of rank r's message: (r * 31 + k) & 0x7f */
        for (size_t k = 0; k < b; k++) s[k] = (char)((r * 31 + k) & 0x7f), d[k] = -1;
        exchange(s, d, b, to, from, comm);
        size_t bad = 0;
        for (size_t k = 0; k < b; k++) bad += d[k] != (char)((from * 31 + k) & 0x7f);
        int ok = bad == 0, all = 0;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all) {
          if (bad) fprintf(stderr, "ccl_sendrecv: rank %d: %zu bytes: %zu wrong bytes\n", r, b, bad);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
        memset(s, 1, b);
      }
      for (int i = 0; i < 5; i++) exchange(s, d, b, to, from, comm);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < it; i++) exchange(s, d, b, to, from, comm);
      double t = (MPI_Wtime() - t0) / it, mx;
      MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double alg = b / mx / 1e9;
      if (!r) printf("%12zu %11zu %12.2f %8.3f %8.3f\n", b, b, mx * 1e6, alg, alg), fflush(stdout);
    }
    if (!r && chk) printf("# results checked at every size (CCL_PERF_NOCHECK=1 skips)\n");
    free(s);
    free(d);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return 0;
}
