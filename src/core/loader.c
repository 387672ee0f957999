/* loader.c -- finds a backend by name: the in-process registrations
 * (tc_backend_register), then $TORCHCOMMS_BACKEND_LIB_PATH_<NAME> (a file or
 * a directory), then libtorchcomms-<name>.so beside libtorchcomms, then the
 * built-ins; checks the ABI version and size of the table. Also maps
 * torch's c10d names to ours (tc__backend_alias). */
#include "core.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/builtin.h"

static const tc_backend_ops_t *const builtin_backends[] = {&tc__cpu_backend};

/* Loaded plugins are cached (never unloaded: backends may own threads). */
#define TC_MAX_PLUGINS 16
static struct {
  char name[64];
  const tc_backend_ops_t *ops;
} tc__plugins[TC_MAX_PLUGINS];
static int nplugins;
static pthread_mutex_t loader_mu = PTHREAD_MUTEX_INITIALIZER;

/* In-process registrations (tc_backend_register), looked up first; never
 * removed. */
#define TC_MAX_REGISTERED 64
static const tc_backend_ops_t *tc__registered[TC_MAX_REGISTERED];
static int nregistered;

/* The registered table of `name`, or NULL (loader_mu held). */
static const tc_backend_ops_t *registered_locked(const char *name) {
  for (int i = 0; i < nregistered; i++)
    if (!strcmp(tc__registered[i]->name, name)) return tc__registered[i];
  return NULL;
}

/* Minimum table size of ABI version 2: everything up to `split`. */
#define TC_BACKEND_MIN_SIZE                                                    \
  (offsetof(tc_backend_ops_t, split) + sizeof(((tc_backend_ops_t *)0)->split))

static int check_table(const char *name, const char *where,
                           const tc_backend_ops_t *ops) {
  if (ops->abi_version != TC_BACKEND_ABI_VERSION)
    return tc__set_error(TC_ERR_BACKEND,
                         "torchcomms: backend '%s' from %s has ABI version %u "
                         "but this libtorchcomms speaks version %u (rebuild "
                         "the backend against this torchcomms_backend.h)",
                         name, where, ops->abi_version, TC_BACKEND_ABI_VERSION);
  if (ops->size < TC_BACKEND_MIN_SIZE)
    return tc__set_error(TC_ERR_BACKEND,
                         "torchcomms: backend '%s' from %s has a table of %u "
                         "bytes, smaller than the %zu that ABI version %u "
                         "requires (corrupt or mismatched build)",
                         name, where, ops->size, (size_t)TC_BACKEND_MIN_SIZE,
                         TC_BACKEND_ABI_VERSION);
  if (!ops->init || !ops->finalize || !ops->abort || !ops->destroy || !ops->post)
    return tc__set_error(TC_ERR_BACKEND,
                         "torchcomms: backend '%s' from %s lacks init, "
                         "finalize, abort, destroy or post", name, where);
  return TC_OK;
}

/* Tries to dlopen path. Returns TC_OK with *out, TC_ERR_BACKEND_NOT_FOUND if
 * there is no file (note says why), or another error for a bad plugin. */
static int try_path(const char *name, const char *path,
                        const tc_backend_ops_t **out, char *note,
                        size_t notelen) {
  struct stat st;
  if (stat(path, &st) != 0) {
    snprintf(note, notelen, "%s (%s)", path, strerror(errno));
    return TC_ERR_BACKEND_NOT_FOUND;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return tc__set_error(TC_ERR_BACKEND,
                         "torchcomms: backend '%s': cannot load %s: %s", name,
                         path, dlerror());
  const tc_backend_ops_t *ops = dlsym(h, TC_BACKEND_SYMBOL);
  if (!ops && dlsym(h, TC_BACKEND_SYMBOL_V1)) {
    dlclose(h);
    return tc__set_error(TC_ERR_BACKEND,
                         "torchcomms: backend '%s' from %s has ABI version 1 "
                         "(symbol '%s') but this libtorchcomms speaks version "
                         "%u (rebuild the backend against this "
                         "torchcomms_backend.h)", name, path,
                         TC_BACKEND_SYMBOL_V1, TC_BACKEND_ABI_VERSION);
  }
  if (!ops) {
    dlclose(h);
    return tc__set_error(TC_ERR_BACKEND,
                         "torchcomms: backend '%s': %s does not export the "
                         "symbol '%s' (is it a torchcomms backend?)",
                         name, path, TC_BACKEND_SYMBOL);
  }
  int rc = check_table(name, path, ops);
  if (rc != TC_OK) {
    dlclose(h);
    return rc;
  }
  *out = ops;
  return TC_OK;
}

static int valid_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n >= 48) return 0;
  for (size_t i = 0; i < n; i++)
    if (!(islower((unsigned char)name[i]) || isdigit((unsigned char)name[i]) ||
          name[i] == '_' || name[i] == '-'))
      return 0;
  return 1;
}

int tc_backend_register(const tc_backend_ops_t *ops) {
  static const char *fn = "tc_backend_register";
  if (!ops)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: argument 'ops' is NULL", fn);
  if (!ops->name || !valid_name(ops->name))
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: backend name '%s' is invalid "
                         "(lower-case letters, digits, '_' and '-', at most "
                         "47 characters)", fn, ops->name ? ops->name : "(null)");
  TC_CHECK(check_table(ops->name, "tc_backend_register", ops));
  pthread_mutex_lock(&loader_mu);
  const tc_backend_ops_t *old = registered_locked(ops->name);
  int rc = TC_OK;
  if (old && old != ops)
    rc = tc__set_error(TC_ERR_INVALID_USAGE,
                       "torchcomms: %s: backend '%s' is already registered "
                       "with another table (the first registration stays; "
                       "choose another name)", fn, ops->name);
  else if (!old && nregistered == TC_MAX_REGISTERED)
    rc = tc__set_error(TC_ERR_INVALID_USAGE,
                       "torchcomms: %s: cannot register backend '%s': %d "
                       "backends are registered already (the limit)", fn,
                       ops->name, TC_MAX_REGISTERED);
  else if (!old)
    tc__registered[nregistered++] = ops;
  pthread_mutex_unlock(&loader_mu);
  return rc;
}

