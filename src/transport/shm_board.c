/* shm_board.c -- small shared-memory areas outside the transport: the
 * core's status board (src/core/hang.c), one per communicator, made by its
 * rank 0 and mapped by the ranks on the same host.
 *
 * The name follows the transport's segments (shm_sweep.c), so a board whose
 * maker died before unlinking it is swept like any segment; the maker
 * unlinks it once every rank has mapped it. */
#include "transport/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

int tc__shm_area_create(const char *tag, size_t bytes, char *name, size_t len, void **mem) {
  unsigned char token[16];
  size_t got = 0;
  while (got < sizeof token) {
    ssize_t k = getrandom(token + got, sizeof token - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return TC_ERR_SYSTEM;
    got += (size_t)k;
  }
  tc_shm_owner_t me;
  tc__shm_owner_self(&me);
  tc__shm_name(name, len, tag, token, 0, &me);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return TC_ERR_SYSTEM;
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)bytes) == 0)
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return TC_ERR_SYSTEM;
  }
  *mem = p;
  return TC_OK;
}

int tc__shm_area_open(const char *name, size_t bytes, void **mem) {
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return TC_ERR_SYSTEM; /* another host, or another namespace */
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size >= bytes)
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return TC_ERR_SYSTEM;
  *mem = p;
  return TC_OK;
}

void tc__shm_area_unlink(const char *name) { shm_unlink(name); }

void tc__shm_area_unmap(void *mem, size_t bytes) {
  if (mem) munmap(mem, bytes);
}
