/* settings.c -- every environment setting the library reads (the table is
 * TC_SETTINGS_MAP in settings.h), read into one cached snapshot, parsed
 * and checked there: a bad value is an error at tc_comm_create naming the
 * setting and what it accepts, never silently replaced by the default.
 *
 * The snapshot: one slot per setting holding the text as set (interned:
 * never freed, so a pointer handed out stays valid) and the parsed value,
 * each stored atomically; readers take no lock. tc__settings_reload takes
 * a new snapshot under a mutex; the first reader takes one if none was
 * taken yet (pthread_once). */
#include "internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum {
  ST_NUM, ST_NUMP, ST_INT, ST_BOOL, ST_CHOICE, ST_FLAGS, ST_TEXT, ST_ADDR, ST_BYTES
} st_kind_t;

typedef struct setting {
  const char *name;
  st_kind_t kind;
  double dflt;         /* CHOICE: index into choices; FLAGS: the mask */
  double min, max;     /* NUM, NUMP, INT: accepted range; BYTES: min is the least */
  const char *choices; /* CHOICE, FLAGS: "a|b|c" (case-insensitive) */
  const char *help;
} setting_t;

static const setting_t settings[] = {
#define TC__SET_ROW(id, name, kind, dflt, lo, hi, choices, help)                \
  {name, ST_##kind, (double)(dflt), (double)(lo), (double)(hi), choices, help},
    TC_SETTINGS_MAP(TC__SET_ROW)
#undef TC__SET_ROW
};
_Static_assert(sizeof settings / sizeof settings[0] == TC_SET_COUNT, "one row per id");

/* The snapshot. */
typedef struct slot {
  _Atomic(const char *) text; /* as set; NULL: unset or empty */
  _Atomic double value;       /* parsed; the default when unset or malformed */
  _Atomic int bad;            /* set but malformed */
} slot_t;

static slot_t snap[TC_SET_COUNT];
static pthread_once_t snap_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t snap_mu = PTHREAD_MUTEX_INITIALIZER;

/* Texts once set, kept for the life of the process (reachable, so leak
 * checkers stay quiet): a reader may still hold one after a reload. A
 * text is copied only when it differs from the one in the snapshot. */
typedef struct interned {
  struct interned *next;
  char text[];
} interned_t;
static interned_t *interned_head;

const char *tc__env_str(const char *name) {
  const char *v = getenv(name);
  return (v && *v) ? v : NULL;
}

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

uint64_t tc__bytes_value(const char *name, const char *v, uint64_t dflt, uint64_t least) {
  if (!v || !*v) return dflt;
  uint64_t b;
  if (tc__parse_bytes(v, &b) != 0) {
    tc__logs(TC_LOG_WARN, TC_LOG_INIT, "%s='%s' is not a byte count (digits with an "
             "optional K, M, G or T suffix); using %" PRIu64, name, v, dflt);
    return dflt;
  }
  if (b < least) {
    tc__logs(TC_LOG_WARN, TC_LOG_INIT, "%s=%s is below the least useful %" PRIu64
             " bytes; using %" PRIu64, name, v, least, least);
    b = least;
  }
  return b;
}

static int setting_bad(const setting_t *s, const char *v, char *err, size_t len) {
  const char *want = "";
  char buf[160];
  switch (s->kind) {
  case ST_NUM:
  case ST_NUMP:
    if (s->max >= TC__BIG)
      snprintf(buf, sizeof buf, "a number %s %g", s->kind == ST_NUMP ? ">" : ">=", s->min);
    else
      snprintf(buf, sizeof buf, "a number %s %g and <= %g", s->kind == ST_NUMP ? ">" : ">=",
               s->min, s->max);
    want = buf;
    break;
  case ST_INT: snprintf(buf, sizeof buf, "an integer from %g to %g", s->min, s->max); want = buf; break;
  case ST_BOOL: want = "1, 0, true, false, yes, no, on or off"; break;
  case ST_CHOICE: snprintf(buf, sizeof buf, "one of %s", s->choices); want = buf; break;
  case ST_FLAGS:
    snprintf(buf, sizeof buf, "'all', or a comma list of %s, or ^ and a list to exclude",
             s->choices);
    want = buf;
    break;
  case ST_ADDR: want = "a numeric IPv4 or IPv6 address"; break;
  case ST_TEXT: want = "text"; break;
  case ST_BYTES: want = "a byte count (digits with an optional K, M, G or T suffix)"; break;
  }
  snprintf(err, len, "%s='%s' is not valid: expected %s (%s)", s->name, v, want, s->help);
  return TC_ERR_INVALID_ARGUMENT;
}

/* The index of v[0..vl) in choices "a|b|c" (case-insensitive), or -1. */
static int choice_index(const char *choices, const char *v, size_t vl) {
  int idx = 0;
  for (const char *c = choices; *c; idx++) {
    const char *bar = strchr(c, '|');
    size_t cl = bar ? (size_t)(bar - c) : strlen(c);
    if (cl == vl && !strncasecmp(c, v, cl)) return idx;
    if (!bar) break;
    c = bar + 1;
  }
  return -1;
}

/* FLAGS: "all", "a,b" or "^a,b" (blanks around names allowed) as a mask of
 * the choices' bits; -1 when a name is unknown or the list is empty. */
static int flags_parse(const char *choices, const char *v, double *out) {
  int n = 1;
  for (const char *c = choices; *c; c++) n += *c == '|';
  uint32_t all = (1u << n) - 1, mask = 0;
  while (*v == ' ') v++;
  int exclude = *v == '^';
  if (exclude) v++;
  int names = 0;
  for (const char *p = v;;) {
    size_t len = strcspn(p, ",");
    const char *e = p + len;
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    if (len == 3 && !strncasecmp(p, "all", 3)) {
      mask = all;
    } else {
      int i = choice_index(choices, p, len);
      if (i < 0) return -1;
      mask |= 1u << i;
    }
    names++;
    if (!*e) break;
    p = e + 1;
  }
  if (!names) return -1;
  *out = exclude ? (double)(all & ~mask) : (double)mask;
  return 0;
}

/* Parses v as setting s: 0 and *out (CHOICE: the index; FLAGS: the mask;
 * BOOL: 0 or 1; BYTES: *bytes too), or -1. */
static int setting_parse(const setting_t *s, const char *v, double *out, uint64_t *bytes) {
  switch (s->kind) {
  case ST_NUM:
  case ST_NUMP:
  case ST_INT: {
    char *end = NULL;
    double d = strtod(v, &end);
    while (end && (*end == ' ' || *end == '\t' || *end == '\n')) end++;
    if (end == v || !end || *end || !isfinite(d) || d < s->min || d > s->max ||
        (s->kind == ST_NUMP && d == s->min) || (s->kind == ST_INT && d != floor(d)))
      return -1;
    *out = d;
    return 0;
  }
  case ST_BOOL: {
    static const char *const ok[] = {"0", "1", "false", "true", "no", "yes", "off", "on"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
      if (!strcasecmp(v, ok[i])) {
        *out = (double)(i % 2);
        return 0;
      }
    return -1;
  }
  case ST_CHOICE: {
    int idx = choice_index(s->choices, v, strlen(v));
    if (idx < 0) return -1;
    *out = idx;
    return 0;
  }
  case ST_FLAGS: return flags_parse(s->choices, v, out);
  case ST_ADDR: {
    unsigned char a[16];
    if (inet_pton(AF_INET, v, a) == 1 || inet_pton(AF_INET6, v, a) == 1) return 0;
    return -1;
  }
  case ST_BYTES:
    if (tc__parse_bytes(v, bytes) != 0) return -1;
    *out = (double)*bytes;
    return 0;
  case ST_TEXT: return 0;
  }
  return 0;
}

/* A copy of v for the snapshot: the current text when equal. */
static const char *intern(const char *cur, const char *v) {
  if (!v) return NULL;
  if (cur && !strcmp(cur, v)) return cur;
  size_t n = strlen(v) + 1;
  interned_t *t = malloc(sizeof *t + n);
  if (!t) return cur; /* out of memory: keep the old text */
  memcpy(t->text, v, n);
  t->next = interned_head;
  interned_head = t;
  return t->text;
}

/* Takes the snapshot; snap_mu held. quiet: no log lines (the first
 * snapshot is taken inside the logger's first call). */
static int snapshot(char *err, size_t len, int quiet) {
  int rc = TC_OK;
  for (size_t i = 0; i < TC_SET_COUNT; i++) {
    const setting_t *s = &settings[i];
    const char *v = getenv(s->name);
    if (v && !*v) v = NULL;
    double d = s->dflt;
    uint64_t b = (uint64_t)s->dflt;
    int bad = v && setting_parse(s, v, &d, &b) != 0;
    if (bad) {
      d = s->dflt;
      b = (uint64_t)s->dflt;
      if (err && rc == TC_OK) {
        rc = setting_bad(s, v, err, len);
      } else if (!err && !quiet) {
        char why[512];
        setting_bad(s, v, why, sizeof why);
        tc__logs(TC_LOG_WARN, TC_LOG_INIT, "%s; using the default", why);
      }
    }
    if (s->kind == ST_BYTES && b < (uint64_t)s->min) {
      if (!quiet)
        tc__logs(TC_LOG_WARN, TC_LOG_INIT, "%s=%s is below the least useful %.0f bytes; "
                 "using %.0f", s->name, v,
                 s->min, s->min);
      b = (uint64_t)s->min;
    }
    if (s->kind == ST_BYTES) d = (double)b;
    atomic_store(&snap[i].text, intern(atomic_load(&snap[i].text), v));
    atomic_store(&snap[i].value, d);
    atomic_store(&snap[i].bad, bad);
  }
  /* the logger's gate follows the snapshot (read from it directly: the
   * accessors would re-enter the first snapshot's pthread_once) */
  tc__log_configure((int)atomic_load(&snap[TC_SET_LOG].value),
                    (uint32_t)atomic_load(&snap[TC_SET_LOG_SUBSYS].value));
  return rc;
}

static void snapshot_first(void) {
  pthread_mutex_lock(&snap_mu);
  snapshot(NULL, 0, 1);
  pthread_mutex_unlock(&snap_mu);
}

int tc__settings_reload(char *err, size_t len) {
  pthread_once(&snap_once, snapshot_first);
  pthread_mutex_lock(&snap_mu);
  int rc = snapshot(err, len, 0);
  pthread_mutex_unlock(&snap_mu);
  return rc;
}

static const slot_t *slot_of(tc_setting_id_t id) {
  pthread_once(&snap_once, snapshot_first);
  return &snap[id];
}

double tc__setting_double(tc_setting_id_t id) { return atomic_load(&slot_of(id)->value); }
int tc__setting_bool(tc_setting_id_t id) { return atomic_load(&slot_of(id)->value) != 0; }
int tc__setting_choice(tc_setting_id_t id) { return (int)atomic_load(&slot_of(id)->value); }
uint32_t tc__setting_flags(tc_setting_id_t id) {
  return (uint32_t)atomic_load(&slot_of(id)->value);
}
uint64_t tc__setting_bytes(tc_setting_id_t id) {
  return (uint64_t)atomic_load(&slot_of(id)->value);
}
const char *tc__setting_str(tc_setting_id_t id) { return atomic_load(&slot_of(id)->text); }
int tc__setting_is_set(tc_setting_id_t id) { return atomic_load(&slot_of(id)->text) != NULL; }
int tc__setting_malformed(tc_setting_id_t id) { return atomic_load(&slot_of(id)->bad); }
const char *tc__setting_name(tc_setting_id_t id) { return settings[id].name; }

int tc__setting_bool_named(const char *name) {
  for (size_t i = 0; i < TC_SET_COUNT; i++)
    if (settings[i].kind == ST_BOOL && !strcmp(settings[i].name, name))
      return tc__setting_bool((tc_setting_id_t)i);
  return -1;
}

int tc__setting_differs(tc_setting_id_t id) {
  const slot_t *sl = slot_of(id);
  if (!atomic_load(&sl->text)) return 0;
  const setting_t *s = &settings[id];
  if (s->kind == ST_TEXT || s->kind == ST_ADDR || atomic_load(&sl->bad)) return 1;
  double d = s->dflt;
  if (s->kind == ST_BYTES && d < s->min) d = s->min;
  return atomic_load(&sl->value) != d;
}

size_t tc__settings_count(void) { return TC_SET_COUNT; }

const char *tc__settings_name(size_t i, const char **help) {
  if (i >= tc__settings_count()) return NULL;
  if (help) *help = settings[i].help;
  return settings[i].name;
}

void tc__settings_default_text(size_t i, char *buf, size_t len) {
  const setting_t *s = &settings[i];
  double d = s->dflt;
  buf[0] = 0;
  switch (s->kind) {
  case ST_TEXT:
  case ST_ADDR: return;
  case ST_BOOL: snprintf(buf, len, "%d", d != 0); return;
  case ST_CHOICE: {
    const char *c = s->choices;
    for (int k = 0; k < (int)d && c; k++) {
      c = strchr(c, '|');
      if (c) c++;
    }
    snprintf(buf, len, "%.*s", c ? (int)strcspn(c, "|") : 0, c ? c : "");
    return;
  }
  case ST_FLAGS: { /* "all", or the names of the default's bits */
    double all;
    if (flags_parse(s->choices, "all", &all) == 0 && d == all) {
      snprintf(buf, len, "all");
      return;
    }
    size_t at = 0;
    int i = 0;
    for (const char *c = s->choices; *c && at < len; i++) {
      size_t cl = strcspn(c, "|");
      if (((uint32_t)d >> i) & 1)
        at += (size_t)snprintf(buf + at, len - at, "%s%.*s", at ? "," : "", (int)cl, c);
      c += cl + (c[cl] == '|');
    }
    return;
  }
  default: break;
  }
  static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
  if (s->kind == ST_BYTES || strstr(s->name, "_BYTES"))
    for (int k = 0; k < 4; k++) {
      double u = ldexp(1.0, 40 - 10 * k);
      if (d >= u && fmod(d, u) == 0) {
        snprintf(buf, len, "%.0f %s", d / u, units[k]);
        return;
      }
    }
  snprintf(buf, len, "%g", d);
}

void tc__settings_print(FILE *f) {
  fprintf(f, "torchcomms settings (environment), read and checked when a communicator is "
             "created:\n");
  for (size_t i = 0; i < tc__settings_count(); i++) {
    const setting_t *st = &settings[i];
    const char *v = getenv(st->name);
    char dflt[64] = "";
    if (!strstr(st->help, "(default")) tc__settings_default_text(i, dflt, sizeof dflt);
    fprintf(f, "  %-34s %s%s%s%s%s%s%s\n", st->name, st->help, *dflt ? " (default " : "",
            dflt, *dflt ? ")" : "", v && *v ? " [set: " : "", v && *v ? v : "",
            v && *v ? "]" : "");
  }
  fprintf(f, "  %-34s %s\n", "TORCHCOMMS_BACKEND_LIB_PATH_<NAME>",
          "file or directory of libtorchcomms-<name>.so");
}
