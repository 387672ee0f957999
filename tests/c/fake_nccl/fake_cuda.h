/* fake_cuda.h -- what the fake CUDA runtime (fake_cudart.c) offers beyond
 * the CUDA entry points, for the fake NCCL (fake_nccl.c) and the tests.
 * The declarations of the CUDA and NCCL types and values are the nccl
 * backend's own (src/backends/nccl/nccl_api.h). */
#ifndef TC_FAKE_CUDA_H
#define TC_FAKE_CUDA_H

#include "nccl_api.h"

#define TCFAKE_API __attribute__((visibility("default")))

/* Queues fn(arg) on stream s (NULL, cudaStreamLegacy and
 * cudaStreamPerThread are the default stream); it runs on the stream's own
 * thread after everything queued before it. Returns a cudaError_t. */
TCFAKE_API cudaError_t tcfake_stream_enqueue(cudaStream_t s,
                                             void (*fn)(void *), void *arg);

/* The CUDA entry points the fake defines (the backend reaches them with
 * dlsym; the tests and the fake NCCL call them directly). */
TCFAKE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s,
                                                 unsigned int flags);
TCFAKE_API cudaError_t cudaStreamDestroy(cudaStream_t s);
TCFAKE_API cudaError_t cudaStreamSynchronize(cudaStream_t s);
TCFAKE_API cudaError_t cudaSetDevice(int device);
TCFAKE_API cudaError_t cudaGetDevice(int *device);

#endif
