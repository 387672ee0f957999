/* comm_log.c -- the init summary of a communicator (comm_log.h), one block
 * of info lines of subsystem init, each starting "communicator '<name>': ":
 *
 *   communicator 'main': backend cpu 0.1.0, rank 1 of 4, device cpu, timeout 600 s
 *   communicator 'main': transport per peer: 0 shm, 2 shm, 3 shm
 *   communicator 'main': shm: 4194304-byte segments (...); spin 50 us, ...
 *   communicator 'main': thresholds: ...
 *   communicator 'main': settings: TORCHCOMMS_LOG=info TORCHCOMMS_CPU_CMA=0
 */
#include "comm_log.h"

#include <stdio.h>
#include <string.h>

/* 1 when the backend's table has describe (its size covers it) set. */
static int has_describe(const tc_backend_ops_t *ops) {
  return ops->size >= offsetof(tc_backend_ops_t, describe) + sizeof ops->describe &&
         ops->describe != NULL;
}

/* The settings whose value differs from the default, as NAME=value, a few
 * per line so that no line is cut. */
static void log_settings(const tc_comm_t *c) {
  char line[768];
  size_t at = 0;
  for (int i = 0; i < (int)TC_SET_COUNT; i++) {
    tc_setting_id_t id = (tc_setting_id_t)i;
    if (!tc__setting_differs(id)) continue;
    const char *v = tc__setting_str(id);
    char item[320];
    snprintf(item, sizeof item, " %s=%s", tc__setting_name(id), v ? v : "");
    if (at && at + strlen(item) >= sizeof line) {
      tc__logs(TC_LOG_INFO, TC_LOG_INIT, "communicator '%s': settings:%s", c->name, line);
      at = 0;
    }
    at += (size_t)snprintf(line + at, sizeof line - at, "%s", item);
    if (at >= sizeof line) at = sizeof line - 1;
  }
  if (at)
    tc__logs(TC_LOG_INFO, TC_LOG_INIT, "communicator '%s': settings:%s", c->name, line);
  else
    tc__logs(TC_LOG_INFO, TC_LOG_INIT, "communicator '%s': settings: all defaults",
             c->name);
}

void tc__comm_log_created(const tc_comm_t *c) {
  tc__log_set_rank(c->rank);
  if (!tc__log_on(TC_LOG_INFO, TC_LOG_INIT)) return;
  char dev[64];
  if (c->device_index >= 0 && !strchr(c->device, ':'))
    snprintf(dev, sizeof dev, "%s:%d", c->device, c->device_index);
  else
    snprintf(dev, sizeof dev, "%s", c->device);
  tc__logs(TC_LOG_INFO, TC_LOG_INIT,
           "communicator '%s': backend %s %s, rank %d of %d, device %s, timeout %g s",
           c->name, c->backend_name, c->ops->version ? c->ops->version : "(no version)",
           c->rank, c->size, dev, c->timeout_s);
  if (has_describe(c->ops)) {
    char text[4096] = "";
    c->ops->describe(c->bcomm, text, sizeof text);
    text[sizeof text - 1] = 0;
    for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
      nl = strchr(line, '\n');
      if (nl) *nl = 0;
      if (*line) tc__logs(TC_LOG_INFO, TC_LOG_INIT, "communicator '%s': %s", c->name, line);
    }
  }
  log_settings(c);
}
