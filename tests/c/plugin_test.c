/* plugin_test.c -- a tiny out-of-tree backend plugin, "testplugin", proving
 * the loader path. Built by CMake as build/plugins/libtorchcomms-testplugin.so
 * with only include/ on the include path (the public headers are all a
 * plugin needs) and hidden visibility: the only exported symbol is the table
 * tc_backend_table.
 *
 * It supports world size 1 only (init fails with a clear message for more),
 * the dtypes float32, float64, int32 and int64, and two operations:
 * all_reduce (the identity for one rank, except PREMUL_SUM which scales by
 * its factor) and barrier. Its supports() refuses every other operation,
 * so the core reports TC_ERR_NOT_SUPPORTED for them. Being trivial, it completes each operation
 * synchronously inside the entry (work_started then work_complete), which the
 * ABI allows for a backend whose operations cannot block.
 * The op hint "testplugin.fail" = "1" makes all_reduce and barrier fail with
 * TC_ERR_BACKEND (completed inside the entry, like a success), to test how
 * the core handles a backend reporting an error synchronously.
 * Used by tests/c/test_loader.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torchcomms_backend.h"

typedef struct testplugin_comm {
  const tc_backend_host_t *host;
  char name[128];
  int finalized;
} testplugin_comm_t;

/* 1 if the op carries the hint testplugin.fail=1. */
static int tp_should_fail(const tc_backend_op_t *op) {
  for (size_t i = 0; i < op->num_hints; i++)
    if (!strcmp(op->hints[i].key, "testplugin.fail") &&
        !strcmp(op->hints[i].value, "1"))
      return 1;
  return 0;
}

/* Completes work with the injected failure: the reason only, the core adds
 * the operation, the communicator and the rank. */
static int tp_fail(testplugin_comm_t *c, tc_work_t *work) {
  c->host->work_complete(work, TC_ERR_BACKEND, "testplugin: injected failure");
  return TC_OK;
}

static int tp_init(const tc_backend_init_args_t *args, void **bcomm, char *err,
                   size_t errlen) {
  if (args->world_size != 1) {
    snprintf(err, errlen,
             "the testplugin backend supports world size 1 only (got world "
             "size %d)", args->world_size);
    return TC_ERR_NOT_SUPPORTED;
  }
  testplugin_comm_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  c->host = args->host;
  snprintf(c->name, sizeof c->name, "%s", args->comm_name);
  *bcomm = c;
  return TC_OK;
}

static int tp_finalize(void *bcomm, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  ((testplugin_comm_t *)bcomm)->finalized = 1;
  return TC_OK;
}

static int tp_abort(void *bcomm) {
  (void)bcomm;
  return TC_OK;
}

static void tp_destroy(void *bcomm) { free(bcomm); }

static int tp_supports(void *bcomm, tc_op_type_t type, tc_dtype_t dt, int redop) {
  (void)bcomm;
  (void)redop;
  if (type != TC_OP_ALL_REDUCE && type != TC_OP_BARRIER) return 0;
  return dt == TC_DTYPE_COUNT || dt == TC_FLOAT32 || dt == TC_FLOAT64 ||
         dt == TC_INT32 || dt == TC_INT64;
}

/* One rank: the reduction of one input is the input itself, except that
 * PREMUL_SUM multiplies it by the factor. */
static int tp_all_reduce(void *bcomm, const tc_backend_op_t *op,
                         tc_work_t *work) {
  testplugin_comm_t *c = bcomm;
  c->host->work_started(work);
  if (tp_should_fail(op)) return tp_fail(c, work);
  if (op->redop.type == TC_PREMUL_SUM) {
    double f = op->redop.factor;
    for (size_t i = 0; i < op->count; i++) {
      switch (op->dtype) {
      case TC_FLOAT32: ((float *)op->recvbuf)[i] *= (float)f; break;
      case TC_FLOAT64: ((double *)op->recvbuf)[i] *= f; break;
      case TC_INT32:
        ((int32_t *)op->recvbuf)[i] =
            (int32_t)((double)((int32_t *)op->recvbuf)[i] * f);
        break;
      case TC_INT64:
        ((int64_t *)op->recvbuf)[i] =
            (int64_t)((double)((int64_t *)op->recvbuf)[i] * f);
        break;
      default: break;
      }
    }
  }
  c->host->work_complete(work, TC_OK, NULL);
  return TC_OK;
}

static int tp_barrier(void *bcomm, const tc_backend_op_t *op, tc_work_t *work) {
  testplugin_comm_t *c = bcomm;
  c->host->work_started(work);
  if (tp_should_fail(op)) return tp_fail(c, work);
  c->host->work_complete(work, TC_OK, NULL);
  return TC_OK;
}

/* Built a second time with TC_TESTPLUGIN_BAD_ABI as libtorchcomms-badabi.so,
 * claiming a future ABI version, to prove the loader refuses it. */
#ifdef TC_TESTPLUGIN_BAD_ABI
#define TP_ABI (TC_BACKEND_ABI_VERSION + 1)
#else
#define TP_ABI TC_BACKEND_ABI_VERSION
#endif

/* The one post entry: the two operations supports() admits. */
static int tp_post(void *bcomm, const tc_backend_op_t *op, tc_work_t *work, char *err,
                   size_t errlen) {
  if (op->kind == TC_KIND_ALL_REDUCE) return tp_all_reduce(bcomm, op, work);
  if (op->kind == TC_KIND_BARRIER) return tp_barrier(bcomm, op, work);
  snprintf(err, errlen, "testplugin: %s reached post although supports() refuses it",
           tc_backend_op_name(op->type));
  return TC_ERR_INTERNAL;
}

/* Built a third time with TC_TESTPLUGIN_V1_SYMBOL as libtorchcomms-oldabi.so,
 * exporting the table under ABI version 1's symbol name, as a plugin built
 * before ABI version 2 does. */
#ifdef TC_TESTPLUGIN_V1_SYMBOL
#define tc_backend_table tc_backend_v1
#endif

TC_API const tc_backend_ops_t tc_backend_table = {
    .abi_version = TP_ABI,
    .size = sizeof(tc_backend_ops_t),
    .name = "testplugin",
    .version = "1.0-test",
    .init = tp_init,
    .finalize = tp_finalize,
    .abort = tp_abort,
    .destroy = tp_destroy,
    .post = tp_post,
    .supports = tp_supports,
};
