/* nccl_all_reduce.c -- the quick start on GPUs: backend "nccl", device
 * "cuda", buffers in device memory, operations ordered on a CUDA stream of
 * our own (tc_op_options_t.stream), synchronously then asynchronously.
 *
 *   torchrun --no-python --nproc_per_node=<GPUs> ./build/examples/nccl_all_reduce
 *
 * It exits 0 with a "skipping" line where NCCL, the CUDA runtime or a GPU
 * is missing (so it builds and "runs" everywhere); tests/gpu/run.sh runs it
 * on a GPU. To build without a CUDA toolkit it loads the CUDA runtime
 * itself (TORCHCOMMS_CUDART_LIB, else libcudart.so.12/.13/.so, like the
 * backend); a real program includes <cuda_runtime.h> and links -lcudart.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "torchcomms.h"

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*set_device_fn)(int);
typedef int (*stream_create_fn)(void **);
typedef int (*stream_fn)(void *);

static struct {
  malloc_fn malloc_;
  free_fn free_;
  memcpy_fn memcpy_;
  set_device_fn set_device;
  stream_create_fn stream_create;
  stream_fn stream_sync, stream_destroy;
} cuda;

enum { H2D = 1, D2H = 2 }; /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost */

static int load_cuda(void) {
  const char *names[] = {getenv("TORCHCOMMS_CUDART_LIB"), "libcudart.so.12",
                         "libcudart.so.13", "libcudart.so"};
  void *h = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
    if (names[i] && *names[i]) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) return -1;
  *(void **)&cuda.malloc_ = dlsym(h, "cudaMalloc");
  *(void **)&cuda.free_ = dlsym(h, "cudaFree");
  *(void **)&cuda.memcpy_ = dlsym(h, "cudaMemcpy");
  *(void **)&cuda.set_device = dlsym(h, "cudaSetDevice");
  *(void **)&cuda.stream_create = dlsym(h, "cudaStreamCreate");
  *(void **)&cuda.stream_sync = dlsym(h, "cudaStreamSynchronize");
  *(void **)&cuda.stream_destroy = dlsym(h, "cudaStreamDestroy");
  return cuda.malloc_ && cuda.free_ && cuda.memcpy_ && cuda.set_device &&
                 cuda.stream_create && cuda.stream_sync && cuda.stream_destroy
             ? 0 : -1;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) != TC_OK) {                                                     \
      fprintf(stderr, "%s\n", tc_last_error());                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
#define CUDA(call)                                                             \
  do {                                                                         \
    int e_ = (call);                                                           \
    if (e_ != 0) {                                                             \
      fprintf(stderr, "%s failed: CUDA error %d\n", #call, e_);                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

int main(void) {
  if (load_cuda() != 0) {
    printf("nccl_all_reduce: skipping: no CUDA runtime (libcudart) found\n");
    return 0;
  }
  const char *lr = getenv("LOCAL_RANK");
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "main_comm";
  opts.device_index = lr ? atoi(lr) : 0; /* one GPU per local rank */
  tc_comm_t *comm;
  int rc = tc_comm_create("nccl", "cuda", &opts, &comm);
  if (rc == TC_ERR_BACKEND_NOT_FOUND) { /* no NCCL, no GPU */
    printf("nccl_all_reduce: skipping: %s\n", tc_last_error());
    return 0;
  }
  CHECK(rc);
  int rank = tc_comm_rank(comm), size = tc_comm_size(comm);
  CUDA(cuda.set_device(opts.device_index));

  enum { N = 1 << 20 };
  float *host = malloc(N * sizeof *host), *dev = NULL;
  void *stream = NULL;
  for (int i = 0; i < N; i++) host[i] = (float)(rank + 1);
  CUDA(cuda.malloc_((void **)&dev, N * sizeof *dev));
  CUDA(cuda.memcpy_(dev, host, N * sizeof *dev, H2D));
  CUDA(cuda.stream_create(&stream));
  printf("Rank %d: Before AllReduce: %.1f\n", rank, host[0]);

  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.stream = stream; /* ordered after the work already queued on it */
  CHECK(tc_all_reduce(comm, dev, N, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
  tc_work_t *w; /* and again, asynchronously: AVG leaves the sum unchanged */
  CHECK(tc_all_reduce(comm, dev, N, TC_FLOAT32, TC_OP(TC_AVG), &o, &w));
  CHECK(tc_work_wait(w));
  CHECK(tc_work_release(w));
  CUDA(cuda.stream_sync(stream));
  CUDA(cuda.memcpy_(host, dev, N * sizeof *dev, D2H));

  float expect = (float)size * (float)(size + 1) / 2.0f; /* AVG of equals */
  int bad = 0;
  for (int i = 0; i < N; i++) bad += host[i] != expect;
  printf("Rank %d: After AllReduce: %.1f\n", rank, host[0]);
  CUDA(cuda.stream_destroy(stream));
  CUDA(cuda.free_(dev));
  free(host);
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  if (bad) {
    fprintf(stderr, "Rank %d: %d elements differ from %.1f\n", rank, bad, expect);
    return 1;
  }
  return 0;
}
