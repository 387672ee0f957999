/* log.c -- the logger: lines gated by level (TORCHCOMMS_LOG) and subsystem
 * (TORCHCOMMS_LOG_SUBSYS), tagged with the level, the rank, the pid and the
 * subsystem, written with one write() each to stderr or to the file
 * TORCHCOMMS_LOG_FILE names (%r rank, %p pid, %h host name), opened once,
 * O_APPEND. docs/logging.md describes what a user sees.
 *
 * The gate is one 64-bit word, byte `level` holding the subsystem bits
 * written at that level (error and warn: every bit), so that tc__log_on
 * (internal.h) is one load and a compare. settings.c sets it at every
 * snapshot (tc__log_configure); before the first snapshot it reads
 * TC__LOG_GATE_UNSET and the first check takes the snapshot.
 *
 * A file whose name has %r while no rank is known yet (no launcher
 * variables, no communicator created): lines are held in memory (up to
 * PENDING_BYTES) and written first once the rank is known; when they do
 * not fit, or the process ends first, the file is opened with rank "-". */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

_Atomic uint64_t tc__log_gate = TC__LOG_GATE_UNSET;

#define LINE_BYTES 2048
#define PENDING_BYTES (32 * 1024)

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
/* The subsystems' names, bit i <-> name i, as TORCHCOMMS_LOG_SUBSYS spells them. */
static const char *const subsys_names[] = {"init", "coll", "p2p", "shm", "tcp", "store", "misc"};
_Static_assert(TC_LOG_ALL == (1 << (sizeof subsys_names / sizeof subsys_names[0])) - 1,
               "one name per subsystem bit");
_Static_assert(TC_LOG_INIT == 1 && TC_LOG_STORE == 32 && TC_LOG_MISC == 64,
               "the bits follow TORCHCOMMS_LOG_SUBSYS's choices");

static _Atomic int log_rank = -1; /* set by the first communicator */

/* Where lines go; out_mu guards these. */
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static int out_fd = -1;   /* the file once opened (or 2 when it could not be) */
static int out_owned;     /* out_fd is ours to close */
static char pending[PENDING_BYTES];
static size_t pending_len;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

void tc__log_configure(int level, uint32_t subsys) {
  uint64_t g = 0;
  for (int l = 0; l <= level && l <= TC_LOG_TRACE; l++)
    g |= (uint64_t)(l <= TC_LOG_WARN ? 0xffu : (subsys & 0xffu)) << (8 * l);
  atomic_store(&tc__log_gate, g);
}

uint64_t tc__log_gate_init(void) {
  (void)tc__setting_choice(TC_SET_LOG); /* takes the first snapshot: configures */
  return atomic_load(&tc__log_gate);
}

int tc__log_check(int level, int subsys) { return tc__log_on(level, subsys); }
int tc__log_enabled(int level) { return tc__log_on(level, TC_LOG_ALL); }

int tc__log_rank(void) {
  int r = atomic_load(&log_rank);
  if (r >= 0) return r;
  int size;
  const char *src = "none";
  if (tc__env_rank_size(&r, &size, &src, NULL, 0) == TC_OK && strcmp(src, "none") != 0)
    return r;
  return -1;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

/* The file name: %r rank ("-" when unknown), %p pid, %h host name, %% a %. */
static void expand_path(const char *fmt, int rank, char *out, size_t len) {
  size_t at = 0;
  for (const char *f = fmt; *f && at + 1 < len; f++) {
    char piece[256];
    piece[0] = 0;
    if (*f == '%' && f[1] == 'r') {
      if (rank >= 0) snprintf(piece, sizeof piece, "%d", rank);
      else snprintf(piece, sizeof piece, "-");
    } else if (*f == '%' && f[1] == 'p') {
      snprintf(piece, sizeof piece, "%d", (int)getpid());
    } else if (*f == '%' && f[1] == 'h') {
      if (gethostname(piece, sizeof piece - 1) != 0) snprintf(piece, sizeof piece, "unknown");
      piece[sizeof piece - 1] = 0;
    } else if (*f == '%' && f[1] == '%') {
      snprintf(piece, sizeof piece, "%%");
    } else {
      out[at++] = *f;
      continue;
    }
    f++;
    at += (size_t)snprintf(out + at, len - at, "%s", piece);
    if (at >= len) at = len - 1;
  }
  out[at] = 0;
}

/* Opens the file for `rank` and writes the held lines first; out_mu held.
 * A file that cannot be opened: stderr, with one line saying why. */
static void open_file(const char *fmt, int rank) {
  char path[PATH_MAX];
  expand_path(fmt, rank, path, sizeof path);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    out_fd = fd;
    out_owned = 1;
  } else {
    char line[PATH_MAX + 256];
    int n = snprintf(line, sizeof line,
                     "torchcomms WARN [pid %d] misc: TORCHCOMMS_LOG_FILE: cannot open '%s' "
                     "(%s); logging to stderr\n", (int)getpid(), path, strerror(errno));
    write_all(2, line, n > 0 && (size_t)n < sizeof line ? (size_t)n : strlen(line));
    out_fd = 2;
    out_owned = 0;
  }
  write_all(out_fd, pending, pending_len);
  pending_len = 0;
}

