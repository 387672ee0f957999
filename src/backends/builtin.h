/* builtin.h -- the backends built into libtorchcomms, as the loader sees
 * them (src/core/loader.c). Deliberately shared across layers: this header
 * is the only one of src/backends/ that the core includes; each backend's
 * own header (backends/cpu/cpu.h) stays private to its directory. A new
 * built-in backend adds its table here and to the loader's list. */
#ifndef TC_BACKENDS_BUILTIN_H
#define TC_BACKENDS_BUILTIN_H

#include "torchcomms_backend.h"

/* The native "cpu" backend (src/backends/cpu/backend.c). */
extern const tc_backend_ops_t tc__cpu_backend
    __attribute__((visibility("hidden")));

#endif /* TC_BACKENDS_BUILTIN_H */
