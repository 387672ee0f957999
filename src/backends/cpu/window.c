/* window.c -- one-sided windows of the cpu backend (docs/windows.md).
 *
 * Every rank's side of a window is an *area*: a header page (the futex word
 * its waits sleep on), one 64-byte signal counter per origin rank, then the
 * window memory when the library allocates it. How a peer's window is
 * reached, per peer:
 *  - MAP  (shared-memory transport, library memory): the peer's area is
 *         mapped here; a put or get is a memcpy, a signal an atomic add on
 *         the peer's counter plus a futex wake when the peer sleeps; the
 *         target's threads take no part.
 *  - CMA  (shared-memory transport, the peer's own buffer): the counters
 *         are mapped as above, the data moves with process_vm_writev /
 *         readv (single copy, the target takes no part).
 *  - NET  (TCP transport, or no CMA): through the peer's window service,
 *         a thread per window and rank that serves puts, gets, signals and
 *         flushes arriving on its connections without the application
 *         posting anything. Messages from one origin are served in order,
 *         so a signal (or a flush's answer) follows the origin's earlier
 *         puts into memory.
 * Every rank connects to every peer's service when the window is created
 * (whatever the path): the connections are the liveness channel, so a
 * waiter learns of a peer's death from its service thread at once (an end
 * of stream that no goodbye preceded), and a put or signal to a dead peer
 * fails with the dead-peer error.
 *
 * Waiting (wait_signal, a flush's answer) spins briefly when the machine
 * has a core per local rank (the transport's spin policy), then sleeps on
 * the area's futex word in naps of at most 5 ms, checking the abort flag,
 * the deadline and the peer's liveness in between. */
#include "backends/cpu/cpu.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WIN_MAGIC 0x314e4957u /* "WIN1" */
#define WIN_HDR_BYTES 4096u
#define WIN_SIG_STRIDE 64u
#define WIN_NAP_S 0.005
#define WIN_SPIN_CAP_S 50e-6

enum { WIN_MAP = 0, WIN_CMA = 1, WIN_NET = 2 };
enum { MSG_PUT = 1, MSG_GET = 2, MSG_SIGNAL = 3, MSG_FLUSH = 4, MSG_BYE = 5, MSG_HELLO = 6 };

/* The header page of an area. */
typedef struct win_hdr {
  uint64_t magic;
  _Alignas(64) _Atomic uint32_t bell;     /* futex word: rung on every signal to this rank */
  _Alignas(64) _Atomic uint32_t sleepers; /* this rank's threads about to sleep */
} win_hdr_t;

/* What every rank tells the others (the core all-gathers it). */
typedef struct win_info {
  uint32_t magic;
  int32_t rank;
  int32_t shm;  /* the area is a shared segment (name below) */
  int32_t lib;  /* the window memory is in the area */
  int32_t port; /* the service */
  int32_t pad;
  uint64_t bytes, area_bytes, data_off;
  uint64_t user_addr; /* the caller's buffer (CMA) */
  char addr[128];
  char area[200];
} win_info_t;
_Static_assert(sizeof(win_info_t) <= TC_BACKEND_WIN_INFO_MAX, "window info fits");

/* A message to a service: 24 bytes, then a PUT's payload. */
typedef struct win_msg {
  uint32_t magic, kind;
  uint64_t offset, len;
} win_msg_t;

typedef struct cpu_win {
  cpu_comm_t *c;
  int rank, size;
  tc_shm_t *shm; /* the shared-memory transport, or NULL */
  /* this rank's area and memory */
  char *area;
  size_t area_bytes, data_off;
  int area_shm; /* mapped from a segment (else malloc) */
  char area_name[200];
  char *mem; /* the window memory: area + data_off, or the caller's buffer */
  size_t bytes;
  win_hdr_t *hdr;
  _Atomic uint64_t *sig; /* [size]: counters of the signals each origin sent here */
  /* peers */
  win_info_t *info;     /* [size] */
  int *mode;            /* [size] WIN_MAP / WIN_CMA / WIN_NET */
  char **parea;         /* [size] the peer's area mapped here (MAP, CMA), or NULL */
  int *ofd;             /* [size] our connection to the peer's service */
  pthread_mutex_t *omu; /* [size] one origin operation at a time per connection */
  _Atomic int *dead;    /* [size] the peer's connection to our service ended */
  _Atomic int *left;    /* [size] ... after its goodbye */
  /* the service */
  int lfd, wake;
  pthread_t th;
  int th_started;
  int *ifd;             /* [size] the peers' connections to our service */
  double spin_s;
  /* the copy helper: a thread that takes part in large copies */
  struct win_copier *cp;
  pthread_mutex_t cpmu; /* one large copy at a time */
} cpu_win_t;

