/* log.c -- log lines on stderr, gated by TORCHCOMMS_LOG (settings.h). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

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
