/* driver.c -- the in-tree fuzzing driver, for compilers without libFuzzer
 * (gcc): links with one target exporting LLVMFuzzerTestOneInput and
 * accepts libFuzzer's basic flags, so `make fuzz` runs either the same way.
 *
 *   fuzz_<name> [-runs=N] [-max_total_time=S] [-seed=N] [-max_len=N]
 *               [-artifact_prefix=P] [corpus directory or file ...]
 *
 * Every corpus file is run as it is, then inputs are made until N runs or S
 * seconds (default: 10000 runs): mostly mutations of a seed or of an
 * earlier input (bit flips, interesting bytes and little-endian integers,
 * inserts, deletions, copies, splices with another seed, truncation), some
 * purely random. Each input is passed in a buffer of exactly its size, so
 * ASan catches any read past it. Inputs are made from the seed (default:
 * the clock; printed), so a run can be repeated with -seed=N.
 *
 * The last line says "fuzz_<name>: <execs> executions, <crashes> crashes".
 * A crash (an ASan/UBSan report, abort, a fatal signal) saves the input to
 * <P>crash-<name>-<exec> (P: -artifact_prefix, default none: the current
 * directory), prints that line with 1 crash, and the process fails. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);
__attribute__((weak)) void __sanitizer_set_death_callback(void (*cb)(void));

#if defined(__SANITIZE_ADDRESS__)
#define ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN 1
#endif
#endif

typedef struct input {
  uint8_t *p;
  size_t len;
} input_t;

static char name[128] = "fuzz";
static const char *prefix = ""; /* -artifact_prefix */
static const uint8_t *cur; /* the input being run, for crash reports */
static size_t cur_len;
static unsigned long long execs;
static uint64_t rng;

/* ---- crash reports (async-signal-safe) ---- */

static void put(int fd, const char *s) {
  ssize_t r = write(fd, s, strlen(s));
  (void)r;
}

static char *utoa(unsigned long long v, char *end) {
  *--end = 0;
  do *--end = (char)('0' + v % 10); while (v /= 10);
  return end;
}

static void save_crash(void) {
  static volatile sig_atomic_t once;
  if (once) return;
  once = 1;
  char path[512] = "", num[32];
  if (strlen(prefix) < 300) strcat(path, prefix);
  strcat(path, "crash-");
  strcat(path, name);
  strcat(path, "-");
  strcat(path, utoa(execs, num + sizeof num));
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t r = cur ? write(fd, cur, cur_len) : 0;
    (void)r;
    close(fd);
  }
  put(2, name);
  put(2, ": ");
  put(2, utoa(execs + 1, num + sizeof num));
  put(2, " executions, 1 crashes; the input is saved in ");
  put(2, fd >= 0 ? path : "(could not write it)");
  put(2, "\n");
}

static void on_signal(int sig) {
  save_crash();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* ---- inputs ---- */

static uint64_t rnd(void) { /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}

static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void add_file(input_t **v, size_t *n, const char *path, size_t max) {
  FILE *f = fopen(path, "rb");
  if (!f) return;
  uint8_t *p = malloc(max ? max : 1);
  size_t len = p ? fread(p, 1, max, f) : 0;
  fclose(f);
  input_t *nv = realloc(*v, (*n + 1) * sizeof *nv);
  if (!p || !nv) {
    free(p);
    return;
  }
  *v = nv;
  (*v)[(*n)++] = (input_t){p, len};
}

static void add_path(input_t **v, size_t *n, const char *path, size_t max) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "%s: %s: %s\n", name, path, strerror(errno));
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    add_file(v, n, path, max);
    return;
  }
  DIR *d = opendir(path);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, e->d_name);
    if (stat(full, &st) == 0 && S_ISREG(st.st_mode)) add_file(v, n, full, max);
  }
  if (d) closedir(d);
}

/* Values that tend to sit on boundaries of length and count checks. */
static const uint64_t interesting[] = {
    0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 127, 128, 255, 256,
    1023, 1024, 4096, 65535, 65536, 0x7fffffff, 0x80000000u, 0xffffffffu,
    (1ull << 20), (1ull << 20) + 1, (1ull << 34), (1ull << 40),
    0x7fffffffffffffffull, 0xffffffffffffffffull, 0x31484354u, 0x314d4354u,
    0x3C85F7CEu};