static void futex_wait(_Atomic uint32_t *w, uint32_t v, double secs) {
  struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0);
}

static void ring(win_hdr_t *h) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&h->sleepers, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&h->bell, 1, memory_order_seq_cst);
    syscall(SYS_futex, (uint32_t *)&h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  }
}

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

/* This rank's counter of the signals origin p sent here. */
static inline _Atomic uint64_t *my_counter(cpu_win_t *w, int p) {
  return (_Atomic uint64_t *)((char *)w->sig + (size_t)p * WIN_SIG_STRIDE);
}

static inline void cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void release_munmap(void *p, size_t len) { munmap(p, len); }
static void release_free(void *p, size_t len) {
  (void)len;
  free(p);
}

/* ------------------------------------------------------------------------ */
/* Large copies                                                              */
/* ------------------------------------------------------------------------ */

/* A copy beyond the last-level cache is bound by one core's memory
 * bandwidth (measured here: 10.5 GB/s for 16 MiB on one thread, 16 GB/s on
 * two). A put or get of at least WIN_SPLIT_BYTES into a mapped window is
 * therefore cut into WIN_SPLIT_CHUNK pieces that the caller and a helper
 * thread (one per window, started at the first such copy) take in turn
 * under a lock. The caller never waits for a piece nobody has started: when
 * the helper is not running (a busy machine), the caller copies every piece
 * itself, and waits at most for the one piece the helper is copying. */
#define WIN_SPLIT_BYTES (8u << 20)
#define WIN_SPLIT_CHUNK (512u << 10)

typedef struct win_copier {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t go, fin;
  uint64_t gen;      /* the current job */
  int stop;
  char *dst;
  const char *src;
  size_t n, next, done;
} win_copier_t;

/* Takes the next piece of job `gen` (mu held): 1 with *off and *len. */
static int cp_take(win_copier_t *k, uint64_t gen, size_t *off, size_t *len) {
  if (k->gen != gen || k->next >= k->n) return 0;
  *off = k->next;
  *len = k->n - k->next < WIN_SPLIT_CHUNK ? k->n - k->next : WIN_SPLIT_CHUNK;
  k->next += *len;
  return 1;
}

/* Copies the pieces it can take of job `gen`; mu held on entry and exit. */
static void cp_work(win_copier_t *k, uint64_t gen) {
  size_t off, len;
  while (cp_take(k, gen, &off, &len)) {
    char *d = k->dst + off;
    const char *s = k->src + off;
    pthread_mutex_unlock(&k->mu);
    memcpy(d, s, len);
    pthread_mutex_lock(&k->mu);
    k->done += len;
    if (k->done == k->n) pthread_cond_broadcast(&k->fin);
  }
}

