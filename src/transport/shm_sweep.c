/* shm_sweep.c -- names of shared-memory segments, and the removal of those
 * whose creator died before it could unlink them.
 *
 * A rank unlinks its segment's name as soon as every rank has mapped it
 * (shm_setup.c); until then only the name keeps it in /dev/shm. A rank
 * killed in that window (all ranks killed during creation, say) leaves its
 * name behind, with its memory. So every name says who made it:
 *
 *   /torchcomms-<comm hash>-<token>-<rank>-<pid ns>-<pid>-<start>
 *
 * (pid ns: the inode of the creator's pid namespace, hex; start: its start
 * time in clock ticks since boot, from /proc/<pid>/stat, which tells a
 * reused pid from the creator). tc__shm_sweep removes every such name whose
 * creator is dead: no process with that pid, a zombie, or another process
 * under a reused pid. Names made in another pid namespace, or whose creator
 * cannot be checked (no /proc, another user's process), are left alone.
 *
 * Who sweeps: every rank that sets up shared memory, before it creates its
 * own segment (the next job on the host cleans up after the last; setting
 * TORCHCOMMS_SHM_SWEEP=0 turns this off), and tcrun once all its ranks have
 * exited (tools/tcrun.c), so a job it ran leaves nothing even when every
 * rank was killed. Sockets need no such care: the kernel closes them with
 * the process, and listening ports are ephemeral. */
#include "transport/shm_internal.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm" /* where glibc keeps shm_open's names */

/* State and start time (field 22) of /proc/<pid>/stat; -1 if unreadable. */
static int proc_stat(long pid, char *state, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the command name may hold anything */
  unsigned long long st = 0;
  /* after ") ": state (3), then fields 4..21, then starttime (22) */
  if (!p || sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                   "%*s %*s %*s %*s %llu", state, &st) != 2)
    return -1;
  *start = st;
  return 0;
}

static uint64_t pid_ns(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

void tc__shm_owner_self(tc_shm_owner_t *o) {
  char state;
  memset(o, 0, sizeof *o);
  o->pid = (int32_t)getpid();
  if (proc_stat(o->pid, &state, &o->start) != 0) o->start = 0;
  o->pidns = pid_ns();
}

void tc__shm_name(char *buf, size_t len, const char *comm, const unsigned char token[16],
                  int rank, const tc_shm_owner_t *o) {
  uint32_t h = 2166136261u; /* FNV-1a of the communicator's name */
  for (const char *p = comm; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  char tok[33];
  for (int i = 0; i < 16; i++) snprintf(tok + 2 * i, 3, "%02x", token[i]);
  snprintf(buf, len, "/" SHM_NAME_PREFIX "%08x-%s-%d-%llx-%ld-%llu", h, tok, rank,
           (unsigned long long)o->pidns, (long)o->pid, (unsigned long long)o->start);
}

int tc__shm_name_owner(const char *name, tc_shm_owner_t *o) {
  if (name[0] == '/') name++;
  unsigned h;
  char tok[33];
  int rank, used = -1;
  unsigned long long ns, start;
  long pid;
  if (strncmp(name, SHM_NAME_PREFIX, strlen(SHM_NAME_PREFIX)) != 0 ||
      sscanf(name + strlen(SHM_NAME_PREFIX), "%8x-%32[0-9a-f]-%d-%llx-%ld-%llu%n", &h, tok,
             &rank, &ns, &pid, &start, &used) != 6 ||
      name[strlen(SHM_NAME_PREFIX) + (size_t)used] != 0 || pid <= 0 || pid > INT32_MAX)
    return -1;
  memset(o, 0, sizeof *o);
  o->pid = (int32_t)pid;
  o->start = start;
  o->pidns = ns;
  return 0;
}

/* 1 if the creator o is certainly gone (see the top of the file). */
static int owner_dead(const tc_shm_owner_t *o, uint64_t my_ns) {
  if (o->pidns != my_ns || o->pid == (int32_t)getpid()) return 0;
  if (kill(o->pid, 0) != 0) return errno == ESRCH;
  char state;
  uint64_t start;
  if (proc_stat(o->pid, &state, &start) != 0) return 0; /* cannot tell */
  if (o->start && start != o->start) return 1;          /* pid reused */
  return state == 'Z' || state == 'X';                  /* exited, not reaped */
}

int tc__shm_owner_gone(const tc_shm_owner_t *o) { return owner_dead(o, pid_ns()); }

int tc__shm_sweep(void) {
  DIR *d = opendir(SHM_DIR);
  if (!d) return 0;
  uint64_t ns = pid_ns();
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    tc_shm_owner_t o;
    if (tc__shm_name_owner(e->d_name, &o) != 0 || !owner_dead(&o, ns)) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) removed++; /* ENOENT: another sweeper was first */
  }
  closedir(d);
  return removed;
}
