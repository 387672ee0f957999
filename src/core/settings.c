/* settings.c -- every environment setting the library reads, declared once
 * with its type, accepted values and one line of help, and checked when a
 * communicator is created: a bad value is an error naming the setting and
 * what it accepts, never silently replaced by the default.
 *
 * Readers elsewhere still use tc__env_str / tc__env_double / tc__env_bool
 * (error.c); a setting they read must be in this table (tests/c/
 * test_settings.c checks the README's settings list against it). */
#include "internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { ST_NUM, ST_INT, ST_BOOL, ST_CHOICE, ST_TEXT, ST_ADDR, ST_BYTES } st_kind_t;

typedef struct tc__setting {
  const char *name;
  st_kind_t kind;
  double min, max;     /* ST_NUM, ST_INT: accepted range (inclusive) */
  int min_exclusive;   /* ST_NUM: the minimum itself is refused */
  const char *choices; /* ST_CHOICE: "a|b|c" (case-insensitive) */
  const char *help;
} tc__setting_t;

#define NUM(n, lo, hi, excl, h) {n, ST_NUM, lo, hi, excl, NULL, h}
#define INT(n, lo, hi, h) {n, ST_INT, lo, hi, 0, NULL, h}
#define BOOL(n, h) {n, ST_BOOL, 0, 0, 0, NULL, h}
#define CHOICE(n, c, h) {n, ST_CHOICE, 0, 0, 0, c, h}
#define TEXT(n, h) {n, ST_TEXT, 0, 0, 0, NULL, h}
#define ADDR(n, h) {n, ST_ADDR, 0, 0, 0, NULL, h}
#define BYTES(n, h) {n, ST_BYTES, 0, 0, 0, NULL, h}
#define BIG 1e18

static const tc__setting_t tc__settings[] = {
    NUM("TORCHCOMM_TIMEOUT_SECONDS", 0, BIG, 1,
        "default deadline of every operation and of creation, seconds (600)"),
    BOOL("TORCHCOMM_ABORT_ON_ERROR", "end the process with the error on any failure (0)"),
    CHOICE("TORCHCOMMS_LOG", "error|warn|info|debug", "log level on stderr (warn)"),
    TEXT("TORCHCOMMS_JOB_ID", "scopes store keys per job (default TORCHELASTIC_RUN_ID)"),
    INT("TORCHELASTIC_RESTART_COUNT", 0, 1e9, "torchrun's restart number: scopes store keys"),
    BOOL("TORCHCOMMS_CHECK_MISMATCH",
         "compare every collective's op, dtype, count, root and reduction across ranks (1)"),
    ADDR("TORCHCOMMS_SOCKET_ADDR", "the address this rank's peers connect to"),
    CHOICE("TORCHCOMMS_CPU_TRANSPORT", "auto|shm|tcp", "cpu backend transport (auto)"),
    NUM("TORCHCOMMS_SHM_BYTES", 0, 1ull << 40, 1, "shared-memory segment bytes per rank (4 MiB)"),
    BOOL("TORCHCOMMS_CPU_CMA", "single copy with process_vm_readv (1)"),
    NUM("TORCHCOMMS_CPU_CMA_BYTES", 0, BIG, 0, "single copy from this many bytes (16 KiB)"),
    NUM("TORCHCOMMS_CPU_INLINE_BYTES", 0, BIG, 0,
        "run operations up to this size on the caller's thread (1 MiB)"),
    NUM("TORCHCOMMS_CPU_SHM_SMALL_BYTES", 0, BIG, 0,
        "shm all_reduce through the small slots up to this size (16 KiB)"),
    NUM("TORCHCOMMS_CPU_SPIN_US", 0, 1e9, 0, "busy-wait before sleeping, microseconds"),
    NUM("TORCHCOMMS_CPU_TCP_SPIN_US", 0, 1e9, 0, "TCP busy-poll before sleeping, microseconds"),
    NUM("TORCHCOMMS_CPU_YIELD_US", 0, 1e9, 0,
        "oversubscribed: sched_yield polling before sleeping, microseconds (200)"),
    TEXT("TORCHCOMMS_CPU_IFNAME", "network interface whose address TCP binds and publishes"),
    BOOL("TORCHCOMMS_SHM_SWEEP", "remove /dev/shm segments of dead creators at setup (1)"),
    BYTES("TORCHCOMMS_STORE_MAX_BYTES", "store server memory budget (1G)"),
    BYTES("TORCHCOMMS_STORE_MAX_VALUE_BYTES", "largest value the store server accepts (256M)"),
    BYTES("TORCHCOMMS_STORE_MAX_UNSENT_BYTES",
          "unsent answers per store client before the server stops reading it (16M)"),
};