static void *cp_main(void *arg) {
  win_copier_t *k = arg;
  pthread_mutex_lock(&k->mu);
  uint64_t seen = k->gen;
  for (;;) {
    while (k->gen == seen && !k->stop) pthread_cond_wait(&k->go, &k->mu);
    if (k->stop) break;
    seen = k->gen;
    cp_work(k, seen);
  }
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

static void cp_stop(win_copier_t *k) {
  if (!k) return;
  pthread_mutex_lock(&k->mu);
  k->stop = 1;
  pthread_cond_broadcast(&k->go);
  pthread_mutex_unlock(&k->mu);
  pthread_join(k->th, NULL);
  pthread_mutex_destroy(&k->mu);
  pthread_cond_destroy(&k->go);
  pthread_cond_destroy(&k->fin);
  free(k);
}

/* memcpy(dst, src, n), split with the window's helper when it is large
 * and the machine has a core for it. */
static void win_copy(cpu_win_t *w, char *dst, const char *src, size_t n) {
  static int cores = 0;
  if (!cores) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n < WIN_SPLIT_BYTES || cores < 2 || w->spin_s <= 0) { /* spin_s 0: oversubscribed */
    memcpy(dst, src, n);
    return;
  }
  pthread_mutex_lock(&w->cpmu);
  if (!w->cp) {
    win_copier_t *k = calloc(1, sizeof *k);
    if (k) {
      pthread_mutex_init(&k->mu, NULL);
      pthread_cond_init(&k->go, NULL);
      pthread_cond_init(&k->fin, NULL);
      if (pthread_create(&k->th, NULL, cp_main, k) != 0) {
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->go);
        pthread_cond_destroy(&k->fin);
        free(k);
        k = NULL;
      }
    }
    w->cp = k;
  }
  win_copier_t *k = w->cp;
  if (!k) {
    pthread_mutex_unlock(&w->cpmu);
    memcpy(dst, src, n);
    return;
  }
  pthread_mutex_lock(&k->mu);
  uint64_t gen = ++k->gen;
  k->dst = dst;
  k->src = src;
  k->n = n;
  k->next = k->done = 0;
  pthread_cond_signal(&k->go);
  cp_work(k, gen);
  while (k->done < k->n) pthread_cond_wait(&k->fin, &k->mu);
  pthread_mutex_unlock(&k->mu);
  pthread_mutex_unlock(&w->cpmu);
}

/* ------------------------------------------------------------------------ */
/* The service                                                               */
/* ------------------------------------------------------------------------ */

/* Busy-polls fds (poll with no timeout) for up to spin_s seconds: 1 once
 * one is ready, 0 when the budget is spent. A thread wake-up costs tens of
 * microseconds on a virtual machine; a round trip of a flush or a get pays
 * two of them without this. */
static int spin_ready(struct pollfd *pf, nfds_t n, double spin_s) {
  if (spin_s <= 0) return 0;
  double until = tc__now() + spin_s;
  do {
    if (poll(pf, n, 0) > 0) return 1;
    sched_yield();
  } while (tc__now() < until);
  return 0;
}

