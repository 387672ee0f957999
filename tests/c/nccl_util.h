/* nccl_util.h -- helpers of the nccl backend's tests (test_nccl.c,
 * test_nccl_ops.c): the fake NCCL and CUDA runtime of tests/c/fake_nccl/,
 * built into build/fake_nccl/, loaded through TORCHCOMMS_NCCL_LIB and
 * TORCHCOMMS_CUDART_LIB, and communicators on backend "nccl", device
 * "cuda" (the fake's "device pointers" are host pointers). */
#ifndef TC_NCCL_UTIL_H
#define TC_NCCL_UTIL_H

#include <dlfcn.h>
#include <stdlib.h>

#include "coll_util.h"

#define FAKE_NCCL TC_BUILD_DIR "/fake_nccl/libtcfake_nccl.so"
#define FAKE_CUDART TC_BUILD_DIR "/fake_nccl/libtcfake_cudart.so"

/* TC_NCCL_REAL=1 (tests/gpu/run.sh): the real NCCL and CUDA runtime named
 * by TORCHCOMMS_NCCL_LIB / TORCHCOMMS_CUDART_LIB (or found by soname), and
 * the test buffers in CUDA managed memory (reachable by NCCL's kernels and
 * by the checks on the host). Only test_nccl_ops.c supports it. */
static inline int nccl_real(void) {
  const char *v = getenv("TC_NCCL_REAL");
  return v && !strcmp(v, "1");
}

/* A test buffer: malloc, or cudaMallocManaged when nccl_real(). */
static inline void *nccl_buf(size_t bytes) {
  if (!nccl_real()) return tc_xmalloc(bytes);
  static int (*managed)(void **, size_t, unsigned int);
  if (!managed) {
    const char *names[] = {getenv("TORCHCOMMS_CUDART_LIB"), "libcudart.so.12",
                           "libcudart.so.13", "libcudart.so"};
    void *h = NULL;
    for (size_t i = 0; i < 4 && !h; i++)
      if (names[i] && *names[i]) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) *(void **)&managed = dlsym(h, "cudaMallocManaged");
    if (!managed)
      tc_test_fail(__FILE__, __LINE__, "TC_NCCL_REAL=1 but no "
                   "cudaMallocManaged (set TORCHCOMMS_CUDART_LIB)");
  }
  void *p = NULL;
  if (managed(&p, bytes ? bytes : 1, 1u /* cudaMemAttachGlobal */) != 0)
    tc_test_fail(__FILE__, __LINE__, "cudaMallocManaged(%zu) failed", bytes);
  return p;
}

static inline void nccl_free(void *p) {
  if (!nccl_real()) {
    free(p);
    return;
  }
  static int (*cfree)(void *);
  if (!cfree) {
    const char *lib = getenv("TORCHCOMMS_CUDART_LIB");
    void *h = dlopen(lib && *lib ? lib : "libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
    if (h) *(void **)&cfree = dlsym(h, "cudaFree");
  }
  if (cfree) cfree(p);
}

/* Points the backend at the fakes (unless nccl_real()), clears every fault
 * setting. Call before tc_spawn: the ranks inherit the environment. The
 * nccl module is found through TORCHCOMMS_BACKEND_LIB_PATH_NCCL (the build
 * directory) so that the tests do not depend on how tc_test was started. */
static inline void nccl_use_fake(void) {
  static const char *clear[] = {
      "TCFAKE_NCCL_FAULT", "TCFAKE_NCCL_INPROGRESS", "TCFAKE_CUDA_DEVICES",
      "TCFAKE_NCCL_VERSION", "TORCHCOMMS_NCCL_FAKE_HOST", "RANK", "WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "TORCHCOMM_RANK", "TORCHCOMM_SIZE"};
  for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++)
    unsetenv(clear[i]);
  setenv("TORCHCOMMS_BACKEND_LIB_PATH_NCCL", TC_BUILD_DIR, 1);
  if (nccl_real()) return;
  setenv("TORCHCOMMS_NCCL_LIB", FAKE_NCCL, 1);
  setenv("TORCHCOMMS_CUDART_LIB", FAKE_CUDART, 1);
  setenv("TCFAKE_NCCL_TIMEOUT", "30", 1);
}

/* tc_comm_create("nccl", "cuda") for the rank, on device rank % 4, with
 * the given timeout (<= 0: 30 s); returns the status, *out on success. */
static inline int nccl_try_comm(tc_ctx_t *ctx, const char *name,
                                double timeout_s, tc_comm_t **out) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = ctx->rank;
  o.world_size = ctx->size;
  o.name = name;
  o.timeout_s = timeout_s > 0 ? timeout_s : 30.0;
  o.device_index = ctx->rank % 4;
  o.store = tc_ctx_store(ctx);
  *out = NULL;
  int rc = tc_comm_create("nccl", "cuda", &o, out);
  tc_store_release(o.store);
  return rc;
}

/* Like nccl_try_comm but asserts success. */
static inline tc_comm_t *nccl_comm(tc_ctx_t *ctx, const char *name,
                                   double timeout_s) {
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(nccl_try_comm(ctx, name, timeout_s, &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "nccl");
  return c;
}

#endif