int tc__parse_bytes(const char *v, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  int shift = 0, digits = end != v;
  if (end && (*end == 'k' || *end == 'K')) shift = 10;
  else if (end && (*end == 'm' || *end == 'M')) shift = 20;
  else if (end && (*end == 'g' || *end == 'G')) shift = 30;
  else if (end && (*end == 't' || *end == 'T')) shift = 40;
  if (shift) {
    end++;
    if (*end == 'i') end++;
  }
  if (digits && (*end == 'B' || *end == 'b')) end++;
  if (errno || !digits || *end || *v == '-' || (shift && n > (UINT64_MAX >> shift))) return -1;
  *out = (uint64_t)n << shift;
  return 0;
}

static int tc__setting_bad(const tc__setting_t *s, const char *v, char *err, size_t len) {
  const char *want = "";
  char buf[160];
  switch (s->kind) {
  case ST_NUM:
    if (s->max >= BIG)
      snprintf(buf, sizeof buf, "a number %s %g", s->min_exclusive ? ">" : ">=", s->min);
    else
      snprintf(buf, sizeof buf, "a number %s %g and <= %g", s->min_exclusive ? ">" : ">=",
               s->min, s->max);
    want = buf;
    break;
  case ST_INT: snprintf(buf, sizeof buf, "an integer from %g to %g", s->min, s->max); want = buf; break;
  case ST_BOOL: want = "1, 0, true, false, yes, no, on or off"; break;
  case ST_CHOICE: snprintf(buf, sizeof buf, "one of %s", s->choices); want = buf; break;
  case ST_ADDR: want = "a numeric IPv4 or IPv6 address"; break;
  case ST_TEXT: want = "text"; break;
  case ST_BYTES: want = "a byte count (digits with an optional K, M, G or T suffix)"; break;
  }
  snprintf(err, len, "%s='%s' is not valid: expected %s (%s)", s->name, v, want, s->help);
  return TC_ERR_INVALID_ARGUMENT;
}

static int tc__setting_check(const tc__setting_t *s, const char *v, char *err, size_t len) {
  switch (s->kind) {
  case ST_NUM:
  case ST_INT: {
    char *end = NULL;
    double d = strtod(v, &end);
    while (end && (*end == ' ' || *end == '\t' || *end == '\n')) end++;
    if (end == v || !end || *end || !isfinite(d) || d < s->min || d > s->max ||
        (s->min_exclusive && d == s->min) || (s->kind == ST_INT && d != floor(d)))
      return tc__setting_bad(s, v, err, len);
    return TC_OK;
  }
  case ST_BOOL: {
    static const char *const ok[] = {"1", "0", "true", "false", "yes", "no", "on", "off"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
      if (!strcasecmp(v, ok[i])) return TC_OK;
    return tc__setting_bad(s, v, err, len);
  }
  case ST_CHOICE: {
    size_t vl = strlen(v);
    for (const char *c = s->choices; *c;) {
      const char *bar = strchr(c, '|');
      size_t cl = bar ? (size_t)(bar - c) : strlen(c);
      if (cl == vl && !strncasecmp(c, v, cl)) return TC_OK;
      if (!bar) break;
      c = bar + 1;
    }
    return tc__setting_bad(s, v, err, len);
  }
  case ST_ADDR: {
    unsigned char a[16];
    if (inet_pton(AF_INET, v, a) == 1 || inet_pton(AF_INET6, v, a) == 1) return TC_OK;
    return tc__setting_bad(s, v, err, len);
  }
  case ST_BYTES: {
    uint64_t b;
    return tc__parse_bytes(v, &b) == 0 ? TC_OK : tc__setting_bad(s, v, err, len);
  }
  case ST_TEXT: return TC_OK;
  }
  return TC_OK;
}

int tc__settings_check(char *err, size_t len) {
  for (size_t i = 0; i < sizeof tc__settings / sizeof tc__settings[0]; i++) {
    const char *v = getenv(tc__settings[i].name);
    if (!v || !*v) continue;
    int rc = tc__setting_check(&tc__settings[i], v, err, len);
    if (rc != TC_OK) return rc;
  }
  return TC_OK;
}

size_t tc__settings_count(void) { return sizeof tc__settings / sizeof tc__settings[0]; }

const char *tc__settings_name(size_t i, const char **help) {
  if (i >= tc__settings_count()) return NULL;
  if (help) *help = tc__settings[i].help;
  return tc__settings[i].name;
}

void tc__settings_print(FILE *f) {
  fprintf(f, "torchcomms settings (environment), checked when a communicator is created:\n");
  for (size_t i = 0; i < tc__settings_count(); i++) {
    const tc__setting_t *st = &tc__settings[i];
    const char *v = getenv(st->name);
    fprintf(f, "  %-34s %s%s%s%s\n", st->name, st->help, v && *v ? " [set: " : "",
            v && *v ? v : "", v && *v ? "]" : "");
  }
  fprintf(f, "  %-34s %s\n", "TORCHCOMMS_BACKEND_LIB_PATH_<NAME>",
          "file or directory of libtorchcomms-<name>.so");
}

