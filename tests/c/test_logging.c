/* test_logging.c -- the logger (docs/logging.md): levels up to trace,
 * subsystem filters (TORCHCOMMS_LOG_SUBSYS, ^ to exclude), the line format
 * and its rank tag, per-operation trace lines (tc__log_op), the file per
 * rank (TORCHCOMMS_LOG_FILE with %r %p %h) holding each rank's init summary
 * in a real 2-rank job over shared memory and over TCP, whole lines from
 * concurrent threads, the host table's logs and its fallback, and silence
 * when TORCHCOMMS_LOG is unset. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "runner.h"

static char cap_path[64];
static int cap_saved = -1;
static char cap_text[1 << 16];

/* Sends stderr to a temporary file until cap_end, which returns its text. */
static void cap_begin(void) {
  snprintf(cap_path, sizeof cap_path, "/tmp/tc_logcap.XXXXXX");
  int fd = mkstemp(cap_path);
  TC_ASSERT(fd >= 0);
  fflush(stderr);
  cap_saved = dup(2);
  TC_ASSERT(cap_saved >= 0 && dup2(fd, 2) == 2);
  close(fd);
}

static const char *read_file(const char *path, char *buf, size_t len) {
  buf[0] = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  size_t at = 0;
  ssize_t n;
  while (at + 1 < len && (n = read(fd, buf + at, len - 1 - at)) > 0) at += (size_t)n;
  buf[at] = 0;
  close(fd);
  return buf;
}

static const char *cap_end(void) {
  fflush(stderr);
  dup2(cap_saved, 2);
  close(cap_saved);
  read_file(cap_path, cap_text, sizeof cap_text);
  unlink(cap_path);
  return cap_text;
}