const char *tc__backend_alias(const char *name, const char *device) {
  /* torch.distributed's own switch to torchcomms (use_torchcomms) asks for
   * its c10d backend name: "gloo" for CPU tensors, or the name a c10d
   * backend was registered under ("torchcomms"). On CPU the native backend
   * "cpu" serves both, unless a gloo plugin is named explicitly through
   * TORCHCOMMS_BACKEND_LIB_PATH_GLOO. */
  if (!name || !device || strcmp(device, "cpu") != 0) return name;
  pthread_mutex_lock(&loader_mu); /* a registration of the name wins */
  const tc_backend_ops_t *reg = registered_locked(name);
  pthread_mutex_unlock(&loader_mu);
  if (reg) return name;
  if (!strcmp(name, "torchcomms")) return "cpu";
  if (!strcmp(name, "gloo") && !tc__env_str("TORCHCOMMS_BACKEND_LIB_PATH_GLOO"))
    return "cpu";
  return name;
}

int tc__backend_find(const char *name, const tc_backend_ops_t **out) {
  if (!name)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_comm_create: argument 'backend' is "
                         "NULL (use \"cpu\", \"nccl\" or a plugin name)");
  if (!valid_name(name))
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_comm_create: backend name '%s' is "
                         "invalid (lower-case letters, digits, '_' and '-')",
                         name);
  pthread_mutex_lock(&loader_mu);
  const tc_backend_ops_t *reg = registered_locked(name);
  if (reg) {
    *out = reg;
    pthread_mutex_unlock(&loader_mu);
    return TC_OK;
  }
  for (int i = 0; i < nplugins; i++)
    if (!strcmp(tc__plugins[i].name, name)) {
      *out = tc__plugins[i].ops;
      pthread_mutex_unlock(&loader_mu);
      return TC_OK;
    }
  char envname[96], upper[64], tried1[600], tried2[600], path[4096];
  size_t n = strlen(name);
  for (size_t i = 0; i <= n; i++)
    upper[i] = name[i] == '-' ? '_' : (char)toupper((unsigned char)name[i]);
  snprintf(envname, sizeof envname, "TORCHCOMMS_BACKEND_LIB_PATH_%s", upper);
  const tc_backend_ops_t *ops = NULL;
  int rc = TC_ERR_BACKEND_NOT_FOUND;

  /* 1. the environment: a file, or a directory holding the plugin */
  const char *env = tc__env_str(envname);
  if (env) {
    struct stat st;
    if (stat(env, &st) == 0 && S_ISDIR(st.st_mode))
      snprintf(path, sizeof path, "%s/libtorchcomms-%s.so", env, name);
    else
      snprintf(path, sizeof path, "%s", env);
    rc = try_path(name, path, &ops, tried1, sizeof tried1);
  } else {
    snprintf(tried1, sizeof tried1, "$%s (unset)", envname);
  }
  /* 2. beside libtorchcomms */
  if (rc == TC_ERR_BACKEND_NOT_FOUND) {
    Dl_info info;
    if (dladdr((void *)&tc_comm_create, &info) && info.dli_fname) {
      snprintf(path, sizeof path, "%s", info.dli_fname);
      char *slash = strrchr(path, '/');
      if (slash) *slash = 0; else snprintf(path, sizeof path, ".");
      size_t l = strlen(path);
      snprintf(path + l, sizeof path - l, "/libtorchcomms-%s.so", name);
      rc = try_path(name, path, &ops, tried2, sizeof tried2);
    } else {
      snprintf(tried2, sizeof tried2, "the library's directory (unknown)");
    }
  }
  /* 3. built-ins */
  if (rc == TC_ERR_BACKEND_NOT_FOUND) {
    for (size_t i = 0; i < sizeof builtin_backends / sizeof builtin_backends[0]; i++)
      if (!strcmp(builtin_backends[i]->name, name)) {
        ops = builtin_backends[i];
        rc = TC_OK;
      }
  }
  if (rc == TC_OK && nplugins < TC_MAX_PLUGINS) {
    snprintf(tc__plugins[nplugins].name, sizeof tc__plugins[0].name, "%s",
             name);
    tc__plugins[nplugins++].ops = ops;
  }
  pthread_mutex_unlock(&loader_mu);
  if (rc == TC_ERR_BACKEND_NOT_FOUND) {
    char builtins[256] = "";
    for (size_t i = 0; i < sizeof builtin_backends / sizeof builtin_backends[0]; i++) {
      size_t l = strlen(builtins);
      snprintf(builtins + l, sizeof builtins - l, "%s%s", i ? ", " : "",
               builtin_backends[i]->name);
    }
    return tc__set_error(TC_ERR_BACKEND_NOT_FOUND,
                         "torchcomms: backend '%s' not found: tried %s, %s, and "
                         "the built-in backends (%s); set %s to the path of "
                         "libtorchcomms-%s.so",
                         name, tried1, tried2, builtins, envname, name);
  }
  if (rc == TC_OK) *out = ops;
  return rc;
}
