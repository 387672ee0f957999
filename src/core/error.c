/* error.c -- status codes, per-thread error text, clock, logging, env. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define TC_ERRBUF 1024
static _Thread_local char tc__errbuf[TC_ERRBUF];

const char *tc_strerror(int status) {
  switch (status) {
#define TC__STATUS_MSG(name, val, msg)                                         \
  case val:                                                                    \
    return msg;
    TC_STATUS_MAP(TC__STATUS_MSG)
#undef TC__STATUS_MSG
  }
  return "unknown status code";
}

const char *tc_status_name(int status) {
  switch (status) {
#define TC__STATUS_NAME(name, val, msg)                                        \
  case val:                                                                    \
    return "TC_" #name;
    TC_STATUS_MAP(TC__STATUS_NAME)
#undef TC__STATUS_NAME
  }
  return "TC_UNKNOWN";
}

const char *tc_last_error(void) { return tc__errbuf; }
const char *tc_version(void) { return TC_VERSION_STRING; }
void tc_free(void *ptr) { free(ptr); }

int tc__set_error_v(int rc, const char *fmt, va_list ap) {
  vsnprintf(tc__errbuf, sizeof tc__errbuf, fmt, ap);
  return rc;
}

int tc__set_error(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tc__set_error_v(rc, fmt, ap);
  va_end(ap);
  return rc;
}

int tc__set_error_text(int rc, const char *text) {
  snprintf(tc__errbuf, sizeof tc__errbuf, "%s", text ? text : "");
  return rc;
}

double tc__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *tc__env_str(const char *name) {
  const char *v = getenv(name);
  return (v && *v) ? v : NULL;
}

double tc__env_double(const char *name, double dflt) {
  const char *v = tc__env_str(name);
  if (!v) return dflt;
  char *end = NULL;
  double d = strtod(v, &end);
  if (end == v || !isfinite(d)) return dflt;
  return d;
}

int tc__env_bool(const char *name, int dflt) {
  const char *v = tc__env_str(name);
  if (!v) return dflt;
  if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
      !strcasecmp(v, "on"))
    return 1;
  if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
      !strcasecmp(v, "off"))
    return 0;
  return dflt;
}

uint64_t tc__env_bytes(const char *name, uint64_t dflt, uint64_t least) {
  const char *v = tc__env_str(name);
  if (!v) return dflt;
  uint64_t b;
  if (tc__parse_bytes(v, &b) != 0) {
    tc__log(1, "%s='%s' is not a byte count (digits with an "
            "optional K, M, G or T suffix); using %" PRIu64, name, v, dflt);
    return dflt;
  }
  if (b < least) {
    tc__log(1, "%s=%s is below the least useful %" PRIu64
            " bytes; using %" PRIu64, name, v, least, least);
    b = least;
  }
  return b;
}

static int tc__log_level = -1;
static pthread_once_t tc__log_once = PTHREAD_ONCE_INIT;

static void tc__log_init(void) {
  const char *v = tc__env_str("TORCHCOMMS_LOG");
  tc__log_level = 1;
  if (!v) return;
  if (!strcasecmp(v, "error")) tc__log_level = 0;
  else if (!strcasecmp(v, "warn")) tc__log_level = 1;
  else if (!strcasecmp(v, "info")) tc__log_level = 2;
  else if (!strcasecmp(v, "debug")) tc__log_level = 3;
}

int tc__log_enabled(int level) {
  pthread_once(&tc__log_once, tc__log_init);
  return level <= tc__log_level;
}

void tc__log(int level, const char *fmt, ...) {
  pthread_once(&tc__log_once, tc__log_init);
  if (level > tc__log_level) return;
  static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "torchcomms %s [pid %d]: %s\n",
          names[level < 0 ? 0 : level > 3 ? 3 : level], (int)getpid(), line);
}
