/* nccl_api.h -- the nccl backend's own declarations of the few NCCL and CUDA
 * runtime types, values and entry points it uses, so that it builds without
 * a CUDA toolkit, and the table they are loaded into at run time
 * (nccl_load.c). The values are NCCL's and CUDA's published ABI (nccl.h,
 * cuda_runtime_api.h, driver_types.h); the fake libraries of the tests
 * (tests/c/fake_nccl/) implement the same declarations.
 */
#ifndef TC_NCCL_API_H
#define TC_NCCL_API_H

#include <limits.h>
#include <stddef.h>

/* ---- NCCL ---- */

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10, /* NCCL >= 2.24 */
  ncclFloat8e5m2 = 11, /* NCCL >= 2.24 */
  ncclNumTypes = 12
} ncclDataType_t;

/* Built-in reductions; values from ncclNumOps up are created by
 * ncclRedOpCreatePreMulSum. */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Windows (NCCL >= 2.27) and host-initiated one-sided operations (NCCL
 * >= 2.29): a window handle, the registration flags, and what
 * ncclWaitSignal waits for (opCnt more signals from peer; sigIdx and ctx
 * must be 0). */
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

#define NCCL_SPLIT_NOCOLOR (-1)
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_API_MAGIC 0xcafebeefu
/* NCCL_VERSION(X, Y, Z) for X >= 2, Y > 8. */
#define TCN_NCCL_VERSION(x, y, z) ((x) * 10000 + (y) * 100 + (z))

/* The prefix of ncclConfig_t that NCCL 2.18 defined. NCCL copies
 * min(size, its own sizeof) bytes and fills every field that `version` does
 * not cover with its defaults, so a newer NCCL accepts this struct. */
typedef struct tcn_config {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
} tcn_config_t;

#define TCN_CONFIG_INIT                                                        \
  {                                                                            \
    .size = sizeof(tcn_config_t), .magic = NCCL_API_MAGIC,                     \
    .version = TCN_NCCL_VERSION(2, 18, 0), .blocking = NCCL_CONFIG_UNDEF_INT,  \
    .cgaClusterSize = NCCL_CONFIG_UNDEF_INT,                                   \
    .minCTAs = NCCL_CONFIG_UNDEF_INT, .maxCTAs = NCCL_CONFIG_UNDEF_INT,        \
    .netName = NULL, .splitShare = NCCL_CONFIG_UNDEF_INT                       \
  }

/* ---- CUDA runtime ---- */

typedef struct CUstream_st *cudaStream_t; /* NULL: the legacy default stream */
typedef struct CUevent_st *cudaEvent_t;
typedef int cudaError_t;

#define cudaSuccess 0
#define cudaErrorNotReady 600
#define cudaStreamNonBlocking 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaMemcpyDefault 4 /* direction from the pointers (unified addressing) */

/* ---- the table of entry points (nccl_load.c) ---- */

/* X(field, symbol, required, signature-return, (args)) for every entry
 * point; optional ones (required = 0) are NULL when the library lacks them
 * (older NCCL). */
#define TCN_NCCL_SYMBOLS(X)                                                    \
  X(GetVersion, ncclGetVersion, 1, ncclResult_t, (int *))                      \
  X(GetUniqueId, ncclGetUniqueId, 1, ncclResult_t, (ncclUniqueId *))          \
  X(CommInitRank, ncclCommInitRank, 1, ncclResult_t,                           \
    (ncclComm_t *, int, ncclUniqueId, int))                                    \
  X(CommInitRankConfig, ncclCommInitRankConfig, 0, ncclResult_t,               \
    (ncclComm_t *, int, ncclUniqueId, int, tcn_config_t *))                    \
  X(CommSplit, ncclCommSplit, 0, ncclResult_t,                                 \
    (ncclComm_t, int, int, ncclComm_t *, tcn_config_t *))                      \
  X(CommFinalize, ncclCommFinalize, 0, ncclResult_t, (ncclComm_t))             \
  X(CommDestroy, ncclCommDestroy, 1, ncclResult_t, (ncclComm_t))               \
  X(CommAbort, ncclCommAbort, 1, ncclResult_t, (ncclComm_t))                   \
  X(CommGetAsyncError, ncclCommGetAsyncError, 1, ncclResult_t,                 \
    (ncclComm_t, ncclResult_t *))                                              \
  X(CommCount, ncclCommCount, 1, ncclResult_t, (const ncclComm_t, int *))      \
  X(CommUserRank, ncclCommUserRank, 1, ncclResult_t,                           \
    (const ncclComm_t, int *))                                                 \
  X(GetErrorString, ncclGetErrorString, 1, const char *, (ncclResult_t))       \
  X(GetLastError, ncclGetLastError, 0, const char *, (ncclComm_t))             \
  X(RedOpCreatePreMulSum, ncclRedOpCreatePreMulSum, 0, ncclResult_t,           \
    (ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t,             \
     ncclComm_t))                                                              \
  X(RedOpDestroy, ncclRedOpDestroy, 0, ncclResult_t, (ncclRedOp_t, ncclComm_t)) \
  X(AllReduce, ncclAllReduce, 1, ncclResult_t,                                 \
    (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,    \
     cudaStream_t))                                                            \
  X(Broadcast, ncclBroadcast, 1, ncclResult_t,                                 \
    (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,            \
     cudaStream_t))                                                            \
  X(Reduce, ncclReduce, 1, ncclResult_t,                                       \
    (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,           \
     ncclComm_t, cudaStream_t))                                                \
  X(AllGather, ncclAllGather, 1, ncclResult_t,                                 \
    (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))  \
  X(ReduceScatter, ncclReduceScatter, 1, ncclResult_t,                         \
    (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,    \
     cudaStream_t))                                                            \
  X(Send, ncclSend, 1, ncclResult_t,                                           \
    (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))     \
  X(Recv, ncclRecv, 1, ncclResult_t,                                           \
    (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))           \
  X(GroupStart, ncclGroupStart, 1, ncclResult_t, (void))                       \
  X(GroupEnd, ncclGroupEnd, 1, ncclResult_t, (void))                           \
  X(MemAlloc, ncclMemAlloc, 0, ncclResult_t, (void **, size_t))                \
  X(MemFree, ncclMemFree, 0, ncclResult_t, (void *))                           \
  X(CommWindowRegister, ncclCommWindowRegister, 0, ncclResult_t,               \
    (ncclComm_t, void *, size_t, ncclWindow_t *, int))                         \
  X(CommWindowDeregister, ncclCommWindowDeregister, 0, ncclResult_t,           \
    (ncclComm_t, ncclWindow_t))                                                \
  X(GetPeerDevicePointer, ncclGetPeerDevicePointer, 0, ncclResult_t,           \
    (ncclWindow_t, size_t, int, void **))                                      \
  X(PutSignal, ncclPutSignal, 0, ncclResult_t,                                 \
    (const void *, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int,     \
     int, unsigned int, ncclComm_t, cudaStream_t))                             \
  X(WaitSignal, ncclWaitSignal, 0, ncclResult_t,                               \
    (int, ncclWaitSignalDesc_t *, ncclComm_t, cudaStream_t))

