/* die_in_create.c -- a rank that is SIGKILLed while creating a communicator,
 * for the "no leftovers" tests (tests/c/test_shm_leftovers.c,
 * tests/c/test_tcrun.c). Run as one rank of a job (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True: tcrun's
 * environment); prints "pid <pid>" first. The moment of death:
 *
 *   tc_die_in_create segment   as soon as its own shared-memory segment
 *                              exists in /dev/shm (see shm_open below),
 *                              before the rank could unlink it; prints
 *                              "segment" first
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
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "torchcomms.h"

/* The library's shm_open resolves to this one (a definition in the program
 * wins over libc's): it creates the name as glibc does, and in "segment"
 * mode the process dies right after creating its own segment, before it
 * could be unlinked -- deterministically, whatever the scheduling. */
static int die_at_segment;

int shm_open(const char *name, int oflag, mode_t mode) {
  char path[512];
  snprintf(path, sizeof path, "/dev/shm/%s", name[0] == '/' ? name + 1 : name);
  int fd = open(path, oflag | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd >= 0 && (oflag & O_CREAT) && die_at_segment) {
    static const char msg[] = "segment\n";
    if (write(1, msg, sizeof msg - 1) < 0) { /* nothing to do */
    }
    kill(getpid(), SIGKILL);
  }
  return fd;
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
    die_at_segment = 1;
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
  if (tc_comm_create("cpu", "cpu", &o, &c) != TC_OK)
    fprintf(stderr, "tc_die_in_create: %s\n", tc_last_error());
  if (timed) pthread_join(th, NULL); /* the timer kills the process */
  kill(getpid(), SIGKILL);
  return 3;
}