/* Applies 1..8 random mutations to b[0..*len) (capacity cap). */
static void mutate(uint8_t *b, size_t *len, size_t cap, const input_t *pool,
                   size_t npool) {
  int n = 1 + (int)below(8);
  for (int m = 0; m < n; m++) {
    size_t l = *len, pos = below(l + 1);
    switch (below(10)) {
    case 0: /* flip a bit */
      if (l) b[below(l)] ^= (uint8_t)(1u << below(8));
      break;
    case 1: /* a random byte */
      if (l) b[below(l)] = (uint8_t)rnd();
      break;
    case 2: /* an interesting byte */
      if (l) b[below(l)] = (uint8_t)interesting[below(sizeof interesting / 8)];
      break;
    case 3: { /* insert random bytes */
      size_t k = 1 + below(16);
      if (l + k > cap) break;
      memmove(b + pos + k, b + pos, l - pos);
      for (size_t i = 0; i < k; i++) b[pos + i] = (uint8_t)rnd();
      *len += k;
      break;
    }
    case 4: { /* delete a range */
      if (pos >= l) break;
      size_t k = 1 + below(l - pos < 32 ? l - pos : 32);
      memmove(b + pos, b + pos + k, l - pos - k);
      *len -= k;
      break;
    }
    case 5: { /* copy a range over another place */
      if (l < 2) break;
      size_t from = below(l), k = 1 + below(l - from);
      size_t to = below(l);
      if (to + k > l) k = l - to;
      memmove(b + to, b + from, k);
      break;
    }
    case 6: { /* an interesting little-endian integer, 4 or 8 bytes */
      size_t w = below(2) ? 8 : 4;
      if (l < w) break;
      uint64_t v = interesting[below(sizeof interesting / 8)];
      if (below(4) == 0) v += (uint64_t)(int64_t)(below(5) - 2);
      size_t at = below(l - w + 1);
      for (size_t i = 0; i < w; i++) b[at + i] = (uint8_t)(v >> (8 * i));
      break;
    }
    case 7: { /* splice a piece of another input */
      if (!npool) break;
      const input_t *o = &pool[below(npool)];
      if (!o->len) break;
      size_t from = below(o->len), k = 1 + below(o->len - from);
      if (below(2) && l + k <= cap) { /* insert */
        memmove(b + pos + k, b + pos, l - pos);
        memcpy(b + pos, o->p + from, k);
        *len += k;
      } else { /* overwrite */
        if (pos + k > cap) k = cap - pos;
        memcpy(b + pos, o->p + from, k);
        if (pos + k > l) *len = pos + k;
      }
      break;
    }
    case 8: /* truncate */
      *len = pos;
      break;
    default: /* add or subtract a little */
      if (l) b[below(l)] += (uint8_t)(below(33) - 16);
      break;
    }
  }
}

/* Runs one input from an exact-size copy. */
static void run(const uint8_t *data, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) {
    fprintf(stderr, "%s: out of memory\n", name);
    exit(1);
  }
  memcpy(copy, data, len);
  cur = copy;
  cur_len = len;
  LLVMFuzzerTestOneInput(copy, len);
  cur = NULL;
  free(copy);
  execs++;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const char *base = strrchr(argv[0], '/');
  snprintf(name, sizeof name, "%s", base ? base + 1 : argv[0]);
  unsigned long long runs = 0, seed = 0;
  double max_time = 0;
  size_t max_len = 4096;
  int have_seed = 0;
  input_t *pool = NULL;
  size_t nseeds = 0;
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strncmp(a, "-runs=", 6)) runs = strtoull(a + 6, NULL, 10);
    else if (!strncmp(a, "-max_total_time=", 16)) max_time = atof(a + 16);
    else if (!strncmp(a, "-seed=", 6)) seed = strtoull(a + 6, NULL, 10), have_seed = 1;
    else if (!strncmp(a, "-max_len=", 9)) max_len = (size_t)strtoull(a + 9, NULL, 10);
    else if (!strncmp(a, "-artifact_prefix=", 17)) prefix = a + 17;
    else if (a[0] == '-') fprintf(stderr, "%s: ignoring unknown flag %s\n", name, a);
  }
  if (max_len < 16) max_len = 16;
  for (int i = 1; i < argc; i++)
    if (argv[i][0] != '-') add_path(&pool, &nseeds, argv[i], max_len);
  if (!runs && max_time <= 0) runs = 10000;
  if (!have_seed) seed = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 20);
  rng = seed ? seed : 1;
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(save_crash);
  signal(SIGABRT, on_signal);
#ifndef ASAN
  signal(SIGSEGV, on_signal); /* ASan reports these itself */
  signal(SIGBUS, on_signal);
  signal(SIGFPE, on_signal);
  signal(SIGILL, on_signal);
#endif
  double t0 = now_s();
  for (size_t i = 0; i < nseeds; i++) run(pool[i].p, pool[i].len);
  size_t npool = nseeds, maxpool = nseeds + 256;
  input_t *grown = realloc(pool, maxpool * sizeof *pool);
  if (grown) pool = grown;
  else maxpool = npool;
  uint8_t *buf = malloc(max_len);
  if (!buf) return 1;
  for (;;) {
    if (runs && execs >= runs) break;
    if (max_time > 0 && (execs & 63) == 0 && now_s() - t0 >= max_time) break;
    size_t len;
    if (!npool || below(16) == 0) { /* purely random */
      len = below(max_len < 256 ? max_len : 256);
      for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rnd();
    } else {
      const input_t *s = &pool[below(npool)];
      len = s->len < max_len ? s->len : max_len;
      memcpy(buf, s->p, len);
      mutate(buf, &len, max_len, pool, npool);
    }
    run(buf, len);
    /* keep some inputs to mutate further (replacing older ones once the
     * pool is full; the corpus inputs stay) */
    if (below(64) == 0 && maxpool > nseeds) {
      uint8_t *p = malloc(len ? len : 1);
      if (p) {
        memcpy(p, buf, len);
        size_t slot;
        if (npool < maxpool) {
          slot = npool++;
        } else {
          slot = nseeds + below(maxpool - nseeds);
          free(pool[slot].p);
        }
        pool[slot] = (input_t){p, len};
      }
    }
  }
  printf("%s: %llu executions, 0 crashes (%.1f s, seed %llu, %zu corpus inputs)\n",
         name, execs, now_s() - t0, seed, nseeds);
  for (size_t i = 0; i < npool; i++) free(pool[i].p);
  free(pool);
  free(buf);
  return 0;
}