#define TCN_CUDA_SYMBOLS(X)                                                    \
  X(GetDeviceCount, cudaGetDeviceCount, 1, cudaError_t, (int *))               \
  X(SetDevice, cudaSetDevice, 1, cudaError_t, (int))                           \
  X(GetDevice, cudaGetDevice, 1, cudaError_t, (int *))                         \
  X(StreamCreateWithFlags, cudaStreamCreateWithFlags, 1, cudaError_t,          \
    (cudaStream_t *, unsigned int))                                            \
  X(StreamDestroy, cudaStreamDestroy, 1, cudaError_t, (cudaStream_t))          \
  X(StreamWaitEvent, cudaStreamWaitEvent, 1, cudaError_t,                      \
    (cudaStream_t, cudaEvent_t, unsigned int))                                 \
  X(EventCreateWithFlags, cudaEventCreateWithFlags, 1, cudaError_t,            \
    (cudaEvent_t *, unsigned int))                                             \
  X(EventDestroy, cudaEventDestroy, 1, cudaError_t, (cudaEvent_t))             \
  X(EventRecord, cudaEventRecord, 1, cudaError_t, (cudaEvent_t, cudaStream_t)) \
  X(EventQuery, cudaEventQuery, 1, cudaError_t, (cudaEvent_t))                 \
  X(Malloc, cudaMalloc, 1, cudaError_t, (void **, size_t))                     \
  X(Free, cudaFree, 1, cudaError_t, (void *))                                  \
  X(Memset, cudaMemset, 1, cudaError_t, (void *, int, size_t))                 \
  X(MemcpyAsync, cudaMemcpyAsync, 0, cudaError_t,                              \
    (void *, const void *, size_t, int, cudaStream_t))                         \
  X(GetErrorString, cudaGetErrorString, 1, const char *, (cudaError_t))

typedef struct tcn_nccl_fns {
#define TCN_FIELD(field, sym, req, ret, args) ret(*field) args;
  TCN_NCCL_SYMBOLS(TCN_FIELD)
} tcn_nccl_fns_t;

typedef struct tcn_cuda_fns {
  TCN_CUDA_SYMBOLS(TCN_FIELD)
#undef TCN_FIELD
} tcn_cuda_fns_t;

typedef struct tcn_api {
  tcn_nccl_fns_t nccl;
  tcn_cuda_fns_t cuda;
  int nccl_version; /* ncclGetVersion, e.g. 22703 for 2.27.3 */
  char nccl_path[512];   /* what was loaded (the name or path tried) */
  char cudart_path[512];
} tcn_api_t;

/* Loads NCCL and the CUDA runtime once per process (TORCHCOMMS_NCCL_LIB and
 * TORCHCOMMS_CUDART_LIB, else the usual sonames) and returns the table.
 * On failure writes one sentence naming everything tried into err and
 * returns TC_ERR_BACKEND_NOT_FOUND (missing library) or TC_ERR_BACKEND (a
 * library without the entry points NCCL must have); later calls return the
 * same result. */
int tcn_load(const tcn_api_t **out, char *err, size_t errlen);

/* "ncclRemoteError"-style name of an NCCL result. */
const char *tcn_result_name(ncclResult_t r);

#endif /* TC_NCCL_API_H */