static void svc_drop(cpu_win_t *w, int p, int clean) {
  if (w->ifd[p] >= 0) close(w->ifd[p]);
  w->ifd[p] = -1;
  if (clean) atomic_store(&w->left[p], 1);
  else atomic_store(&w->dead[p], 1);
  atomic_fetch_add(&w->hdr->bell, 1); /* wake a waiter to notice */
  syscall(SYS_futex, (uint32_t *)&w->hdr->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Serves one message from peer p's connection. 0: go on; -1: drop it. */
static int svc_one(cpu_win_t *w, int p) {
  int fd = w->ifd[p];
  win_msg_t m;
  char err[128];
  double dl = tc__now() + 3600.0; /* a started message is finished by a live origin */
  if (tc__winsock_io(fd, 0, &m, sizeof m, dl, w->wake, err, sizeof err) != TC_OK) return -1;
  if (m.magic != WIN_MAGIC) return -1;
  switch (m.kind) {
  case MSG_PUT:
  case MSG_GET:
    if (m.offset > w->bytes || m.len > w->bytes - m.offset) return -1; /* checked at the origin */
    return tc__winsock_io(fd, m.kind == MSG_GET, w->mem + m.offset, (size_t)m.len, dl, w->wake,
                          err, sizeof err) == TC_OK ? 0 : -1;
  case MSG_SIGNAL:
    atomic_fetch_add_explicit(my_counter(w, p), 1, memory_order_release);
    ring(w->hdr);
    return 0;
  case MSG_FLUSH: {
    uint64_t ack = WIN_MAGIC;
    return tc__winsock_io(fd, 1, &ack, sizeof ack, dl, w->wake, err, sizeof err) == TC_OK ? 0 : -1;
  }
  case MSG_BYE:
    svc_drop(w, p, 1);
    return 1;
  default:
    return -1;
  }
}

static void *svc_main(void *arg) {
  cpu_win_t *w = arg;
  int n = w->size;
  struct pollfd *pf = calloc((size_t)n + 2, sizeof *pf);
  int *who = calloc((size_t)n + 2, sizeof *who);
  if (!pf || !who) goto out;
  for (;;) {
    int k = 0;
    pf[k++] = (struct pollfd){.fd = w->wake, .events = POLLIN};
    pf[k++] = (struct pollfd){.fd = w->lfd, .events = POLLIN};
    for (int p = 0; p < n; p++)
      if (w->ifd[p] >= 0) {
        who[k] = p;
        pf[k++] = (struct pollfd){.fd = w->ifd[p], .events = POLLIN};
      }
    if (!spin_ready(pf, (nfds_t)k, w->spin_s) && poll(pf, (nfds_t)k, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[0].revents) break; /* freed */
    if (pf[1].revents & POLLIN) {
      int fd = accept4(w->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        int one = 1; /* a flush's answer or a get's data go out at once */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* the hello: {magic, MSG_HELLO, rank, 0}, sent right after connect */
        win_msg_t m;
        char err[64];
        if (tc__winsock_io(fd, 0, &m, sizeof m, tc__now() + 3.0, w->wake, err, sizeof err) ==
                TC_OK &&
            m.magic == WIN_MAGIC && m.kind == MSG_HELLO && m.offset < (uint64_t)n &&
            w->ifd[m.offset] < 0 && !atomic_load(&w->dead[m.offset]))
          w->ifd[m.offset] = fd;
        else
          close(fd);
      }
    }
    for (int i = 2; i < k; i++) {
      if (!pf[i].revents) continue;
      int p = who[i];
      if (w->ifd[p] < 0) continue;
      int r = svc_one(w, p);
      if (r < 0) svc_drop(w, p, 0);
    }
  }
out:
  free(pf);
  free(who);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                  */
/* ------------------------------------------------------------------------ */

int tc__cpu_win_create(void *bcomm, void *buf, size_t bytes, void **bwin, void **base,
                       void *info, size_t *info_len, char *err, size_t errlen) {
  cpu_comm_t *c = bcomm;
  cpu_win_t *w = calloc(1, sizeof *w);
  if (!w) return fail(err, errlen, TC_ERR_NOMEM, "out of memory");
  w->c = c;
  w->rank = c->rank;
  w->size = c->size;
  w->shm = c->shm;
  w->lfd = w->wake = -1;
  pthread_mutex_init(&w->cpmu, NULL);
  int n = c->size;
  w->info = calloc((size_t)n, sizeof *w->info);
  w->mode = calloc((size_t)n, sizeof *w->mode);
  w->parea = calloc((size_t)n, sizeof *w->parea);
  w->ofd = malloc((size_t)n * sizeof *w->ofd);
  w->ifd = malloc((size_t)n * sizeof *w->ifd);
  w->omu = calloc((size_t)n, sizeof *w->omu);
  w->dead = calloc((size_t)n, sizeof *w->dead);
  w->left = calloc((size_t)n, sizeof *w->left);
  *bwin = w;
  if (!w->info || !w->mode || !w->parea || !w->ofd || !w->ifd || !w->omu || !w->dead || !w->left)
    return fail(err, errlen, TC_ERR_NOMEM, "out of memory");
  for (int p = 0; p < n; p++) {
    w->ofd[p] = w->ifd[p] = -1;
    pthread_mutex_init(&w->omu[p], NULL);
  }
  /* the area: header, counters, then the library's memory */
  size_t sig_end = WIN_HDR_BYTES + (size_t)n * WIN_SIG_STRIDE;
  w->data_off = (sig_end + 4095) & ~(size_t)4095;
  w->area_bytes = buf ? w->data_off : w->data_off + ((bytes + 4095) & ~(size_t)4095);
  if (w->area_bytes < w->data_off + 4096) w->area_bytes = w->data_off + 4096;
  void *a = NULL;
  if (w->shm) {
    if (tc__shm_area_create("win", w->area_bytes, w->area_name, sizeof w->area_name, &a) != TC_OK)
      return fail(err, errlen, TC_ERR_SYSTEM,
                  "could not create a shared-memory window of %zu bytes (%s; is /dev/shm full? "
                  "df -h /dev/shm)", w->area_bytes, strerror(errno));
    w->area_shm = 1;
    if (tc__winmem_add(a, w->area_bytes, release_munmap) != TC_OK) {
      tc__shm_area_unlink(w->area_name);
      munmap(a, w->area_bytes);
      w->area_name[0] = 0;
      return fail(err, errlen, TC_ERR_NOMEM, "out of memory");
    }
  } else {
    if (!(a = aligned_alloc(4096, w->area_bytes)))
      return fail(err, errlen, TC_ERR_NOMEM, "out of memory allocating a window of %zu bytes",
                  w->area_bytes);
    memset(a, 0, w->area_bytes);
    if (tc__winmem_add(a, w->area_bytes, release_free) != TC_OK) {
      free(a);
      return fail(err, errlen, TC_ERR_NOMEM, "out of memory");
    }
  }
  w->area = a;
  w->hdr = (win_hdr_t *)w->area;
  w->hdr->magic = WIN_MAGIC;
  w->sig = (_Atomic uint64_t *)(w->area + WIN_HDR_BYTES);
  w->mem = buf ? buf : w->area + w->data_off;
  w->bytes = bytes;
  w->spin_s = w->shm ? tc__shm_spin_s(w->shm) : tc__tcp_poll_spin_s(c->tp_ops, c->tp);
  if (w->spin_s > WIN_SPIN_CAP_S) w->spin_s = WIN_SPIN_CAP_S;
  /* the service */
  win_info_t *me = &w->info[w->rank];
  int port = 0;
  int rc = tc__winsock_listen(c->advertise[0] ? c->advertise : NULL, &w->lfd, &port, me->addr,
                              sizeof me->addr, err, errlen);
  if (rc != TC_OK) return rc;
  if ((w->wake = eventfd(0, EFD_CLOEXEC)) < 0)
    return fail(err, errlen, TC_ERR_SYSTEM, "eventfd: %s", strerror(errno));
  if (pthread_create(&w->th, NULL, svc_main, w) != 0)
    return fail(err, errlen, TC_ERR_SYSTEM, "could not start the window service thread");
  w->th_started = 1;
  me->magic = WIN_MAGIC;
  me->rank = w->rank;
  me->shm = w->area_shm;
  me->lib = buf == NULL;
  me->port = port;
  me->bytes = bytes;
  me->area_bytes = w->area_bytes;
  me->data_off = w->data_off;
  me->user_addr = (uint64_t)(uintptr_t)buf;
  snprintf(me->area, sizeof me->area, "%s", w->area_name);
  memcpy(info, me, sizeof *me);
  *info_len = sizeof *me;
  *base = w->mem;
  return TC_OK;
}

int tc__cpu_win_attach(void *bwin, const void *infos, size_t stride, char *err, size_t errlen) {
  cpu_win_t *w = bwin;
  double deadline = tc__now() + w->c->timeout_s;
  for (int p = 0; p < w->size; p++) {
    memcpy(&w->info[p], (const char *)infos + (size_t)p * stride, sizeof w->info[p]);
    win_info_t *pi = &w->info[p];
    if (pi->magic != WIN_MAGIC || pi->rank != p)
      return fail(err, errlen, TC_ERR_PROTOCOL, "rank %d sent a window description of another "
                  "kind (mismatched window calls between ranks?)", p);
    if (p == w->rank) continue;
    w->mode[p] = WIN_NET;
    if (w->shm && pi->shm) {
      void *a = NULL;
      if (tc__shm_area_open(pi->area, pi->area_bytes, &a) != TC_OK)
        return fail(err, errlen, TC_ERR_SYSTEM, "could not map rank %d's window %s (%s)", p,
                    pi->area, strerror(errno));
      if (tc__winmem_add(a, pi->area_bytes, release_munmap) != TC_OK) {
        munmap(a, pi->area_bytes);
        return fail(err, errlen, TC_ERR_NOMEM, "out of memory");
      }
      w->parea[p] = a;
      w->mode[p] = pi->lib ? WIN_MAP : tc__shm_cma(w->shm) ? WIN_CMA : WIN_NET;
    }
    /* the connection to the peer's service: liveness, and the NET path */
    int rc = tc__winsock_connect(pi->addr, pi->port, deadline, w->c->wake_fd, &w->ofd[p], err,
                                 errlen);
    if (rc != TC_OK) {
      char why[256];
      snprintf(why, sizeof why, "%s", err);
      return fail(err, errlen, rc, "could not connect to rank %d's window service at %s:%d: %s",
                  p, pi->addr, pi->port, why);
    }
    win_msg_t hello = {WIN_MAGIC, MSG_HELLO, (uint64_t)w->rank, 0};
    char why[128];
    rc = tc__winsock_io(w->ofd[p], 1, &hello, sizeof hello, deadline, w->c->wake_fd, why,
                        sizeof why);
    if (rc != TC_OK)
      return fail(err, errlen, rc, "rank %d's window service: %s", p, why);
  }
  return TC_OK;
}

void tc__cpu_win_ready(void *bwin) {
  cpu_win_t *w = bwin;
  if (w->area_name[0]) tc__shm_area_unlink(w->area_name); /* every peer mapped it */
  w->area_name[0] = 0;
}

void *tc__cpu_win_map(void *bwin, int peer) {
  cpu_win_t *w = bwin;
  if (peer == w->rank) return w->info[peer].lib ? w->mem : NULL;
  return w->mode[peer] == WIN_MAP ? w->parea[peer] + w->info[peer].data_off : NULL;
}

void tc__cpu_win_free(void *bwin) {
  cpu_win_t *w = bwin;
  if (!w) return;
  int n = w->size;
  if (w->ofd)
    for (int p = 0; p < n; p++) {
      if (w->ofd[p] < 0) continue;
      win_msg_t bye = {WIN_MAGIC, MSG_BYE, 0, 0};
      char why[64];
      tc__winsock_io(w->ofd[p], 1, &bye, sizeof bye, tc__now() + 0.5, -1, why, sizeof why);
      close(w->ofd[p]);
    }
  if (w->th_started) {
    uint64_t one = 1;
    if (write(w->wake, &one, sizeof one) < 0) { /* cannot fail: an eventfd */
    }
    pthread_join(w->th, NULL);
  }
  if (w->ifd)
    for (int p = 0; p < n; p++)
      if (w->ifd[p] >= 0) close(w->ifd[p]);
  if (w->lfd >= 0) close(w->lfd);
  if (w->wake >= 0) close(w->wake);
  if (w->parea)
    for (int p = 0; p < n; p++)
      if (w->parea[p]) tc__winmem_unref(w->parea[p]);
  if (w->area_name[0]) tc__shm_area_unlink(w->area_name);
  if (w->area) tc__winmem_unref(w->area);
  if (w->omu)
    for (int p = 0; p < n; p++) pthread_mutex_destroy(&w->omu[p]);
  cp_stop(w->cp);
  pthread_mutex_destroy(&w->cpmu);
  free(w->info);
  free(w->mode);
  free(w->parea);
  free(w->ofd);
  free(w->ifd);
  free(w->omu);
  free((void *)w->dead);
  free((void *)w->left);
  free(w);
}

/* ------------------------------------------------------------------------ */
/* Operations                                                                */
/* ------------------------------------------------------------------------ */

static int peer_gone(cpu_win_t *w, int p, const char *what, char *err, size_t errlen) {
  if (atomic_load(&w->left[p]))
    return fail(err, errlen, TC_ERR_REMOTE, "peer %d already freed the window (it called "
                "window free or finalize while this rank still %s; mismatched calls?)", p, what);
  return fail(err, errlen, TC_ERR_REMOTE, "peer %d closed its connection (process exited?) "
              "while this rank %s", p, what);
}

/* One message to peer p's service (and its payload), under omu[p]. */
static int net_send(cpu_win_t *w, int p, uint32_t kind, uint64_t off, const void *data,
                    size_t len, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  win_msg_t m = {WIN_MAGIC, kind, off, len};
  char why[160];
  if (kind == MSG_PUT && len <= 4096) { /* one write for a small put */
    unsigned char one[sizeof m + 4096];
    memcpy(one, &m, sizeof m);
    memcpy(one + sizeof m, data, len);
    int rc = tc__winsock_io(w->ofd[p], 1, one, sizeof m + len, op->deadline, w->c->wake_fd, why,
                            sizeof why);
    if (rc == TC_ERR_REMOTE) return peer_gone(w, p, op->opname, err, errlen);
    if (rc != TC_OK) return fail(err, errlen, rc, "%s sending to peer %d's window service", why, p);
    return TC_OK;
  }
  int rc = tc__winsock_io(w->ofd[p], 1, &m, sizeof m, op->deadline, w->c->wake_fd, why, sizeof why);
  if (rc == TC_OK && kind == MSG_PUT && len)
    rc = tc__winsock_io(w->ofd[p], 1, (void *)(uintptr_t)data, len, op->deadline, w->c->wake_fd,
                        why, sizeof why);
  if (rc == TC_ERR_REMOTE) return peer_gone(w, p, op->opname, err, errlen);
  if (rc == TC_ERR_TIMEOUT)
    return fail(err, errlen, rc, "timed out after %g s sending to peer %d's window service "
                "(the peer is not reading: stuck or overloaded?)", op->timeout_s, p);
  if (rc != TC_OK) return fail(err, errlen, rc, "%s", why);
  return TC_OK;
}

static int net_recv(cpu_win_t *w, int p, void *data, size_t len, const tc_backend_win_op_t *op,
                    char *err, size_t errlen) {
  char why[160];
  struct pollfd pf = {.fd = w->ofd[p], .events = POLLIN};
  spin_ready(&pf, 1, w->spin_s); /* the answer is usually microseconds away */
  int rc = tc__winsock_io(w->ofd[p], 0, data, len, op->deadline, w->c->wake_fd, why, sizeof why);
  if (rc == TC_ERR_REMOTE) return peer_gone(w, p, op->opname, err, errlen);
  if (rc == TC_ERR_TIMEOUT)
    return fail(err, errlen, rc, "timed out after %g s waiting for peer %d's window service",
                op->timeout_s, p);
  if (rc != TC_OK) return fail(err, errlen, rc, "%s", why);
  return TC_OK;
}

static int net_flush(cpu_win_t *w, int p, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  int rc = net_send(w, p, MSG_FLUSH, 0, NULL, 0, op, err, errlen);
  uint64_t ack = 0;
  if (rc == TC_OK) rc = net_recv(w, p, &ack, sizeof ack, op, err, errlen);
  if (rc == TC_OK && ack != WIN_MAGIC)
    rc = fail(err, errlen, TC_ERR_PROTOCOL, "peer %d's window service answered a flush with "
              "garbage", p);
  return rc;
}

static _Atomic uint64_t *peer_counter(cpu_win_t *w, int p) {
  return (_Atomic uint64_t *)(w->parea[p] + WIN_HDR_BYTES + (size_t)w->rank * WIN_SIG_STRIDE);
}

static int win_wait(cpu_win_t *w, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  int p = op->peer;
  _Atomic uint64_t *ctr = my_counter(w, p);
  if (atomic_load_explicit(ctr, memory_order_acquire) >= op->target) return TC_OK;
  if (!op->block) return TC_BACKEND_WIN_PENDING;
  double now = tc__now(), spin_until = now + w->spin_s;
  for (;;) {
    if (atomic_load_explicit(ctr, memory_order_acquire) >= op->target) return TC_OK;
    if (atomic_load_explicit(&w->c->aborted, memory_order_relaxed))
      return fail(err, errlen, TC_ERR_ABORTED, "communicator was aborted");
    if (p != w->rank && (atomic_load(&w->dead[p]) || atomic_load(&w->left[p])) &&
        atomic_load_explicit(ctr, memory_order_acquire) < op->target)
      return peer_gone(w, p, "waited for its signal", err, errlen);
    now = tc__now();
    if (now >= op->deadline)
      return fail(err, errlen, TC_ERR_TIMEOUT, "timed out after %g s waiting for a signal from "
                  "peer %d (%llu received, waiting for number %llu; the peer did not signal: "
                  "mismatched put/signal/wait_signal calls?)", op->timeout_s, p,
                  (unsigned long long)atomic_load(ctr), (unsigned long long)op->target);
    if (now < spin_until) {
      for (int i = 0; i < 64; i++) cpu_pause();
      continue;
    }
    uint32_t b = atomic_load_explicit(&w->hdr->bell, memory_order_seq_cst);
    atomic_fetch_add_explicit(&w->hdr->sleepers, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(ctr, memory_order_acquire) < op->target &&
        !atomic_load(&w->c->aborted)) {
      double nap = op->deadline - now;
      futex_wait(&w->hdr->bell, b, nap < WIN_NAP_S ? (nap > 0 ? nap : 1e-6) : WIN_NAP_S);
    }
    atomic_fetch_sub_explicit(&w->hdr->sleepers, 1, memory_order_relaxed);
  }
}

int tc__cpu_win_op(void *bwin, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  cpu_win_t *w = bwin;
  int p = op->peer;
  if (atomic_load_explicit(&w->c->aborted, memory_order_relaxed))
    return fail(err, errlen, TC_ERR_ABORTED, "communicator was aborted");
  if (op->kind == TC_WIN_WAIT_SIGNAL) return win_wait(w, op, err, errlen);
  if (op->kind == TC_WIN_FLUSH) {
    for (int q = p < 0 ? 0 : p; q < (p < 0 ? w->size : p + 1); q++) {
      if (q == w->rank) continue;
      if (atomic_load(&w->dead[q])) return peer_gone(w, q, "flushed its puts", err, errlen);
      if (w->mode[q] != WIN_NET) continue; /* copies are visible when they return */
      pthread_mutex_lock(&w->omu[q]);
      int rc = net_flush(w, q, op, err, errlen);
      pthread_mutex_unlock(&w->omu[q]);
      if (rc != TC_OK) return rc;
    }
    return TC_OK;
  }
  if (p == w->rank) { /* this rank's own window */
    if (op->kind == TC_WIN_PUT) memmove(w->mem + op->offset, op->buf, op->bytes);
    else if (op->kind == TC_WIN_GET) memmove(op->buf, w->mem + op->offset, op->bytes);
    else {
      atomic_fetch_add_explicit(my_counter(w, p), 1, memory_order_release);
      ring(w->hdr);
    }
    return TC_OK;
  }
  if (atomic_load(&w->dead[p]) || atomic_load(&w->left[p]))
    return peer_gone(w, p, op->kind == TC_WIN_PUT ? "put into its window"
                           : op->kind == TC_WIN_GET ? "read its window" : "signalled it",
                     err, errlen);
  int rc = TC_OK;
  switch (w->mode[p]) {
  case WIN_MAP: {
    char *dst = w->parea[p] + w->info[p].data_off + op->offset;
    if (op->kind == TC_WIN_PUT) win_copy(w, dst, op->buf, op->bytes);
    else if (op->kind == TC_WIN_GET) win_copy(w, op->buf, dst, op->bytes);
    break;
  }
  case WIN_CMA:
    if (op->kind == TC_WIN_PUT)
      rc = tc__shm_write_peer(w->shm, p, w->info[p].user_addr + op->offset, op->buf, op->bytes,
                              err, errlen);
    else if (op->kind == TC_WIN_GET) {
      tc_tp_op_t t = {.opname = op->opname, .deadline = op->deadline, .timeout_s = op->timeout_s,
                      .msg = err, .msglen = errlen};
      rc = tc__shm_read_peer(w->shm, p, op->buf, w->info[p].user_addr + op->offset, op->bytes, &t);
    }
    break;
  default:
    pthread_mutex_lock(&w->omu[p]);
    if (op->kind == TC_WIN_PUT)
      rc = net_send(w, p, MSG_PUT, op->offset, op->buf, op->bytes, op, err, errlen);
    else if (op->kind == TC_WIN_GET) {
      rc = net_send(w, p, MSG_GET, op->offset, NULL, op->bytes, op, err, errlen);
      if (rc == TC_OK) rc = net_recv(w, p, op->buf, op->bytes, op, err, errlen);
    } else {
      rc = net_send(w, p, MSG_SIGNAL, 0, NULL, 0, op, err, errlen);
    }
    pthread_mutex_unlock(&w->omu[p]);
    return rc;
  }
  if (rc != TC_OK) return rc;
  if (op->kind == TC_WIN_SIGNAL) {
    /* release: the puts before it are visible to a waiter that sees it */
    atomic_fetch_add_explicit(peer_counter(w, p), 1, memory_order_release);
    ring((win_hdr_t *)w->parea[p]);
  } else if (op->kind == TC_WIN_PUT && atomic_load(&w->dead[p])) {
    return peer_gone(w, p, "put into its window", err, errlen); /* died during the copy */
  }
  return TC_OK;
}