/* fork: the child starts over (its own file, rank and held lines); the
 * lock is held across fork so that the child never inherits it taken. */
static void fork_prepare(void) { pthread_mutex_lock(&out_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&out_mu); }
static void fork_child(void) {
  if (out_owned) close(out_fd);
  out_fd = -1;
  out_owned = 0;
  pending_len = 0;
  atomic_store(&log_rank, -1);
  pthread_mutex_unlock(&out_mu);
}
static void fork_register(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

void tc__log_set_rank(int rank) {
  int unset = -1;
  if (rank < 0) return;
  pthread_once(&fork_once, fork_register);
  pthread_mutex_lock(&out_mu);
  if (atomic_compare_exchange_strong(&log_rank, &unset, rank)) {
    const char *fmt = tc__setting_str(TC_SET_LOG_FILE);
    if (pending_len && out_fd < 0 && fmt) open_file(fmt, rank); /* the held lines */
  }
  pthread_mutex_unlock(&out_mu);
}

/* The end of the process: lines still held go to the file with rank "-". */
__attribute__((destructor)) static void flush_at_exit(void) {
  if (!pending_len || pthread_mutex_trylock(&out_mu) != 0) return; /* the usual case */
  const char *fmt = tc__setting_str(TC_SET_LOG_FILE);
  if (pending_len && out_fd < 0 && fmt) open_file(fmt, tc__log_rank());
  pthread_mutex_unlock(&out_mu);
}

static void emit(const char *line, size_t n, int rank) {
  const char *fmt = tc__setting_str(TC_SET_LOG_FILE);
  if (!fmt) {
    write_all(2, line, n);
    return;
  }
  pthread_once(&fork_once, fork_register);
  pthread_mutex_lock(&out_mu);
  if (out_fd < 0) {
    if (rank < 0 && strstr(fmt, "%r") && pending_len + n <= sizeof pending) {
      memcpy(pending + pending_len, line, n); /* until the rank is known */
      pending_len += n;
      pthread_mutex_unlock(&out_mu);
      return;
    }
    open_file(fmt, rank);
  }
  int fd = out_fd;
  pthread_mutex_unlock(&out_mu);
  write_all(fd, line, n); /* one write: O_APPEND keeps lines whole */
}

void tc__logv(int level, int subsys, const char *fmt, va_list ap) {
  if (!tc__log_on(level, subsys)) return;
  if (level < 0) level = 0;
  if (level > TC_LOG_TRACE) level = TC_LOG_TRACE;
  int bits = subsys & TC_LOG_ALL, b = 0;
  if (bits == 0 || bits == TC_LOG_ALL) bits = TC_LOG_MISC;
  while (!(bits & (1 << b))) b++; /* the lowest bit names the line */
  int rank = tc__log_rank();
  char rtext[16] = "-";
  if (rank >= 0) snprintf(rtext, sizeof rtext, "%d", rank);
  char line[LINE_BYTES];
  int h = snprintf(line, sizeof line, "torchcomms %s [rank %s pid %d] %s: ",
                   level_names[level], rtext, (int)getpid(), subsys_names[b]);
  size_t at = h > 0 && (size_t)h < sizeof line ? (size_t)h : 0;
  int m = vsnprintf(line + at, sizeof line - at - 1, fmt, ap);
  size_t end = m < 0 ? at : at + (size_t)m;
  if (end > sizeof line - 2) { /* truncated: say so */
    end = sizeof line - 2;
    memcpy(line + end - 3, "...", 3);
  }
  for (size_t i = at; i < end; i++) /* one line per call */
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  line[end++] = '\n';
  emit(line, end, rank);
}

void tc__logs(int level, int subsys, const char *fmt, ...) {
  if (!tc__log_on(level, subsys)) return;
  va_list ap;
  va_start(ap, fmt);
  tc__logv(level, subsys, fmt, ap);
  va_end(ap);
}

void tc__log(int level, const char *fmt, ...) {
  if (!tc__log_on(level, TC_LOG_MISC)) return;
  va_list ap;
  va_start(ap, fmt);
  tc__logv(level, TC_LOG_MISC, fmt, ap);
  va_end(ap);
}
