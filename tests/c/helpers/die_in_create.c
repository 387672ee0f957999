/* die_in_create.c -- a rank that is SIGKILLed while creating a communicator,
 * for the "no leftovers" tests (tests/c/test_shm_leftovers.c,
 * tests/c/test_tcrun.c). Run as one rank of a job (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True: tcrun's
 * environment); prints "pid <pid>" first. The moment of death:
 *
 *   tc_die_in_create segment   as soon as its own shared-memory segment
 *                              exists in /dev/shm (inotify): before the
 *                              rank could unlink it; prints "segment" first
 *   tc_die_in_create <max_us>  at a random moment within max_us of start
 *
 * Whatever happens, it never outlives its creation attempt: if it is still
 * alive when tc_comm_create returns (or at the random moment, if later), it
 * kills itself then. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "torchcomms.h"

/* 1 if name is "torchcomms-...-<pid>-<start>" with pid == me. */
static int my_segment(const char *name, long me) {
  if (strncmp(name, "torchcomms-", 11) != 0) return 0;
  const char *end = strrchr(name, '-');
  if (!end || end == name) return 0;
  const char *p = end - 1;
  while (p > name && *p != '-') p--;
  return *p == '-' && strtol(p + 1, NULL, 10) == me && p[1] != '-';
}

static void *watch(void *arg) {
  int fd = (int)(intptr_t)arg;
  long me = (long)getpid();
  char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) continue;
    for (char *p = buf; p < buf + n;) {
      struct inotify_event *e = (struct inotify_event *)p;
      if (e->len && my_segment(e->name, me)) {
        static const char msg[] = "segment\n";
        if (write(1, msg, sizeof msg - 1) < 0) { /* nothing to do */
        }
        kill(getpid(), SIGKILL);
      }
      p += sizeof *e + e->len;
    }
  }
  return NULL;
}

static void *timer(void *arg) {
  long us = (long)(intptr_t)arg;
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL); /* choosing the moment, not synchronising */
  kill(getpid(), SIGKILL);
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "segment";
  printf("pid %ld\n", (long)getpid());
  fflush(stdout);
  pthread_t th;
  int timed = strcmp(mode, "segment") != 0;
  if (!timed) {
    int fd = inotify_init1(IN_CLOEXEC);
    if (fd < 0 || inotify_add_watch(fd, "/dev/shm", IN_CREATE) < 0) {
      perror("tc_die_in_create: inotify on /dev/shm");
      return 2;
    }
    pthread_create(&th, NULL, watch, (void *)(intptr_t)fd);
  } else {
    long max_us = atol(mode);
    srandom((unsigned)getpid() ^ (unsigned)time(NULL));
    long us = max_us > 0 ? random() % (max_us + 1) : 0;
    pthread_create(&th, NULL, timer, (void *)(intptr_t)us);
  }
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = "dieincreate";
  o.timeout_s = 20;
  tc_comm_t *c = NULL;
  (void)tc_comm_create("cpu", "cpu", &o, &c);
  if (timed) pthread_join(th, NULL); /* the timer kills the process */
  kill(getpid(), SIGKILL);
  return 3;
}
