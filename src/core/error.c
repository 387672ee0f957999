/* error.c -- status codes (names and messages) and the per-thread error
 * text (tc_last_error, tc__set_error). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TC_ERRBUF 1024
static _Thread_local char errbuf[TC_ERRBUF];

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

const char *tc_last_error(void) { return errbuf; }

int tc__set_error_v(int rc, const char *fmt, va_list ap) {
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
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
  snprintf(errbuf, sizeof errbuf, "%s", text ? text : "");
  return rc;
}
