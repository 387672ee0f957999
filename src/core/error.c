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

/* The level is TORCHCOMMS_LOG's index in "error|warn|info|debug". */
int tc__log_enabled(int level) { return level <= tc__setting_choice(TC_SET_LOG); }

void tc__log(int level, const char *fmt, ...) {
  if (!tc__log_enabled(level)) return;
  static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "torchcomms %s [pid %d]: %s\n",
          names[level < 0 ? 0 : level > 3 ? 3 : level], (int)getpid(), line);
}
