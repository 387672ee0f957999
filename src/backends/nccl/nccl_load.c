/* nccl_load.c -- loads NCCL and the CUDA runtime with dlopen, once per
 * process, into the table of entry points (nccl_api.h).
 *
 * Where: $TORCHCOMMS_NCCL_LIB (only that path when set), else libnccl.so.2
 * then libnccl.so; $TORCHCOMMS_CUDART_LIB, else libcudart.so.12,
 * libcudart.so.13, libcudart.so.11.0 then libcudart.so. A library already in
 * the process (torch loads both from the nvidia-* wheels) is found by its
 * soname. Both are opened RTLD_LOCAL: nothing they define leaks into the
 * process's global symbol scope.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_api.h"
#include "torchcomms.h"

static pthread_mutex_t tcn_load_mu = PTHREAD_MUTEX_INITIALIZER;
static int tcn_loaded;     /* 1 once tried */
static int tcn_load_rc;    /* the result of that try */
static char tcn_load_err[1536];
static tcn_api_t tcn_api;

const char *tcn_result_name(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "ncclSuccess";
  case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
  case ncclSystemError: return "ncclSystemError";
  case ncclInternalError: return "ncclInternalError";
  case ncclInvalidArgument: return "ncclInvalidArgument";
  case ncclInvalidUsage: return "ncclInvalidUsage";
  case ncclRemoteError: return "ncclRemoteError";
  case ncclInProgress: return "ncclInProgress";
  case ncclTimeout: return "ncclTimeout";
  default: return "unknown ncclResult_t";
  }
}

/* dlerror() without the leading "<name>: " it repeats. */
static const char *tcn_dlerror(const char *name) {
  const char *e = dlerror();
  if (!e) return "unknown error";
  size_t n = strlen(name);
  if (!strncmp(e, name, n) && e[n] == ':' && e[n + 1] == ' ') e += n + 2;
  return e;
}

/* Opens the first loadable of names[] (or $env alone when set). On failure
 * appends "tried a (why), b (why) and c (why)" to tried. */
static void *tcn_open(const char *env, const char *const *names, size_t nnames,
                      char *loaded, size_t loadedlen, char *tried,
                      size_t triedlen) {
  const char *one[1];
  const char *val = getenv(env);
  if (val && *val) {
    one[0] = val;
    names = one;
    nnames = 1;
  }
  size_t l = 0;
  for (size_t i = 0; i < nnames; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      snprintf(loaded, loadedlen, "%s", names[i]);
      return h;
    }
    const char *why = tcn_dlerror(names[i]);
    const char *sep = i == 0 ? "" : i + 1 == nnames ? " and " : ", ";
    if (l < triedlen)
      l += (size_t)snprintf(tried + l, triedlen - l, "%s%s%s%s (%s)", sep,
                            names[i], val && *val ? " from $" : "",
                            val && *val ? env : "", why);
  }
  return NULL;
}

/* Resolves every symbol of one list; returns the first required one
 * missing, or NULL. */
#define TCN_RESOLVE(field, sym, req, ret, args)                                \
  *(void **)&fns->field = dlsym(h, #sym);                                      \
  if (!fns->field && (req) && !missing) missing = #sym;

static const char *tcn_resolve_nccl(void *h, tcn_nccl_fns_t *fns) {
  const char *missing = NULL;
  TCN_NCCL_SYMBOLS(TCN_RESOLVE)
  return missing;
}

static const char *tcn_resolve_cuda(void *h, tcn_cuda_fns_t *fns) {
  const char *missing = NULL;
  TCN_CUDA_SYMBOLS(TCN_RESOLVE)
  return missing;
}
#undef TCN_RESOLVE

static int tcn_load_locked(void) {
  static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so"};
  static const char *const cudart_names[] = {
      "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0",
      "libcudart.so"};
  char tried[1024] = "";
  void *hn = tcn_open("TORCHCOMMS_NCCL_LIB", nccl_names,
                      sizeof nccl_names / sizeof nccl_names[0],
                      tcn_api.nccl_path, sizeof tcn_api.nccl_path, tried,
                      sizeof tried);
  if (!hn) {
    snprintf(tcn_load_err, sizeof tcn_load_err,
             "cannot load the NCCL library: tried %s; install NCCL (for "
             "example pip install nvidia-nccl-cu12) or set "
             "TORCHCOMMS_NCCL_LIB to the path of libnccl.so.2", tried);
    return TC_ERR_BACKEND_NOT_FOUND;
  }
  tried[0] = 0;
  void *hc = tcn_open("TORCHCOMMS_CUDART_LIB", cudart_names,
                      sizeof cudart_names / sizeof cudart_names[0],
                      tcn_api.cudart_path, sizeof tcn_api.cudart_path, tried,
                      sizeof tried);
  if (!hc) {
    snprintf(tcn_load_err, sizeof tcn_load_err,
             "cannot load the CUDA runtime library: tried %s; install it (for "
             "example pip install nvidia-cuda-runtime-cu12) or set "
             "TORCHCOMMS_CUDART_LIB to the path of libcudart.so", tried);
    return TC_ERR_BACKEND_NOT_FOUND;
  }
  const char *missing = tcn_resolve_nccl(hn, &tcn_api.nccl);
  if (missing) {
    snprintf(tcn_load_err, sizeof tcn_load_err,
             "%s was loaded but does not define %s (NCCL older than 2.7, or "
             "not NCCL); set TORCHCOMMS_NCCL_LIB to a newer libnccl.so.2",
             tcn_api.nccl_path, missing);
    return TC_ERR_BACKEND;
  }
  missing = tcn_resolve_cuda(hc, &tcn_api.cuda);
  if (missing) {
    snprintf(tcn_load_err, sizeof tcn_load_err,
             "%s was loaded but does not define %s (not the CUDA runtime?); "
             "set TORCHCOMMS_CUDART_LIB to libcudart.so",
             tcn_api.cudart_path, missing);
    return TC_ERR_BACKEND;
  }
  /* The pre-multiplied sum needs both halves. */
  if (!tcn_api.nccl.RedOpDestroy) tcn_api.nccl.RedOpCreatePreMulSum = NULL;
  ncclResult_t r = tcn_api.nccl.GetVersion(&tcn_api.nccl_version);
  if (r != ncclSuccess) {
    snprintf(tcn_load_err, sizeof tcn_load_err,
             "ncclGetVersion of %s failed with %s", tcn_api.nccl_path,
             tcn_result_name(r));
    return TC_ERR_BACKEND;
  }
  /* the handles stay open for the life of the process */
  return TC_OK;
}

int tcn_load(const tcn_api_t **out, char *err, size_t errlen) {
  pthread_mutex_lock(&tcn_load_mu);
  if (!tcn_loaded) {
    tcn_load_rc = tcn_load_locked();
    tcn_loaded = 1;
  }
  int rc = tcn_load_rc;
  if (rc == TC_OK) *out = &tcn_api;
  else snprintf(err, errlen, "%s", tcn_load_err);
  pthread_mutex_unlock(&tcn_load_mu);
  return rc;
}