/* No launcher rank: lines are tagged "rank -" until a communicator exists. */
static void unset_launcher_rank(void) {
  static const char *const vars[] = {"TORCHCOMM_RANK", "TORCHCOMM_SIZE", "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                                     "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* Sets TORCHCOMMS_LOG and TORCHCOMMS_LOG_SUBSYS (NULL: unset) and takes a
 * snapshot, as tc_comm_create does. */
static void log_env(const char *level, const char *subsys) {
  if (level) setenv("TORCHCOMMS_LOG", level, 1);
  else unsetenv("TORCHCOMMS_LOG");
  if (subsys) setenv("TORCHCOMMS_LOG_SUBSYS", subsys, 1);
  else unsetenv("TORCHCOMMS_LOG_SUBSYS");
  char err[512] = "";
  if (tc__settings_reload(err, sizeof err) != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s", err);
}

TC_TEST(log_levels_up_to_trace) {
  unset_launcher_rank();
  unsetenv("TORCHCOMMS_LOG_FILE");
  char want[128];
  log_env("trace", NULL);
  TC_ASSERT(tc__log_on(TC_LOG_TRACE, TC_LOG_COLL));
  cap_begin();
  tc__logs(TC_LOG_TRACE, TC_LOG_COLL, "a trace line %d", 7);
  tc__logs(TC_LOG_DEBUG, TC_LOG_INIT, "a debug line");
  const char *out = cap_end();
  snprintf(want, sizeof want, "torchcomms TRACE [rank - pid %d] coll: a trace line 7\n",
           (int)getpid());
  TC_ASSERT_CONTAINS(out, want);
  snprintf(want, sizeof want, "torchcomms DEBUG [rank - pid %d] init: a debug line\n",
           (int)getpid());
  TC_ASSERT_CONTAINS(out, want);

  log_env("debug", NULL); /* trace hidden, debug shown */
  TC_ASSERT(!tc__log_on(TC_LOG_TRACE, TC_LOG_ALL));
  TC_ASSERT(tc__log_on(TC_LOG_DEBUG, TC_LOG_SHM));
  cap_begin();
  tc__logs(TC_LOG_TRACE, TC_LOG_COLL, "hidden trace");
  tc__logs(TC_LOG_DEBUG, TC_LOG_SHM, "shown debug");
  out = cap_end();
  TC_ASSERT(!strstr(out, "hidden trace"));
  TC_ASSERT_CONTAINS(out, "DEBUG [rank - pid");
  TC_ASSERT_CONTAINS(out, "] shm: shown debug\n");

  log_env(NULL, NULL); /* default warn: info hidden, warnings and errors shown */
  TC_ASSERT(!tc__log_on(TC_LOG_INFO, TC_LOG_ALL));
  cap_begin();
  tc__logs(TC_LOG_INFO, TC_LOG_INIT, "hidden info");
  tc__logs(TC_LOG_WARN, TC_LOG_TCP, "shown warning");
  tc__log(TC_LOG_ERROR, "shown error");
  out = cap_end();
  TC_ASSERT(!strstr(out, "hidden info"));
  TC_ASSERT_CONTAINS(out, "WARN [rank - pid");
  TC_ASSERT_CONTAINS(out, "] tcp: shown warning\n");
  TC_ASSERT_CONTAINS(out, "] misc: shown error\n"); /* tc__log: no subsystem */

  /* the launcher's rank tags lines until a communicator sets its own */
  setenv("TORCHCOMM_RANK", "3", 1);
  setenv("TORCHCOMM_SIZE", "4", 1);
  TC_ASSERT_EQ(tc__log_rank(), 3);
  cap_begin();
  tc__logs(TC_LOG_ERROR, TC_LOG_STORE, "tagged");
  out = cap_end();
  snprintf(want, sizeof want, "torchcomms ERROR [rank 3 pid %d] store: tagged\n",
           (int)getpid());
  TC_ASSERT_CONTAINS(out, want);
  tc__log_set_rank(5);
  tc__log_set_rank(6); /* the first one stays */
  TC_ASSERT_EQ(tc__log_rank(), 5);
}

TC_TEST(log_subsystem_filter) {
  unset_launcher_rank();
  unsetenv("TORCHCOMMS_LOG_FILE");
  log_env("trace", "^shm");
  TC_ASSERT(!tc__log_on(TC_LOG_INFO, TC_LOG_SHM));
  TC_ASSERT(tc__log_on(TC_LOG_TRACE, TC_LOG_COLL));
  TC_ASSERT(tc__log_on(TC_LOG_WARN, TC_LOG_SHM)); /* warnings are never filtered */
  cap_begin();
  tc__logs(TC_LOG_TRACE, TC_LOG_SHM, "shm trace");
  tc__logs(TC_LOG_INFO, TC_LOG_SHM, "shm info");
  tc__logs(TC_LOG_TRACE, TC_LOG_COLL, "coll trace");
  tc__logs(TC_LOG_TRACE, TC_LOG_TCP, "tcp trace");
  tc__logs(TC_LOG_WARN, TC_LOG_SHM, "shm warning");
  const char *out = cap_end();
  TC_ASSERT(!strstr(out, "shm trace"));
  TC_ASSERT(!strstr(out, "shm info"));
  TC_ASSERT_CONTAINS(out, "] coll: coll trace\n");
  TC_ASSERT_CONTAINS(out, "] tcp: tcp trace\n");
  TC_ASSERT_CONTAINS(out, "] shm: shm warning\n");

  log_env("trace", " Coll , P2P "); /* a list: only those (case and blanks ignored) */
  TC_ASSERT_EQ(tc__setting_flags(TC_SET_LOG_SUBSYS), TC_LOG_COLL | TC_LOG_P2P);
  cap_begin();
  tc__logs(TC_LOG_INFO, TC_LOG_INIT, "init info");
  tc__logs(TC_LOG_TRACE, TC_LOG_P2P, "p2p trace");
  tc__log(TC_LOG_INFO, "misc info");
  out = cap_end();
  TC_ASSERT(!strstr(out, "init info"));
  TC_ASSERT(!strstr(out, "misc info"));
  TC_ASSERT_CONTAINS(out, "] p2p: p2p trace\n");

  log_env("info", "all");
  TC_ASSERT_EQ(tc__setting_flags(TC_SET_LOG_SUBSYS), TC_LOG_ALL);
  log_env("info", "^all");
  TC_ASSERT_EQ(tc__setting_flags(TC_SET_LOG_SUBSYS), 0);
  TC_ASSERT(!tc__log_on(TC_LOG_INFO, TC_LOG_ALL));
  TC_ASSERT(tc__log_on(TC_LOG_ERROR, TC_LOG_INIT));
  log_env("info", "^init,store,misc");
  TC_ASSERT_EQ(tc__setting_flags(TC_SET_LOG_SUBSYS),
               TC_LOG_COLL | TC_LOG_P2P | TC_LOG_SHM | TC_LOG_TCP);
  char dflt[64];
  tc__settings_default_text(TC_SET_LOG_SUBSYS, dflt, sizeof dflt);
  TC_ASSERT_STR_EQ(dflt, "all");

  /* bad values are refused at creation, naming the setting */
  const char *bad[] = {"bogus", "coll,", "^", "coll,nope", ""};
  for (size_t i = 0; i + 1 < sizeof bad / sizeof bad[0]; i++) {
    setenv("TORCHCOMMS_LOG_SUBSYS", bad[i], 1);
    char err[512] = "";
    TC_ASSERT_EQ(tc__settings_reload(err, sizeof err), TC_ERR_INVALID_ARGUMENT);
    TC_ASSERT_CONTAINS(err, "TORCHCOMMS_LOG_SUBSYS=");
    TC_ASSERT_CONTAINS(err, "init|coll|p2p|shm|tcp|store|misc");
  }
  setenv("TORCHCOMMS_LOG", "verbose", 1);
  char err[512] = "";
  TC_ASSERT_EQ(tc__settings_reload(err, sizeof err), TC_ERR_INVALID_ARGUMENT);
  TC_ASSERT_CONTAINS(err, "error|warn|info|debug|trace");
}

/* An operation as the op path describes it to hooks and to tc__log_op. */
static tc_op_info_t op_info(tc_op_type_t type) {
  tc_op_info_t in;
  memset(&in, 0, sizeof in);
  in.size = sizeof in;
  in.comm_name = "main";
  in.rank = 1;
  in.comm_size = 4;
  in.type = type;
  in.name = tc_op_name(type);
  in.op_id = 12;
  in.dtype = TC_FLOAT32;
  in.redop = -1;
  in.root = -1;
  in.count = 1024;
  in.in_bytes = in.out_bytes = 4096;
  in.timeout_s = 600;
  return in;
}

TC_TEST(log_op_trace_lines) {
  unset_launcher_rank();
  unsetenv("TORCHCOMMS_LOG_FILE");
  log_env("trace", NULL);
  tc_op_info_t ar = op_info(TC_OP_ALL_REDUCE);
  ar.redop = TC_SUM;
  tc_op_info_t send = op_info(TC_OP_SEND);
  send.op_id = 3;
  send.root = 2;
  send.count = 8;
  send.dtype = TC_INT32;
  send.in_bytes = 32;
  send.out_bytes = 0;
  tc_op_info_t ag = op_info(TC_OP_ALL_GATHER_SINGLE);
  ag.out_bytes = 4 * 4096;
  ag.async_op = 1;
  cap_begin();
  tc__log_op("issue", &ar);
  ar.status = TC_OK;
  ar.work_status = TC_WORK_COMPLETED;
  ar.duration_s = 35.2e-6;
  ar.error = "";
  tc__log_op("done", &ar);
  ar.status = TC_ERR_REMOTE;
  ar.work_status = TC_WORK_ERROR;
  ar.duration_s = 1.5e-3;
  ar.error = "peer 2 closed its connection";
  tc__log_op("done", &ar);
  ar.status = TC_ERR_TIMEOUT;
  ar.work_status = TC_WORK_TIMEDOUT;
  ar.duration_s = 2.5;
  ar.error = "";
  tc__log_op("done", &ar);
  tc__log_op("issue", &send);
  tc__log_op("issue", &ag);
  tc_op_info_t old = ar;
  old.size = (uint32_t)offsetof(tc_op_info_t, count); /* too short: ignored */
  tc__log_op("issue", &old);
  tc__log_op("issue", NULL);
  const char *out = cap_end();
  TC_ASSERT_CONTAINS(out, "] coll: all_reduce #12 on 'main' (rank 1 of 4) float32 x1024 "
                          "(4096 B) sum issued\n");
  TC_ASSERT_CONTAINS(out, "] coll: all_reduce #12 on 'main' (rank 1 of 4) float32 x1024 "
                          "(4096 B) sum done ok in 35.2 us\n");
  TC_ASSERT_CONTAINS(out, "sum failed after 1.50 ms: peer 2 closed its connection\n");
  TC_ASSERT_CONTAINS(out, "sum timed out after 2.50 s: operation timed out\n");
  TC_ASSERT_CONTAINS(out, "] p2p: send #3 on 'main' (rank 1 of 4) to peer 2 int32 x8 (32 B) "
                          "issued\n");
  TC_ASSERT_CONTAINS(out, "] coll: all_gather_single #12 on 'main' (rank 1 of 4) float32 "
                          "x1024 (4096 B in, 16384 B out) async issued\n");
  int lines = 0;
  for (const char *p = out; (p = strchr(p, '\n')); p++) lines++;
  TC_ASSERT_EQ(lines, 6);

  log_env("trace", "^p2p"); /* the op's subsystem filters it */
  cap_begin();
  tc__log_op("issue", &send);
  tc__log_op("issue", &ar);
  out = cap_end();
  TC_ASSERT(!strstr(out, "send #3"));
  TC_ASSERT_CONTAINS(out, "all_reduce #12");

  log_env("debug", NULL); /* below trace: nothing */
  cap_begin();
  tc__log_op("issue", &ar);
  tc__log_op("done", &ar);
  out = cap_end();
  TC_ASSERT_STR_EQ(out, "");
}

/* ---- the host table ---- */

static char host_seen[256];
static void host_log_only(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(host_seen, sizeof host_seen, "log %d: ", level);
  vsnprintf(host_seen + n, sizeof host_seen - (size_t)n, fmt, ap);
  va_end(ap);
}

TC_TEST(log_host_logs_and_older_cores) {
  unset_launcher_rank();
  unsetenv("TORCHCOMMS_LOG_FILE");
  log_env("info", "^tcp");
  /* a core built before logs was appended: its size stops at log */
  tc_backend_host_t old;
  memset(&old, 0, sizeof old);
  old.size = (uint32_t)offsetof(tc_backend_host_t, logs);
  old.log = host_log_only;
  old.logs = tc__logs; /* past its size: never read */
  TC_BACKEND_LOGS(&old, TC_LOG_INFO, TC_LOG_SHM, "through %s", "log");
  TC_ASSERT_STR_EQ(host_seen, "log 2: through log");
  TC_ASSERT(TC_BACKEND_LOG_ON(&old, TC_LOG_TRACE, TC_LOG_SHM)); /* unknown: format */
  /* this core: logs and log_on, gated by the subsystem */
  tc_backend_host_t now = old;
  now.size = sizeof now;
  now.logs = tc__logs;
  now.log_on = tc__log_check;
  host_seen[0] = 0;
  TC_ASSERT(TC_BACKEND_LOG_ON(&now, TC_LOG_INFO, TC_LOG_SHM));
  TC_ASSERT(!TC_BACKEND_LOG_ON(&now, TC_LOG_INFO, TC_LOG_TCP));
  cap_begin();
  TC_BACKEND_LOGS(&now, TC_LOG_INFO, TC_LOG_SHM, "through %s", "logs");
  TC_BACKEND_LOGS(&now, TC_LOG_INFO, TC_LOG_TCP, "filtered");
  const char *out = cap_end();
  TC_ASSERT_STR_EQ(host_seen, "");
  TC_ASSERT_CONTAINS(out, "INFO [rank - pid");
  TC_ASSERT_CONTAINS(out, "] shm: through logs\n");
  TC_ASSERT(!strstr(out, "filtered"));
}

/* ---- the file ---- */

typedef struct {
  char dir[64];
  int nthreads, nlines;
} conc_t;

static void *conc_thread(void *arg) {
  conc_t *c = arg;
  static _Atomic int next;
  int t = atomic_fetch_add(&next, 1);
  for (int i = 0; i < c->nlines; i++)
    tc__logs(TC_LOG_INFO, TC_LOG_COLL, "thread %d line %d %s", t, i,
             "................................................................");
  return NULL;
}

/* Threads writing at once: every line is whole (one write each, O_APPEND),
 * in a file opened once and named from the launcher's rank and the pid. */
TC_TEST(log_file_lines_whole_across_threads) {
  unset_launcher_rank();
  setenv("TORCHCOMM_RANK", "1", 1);
  setenv("TORCHCOMM_SIZE", "2", 1);
  conc_t c = {.nthreads = 4, .nlines = 500};
  snprintf(c.dir, sizeof c.dir, "/tmp/tc_logdir.XXXXXX");
  TC_ASSERT(mkdtemp(c.dir) != NULL);
  char pattern[128], path[160];
  snprintf(pattern, sizeof pattern, "%s/t.%%r.%%p.log", c.dir);
  setenv("TORCHCOMMS_LOG_FILE", pattern, 1);
  log_env("info", NULL);
  pthread_t th[4];
  for (int i = 0; i < c.nthreads; i++)
    TC_ASSERT_EQ(pthread_create(&th[i], NULL, conc_thread, &c), 0);
  for (int i = 0; i < c.nthreads; i++) pthread_join(th[i], NULL);
  snprintf(path, sizeof path, "%s/t.1.%d.log", c.dir, (int)getpid());
  static char text[1 << 20];
  TC_ASSERT(read_file(path, text, sizeof text) != NULL);
  unlink(path);
  rmdir(c.dir);
  char head[80];
  snprintf(head, sizeof head, "torchcomms INFO [rank 1 pid %d] coll: thread ", (int)getpid());
  int lines = 0;
  for (char *l = text, *nl; *l; l = nl + 1) {
    nl = strchr(l, '\n');
    TC_ASSERT(nl != NULL);
    *nl = 0;
    if (strncmp(l, head, strlen(head)) != 0 ||
        !strstr(l, " ................................................................"))
      tc_test_fail(__FILE__, __LINE__, "a broken line: '%s'", l);
    lines++;
  }
  TC_ASSERT_EQ(lines, c.nthreads * c.nlines);
}


/* A file named by rank while no rank ever becomes known: the held lines are
 * written at exit, to the file with rank "-". */
TC_TEST(log_file_rank_unknown_until_exit) {
  unset_launcher_rank();
  char dir[64], pattern[128], path[160];
  snprintf(dir, sizeof dir, "/tmp/tc_logdir.XXXXXX");
  TC_ASSERT(mkdtemp(dir) != NULL);
  snprintf(pattern, sizeof pattern, "%s/u.%%r.log", dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TORCHCOMMS_LOG_FILE", pattern, 1);
    log_env("info", NULL);
    tc__logs(TC_LOG_INFO, TC_LOG_INIT, "held line");
    snprintf(path, sizeof path, "%s/u.-.log", dir);
    exit(access(path, F_OK) == 0 ? 3 : 0); /* not written yet; exit runs destructors */
  }
  int st = 0;
  TC_ASSERT_EQ(waitpid(pid, &st, 0), pid);
  TC_ASSERT(WIFEXITED(st));
  TC_ASSERT_EQ(WEXITSTATUS(st), 0);
  snprintf(path, sizeof path, "%s/u.-.log", dir);
  char text[4096];
  TC_ASSERT(read_file(path, text, sizeof text) != NULL);
  unlink(path);
  rmdir(dir);
  char want[96];
  snprintf(want, sizeof want, "torchcomms INFO [rank - pid %d] init: held line\n", (int)pid);
  TC_ASSERT_STR_EQ(text, want);
}

/* ---- real jobs ---- */

typedef struct {
  char dir[64];
  int tcp;
} job_t;

static void rank_log_file(tc_ctx_t *ctx) {
  job_t *j = ctx->arg;
  unset_launcher_rank();
  char pattern[128];
  snprintf(pattern, sizeof pattern, "%s/tc.%%r.%%p.%%h.log", j->dir);
  setenv("TORCHCOMMS_LOG_FILE", pattern, 1);
  if (j->tcp) setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  else unsetenv("TORCHCOMMS_CPU_TRANSPORT");
  setenv("TORCHCOMMS_CHECK_MISMATCH", "1", 1); /* set to its default: not listed */
  log_env("info", NULL);
  tc__logs(TC_LOG_INFO, TC_LOG_INIT, "before the rank is known");
  tc_comm_t *c = tc_ctx_comm(ctx, "logt", NULL);
  int x = 1;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(x, 2);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

/* Checks the file of each rank of a 2-rank job written by rank_log_file. */
static void check_rank_files(const job_t *j) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  DIR *d = opendir(j->dir);
  TC_ASSERT(d != NULL);
  int seen[2] = {0, 0};
  struct dirent *e;
  static char text[1 << 16];
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    int r = -1, pid = -1, n = 0;
    char want[512];
    TC_ASSERT(sscanf(e->d_name, "tc.%d.%d.%n", &r, &pid, &n) == 2 && n > 0);
    TC_ASSERT(r == 0 || r == 1);
    snprintf(want, sizeof want, "%s.log", host); /* %h */
    TC_ASSERT_STR_EQ(e->d_name + n, want);
    seen[r]++;
    char path[400];
    snprintf(path, sizeof path, "%s/%s", j->dir, e->d_name);
    TC_ASSERT(read_file(path, text, sizeof text) != NULL);
    unlink(path);
    /* the line held before the rank was known comes first, as tagged then */
    snprintf(want, sizeof want, "torchcomms INFO [rank - pid %d] init: before the rank is known\n",
             pid);
    TC_ASSERT(strncmp(text, want, strlen(want)) == 0);
    snprintf(want, sizeof want,
             "torchcomms INFO [rank %d pid %d] init: communicator 'logt': backend cpu ", r, pid);
    TC_ASSERT_CONTAINS(text, want);
    snprintf(want, sizeof want, ", rank %d of 2, device cpu, timeout 60 s\n", r);
    TC_ASSERT_CONTAINS(text, want);
    const char *tp = j->tcp ? "tcp" : "shm";
    snprintf(want, sizeof want, "init: communicator 'logt': transport per peer: %d %s\n", 1 - r,
             tp);
    TC_ASSERT_CONTAINS(text, want);
    snprintf(want, sizeof want, "init: communicator 'logt': %s: ", tp);
    TC_ASSERT_CONTAINS(text, want);
    TC_ASSERT_CONTAINS(text, "init: communicator 'logt': thresholds: caller's thread when idle "
                             "up to 1 MiB (synchronous operations at any size)");
    if (!j->tcp) TC_ASSERT_CONTAINS(text, "; streaming stores from ");
    TC_ASSERT_CONTAINS(text, "init: communicator 'logt': settings: ");
    TC_ASSERT_CONTAINS(text, " TORCHCOMMS_LOG=info");
    snprintf(want, sizeof want, " TORCHCOMMS_LOG_FILE=%s/tc.%%r.%%p.%%h.log", j->dir);
    TC_ASSERT_CONTAINS(text, want);
    if (j->tcp) TC_ASSERT_CONTAINS(text, " TORCHCOMMS_CPU_TRANSPORT=tcp");
    TC_ASSERT(!strstr(text, "TORCHCOMMS_CHECK_MISMATCH"));
    /* every line is whole and, but the first, tagged with the rank */
    int lines = 0;
    snprintf(want, sizeof want, " [rank %d pid %d] ", r, pid);
    for (char *l = text, *nl; *l; l = nl + 1, lines++) {
      nl = strchr(l, '\n');
      TC_ASSERT(nl != NULL);
      *nl = 0;
      TC_ASSERT(strncmp(l, "torchcomms ", 11) == 0);
      if (lines > 0 && !strstr(l, want))
        tc_test_fail(__FILE__, __LINE__, "'%s' lacks '%s'", l, want);
    }
    TC_ASSERT(lines >= 6);
  }
  closedir(d);
  rmdir(j->dir);
  TC_ASSERT_EQ(seen[0], 1);
  TC_ASSERT_EQ(seen[1], 1);
}

TC_TEST(log_file_per_rank_init_summary_shm) {
  job_t j = {.tcp = 0};
  snprintf(j.dir, sizeof j.dir, "/tmp/tc_logdir.XXXXXX");
  TC_ASSERT(mkdtemp(j.dir) != NULL);
  tc_spawn(2, rank_log_file, &j, 60);
  check_rank_files(&j);
}

TC_TEST(log_file_per_rank_init_summary_tcp) {
  job_t j = {.tcp = 1};
  snprintf(j.dir, sizeof j.dir, "/tmp/tc_logdir.XXXXXX");
  TC_ASSERT(mkdtemp(j.dir) != NULL);
  tc_spawn(2, rank_log_file, &j, 60);
  check_rank_files(&j);
}

static void rank_silent(tc_ctx_t *ctx) {
  job_t *j = ctx->arg;
  unsetenv("TORCHCOMMS_LOG");
  unsetenv("TORCHCOMMS_LOG_SUBSYS");
  unsetenv("TORCHCOMMS_LOG_FILE");
  char path[128];
  snprintf(path, sizeof path, "%s/stderr.%d", j->dir, ctx->rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TC_ASSERT(fd >= 0);
  fflush(stderr);
  TC_ASSERT_EQ(dup2(fd, 2), 2);
  close(fd);
  tc_comm_t *c = tc_ctx_comm(ctx, "quiet", NULL);
  int x[4] = {1, 2, 3, 4};
  TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_broadcast(c, x, 4, TC_INT32, 0, NULL, NULL));
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

/* TORCHCOMMS_LOG unset: a whole job prints nothing. */
TC_TEST(log_unset_prints_nothing) {
  job_t j = {.tcp = 0};
  snprintf(j.dir, sizeof j.dir, "/tmp/tc_logdir.XXXXXX");
  TC_ASSERT(mkdtemp(j.dir) != NULL);
  tc_spawn(2, rank_silent, &j, 60);
  for (int r = 0; r < 2; r++) {
    char path[128], text[4096];
    snprintf(path, sizeof path, "%s/stderr.%d", j.dir, r);
    TC_ASSERT(read_file(path, text, sizeof text) != NULL);
    unlink(path);
    TC_ASSERT_STR_EQ(text, "");
  }
  rmdir(j.dir);
}
