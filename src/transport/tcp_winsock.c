/* tcp_winsock.c -- the sockets of the cpu backend's one-sided window service
 * (tcp.h): a listener on the address this rank publishes, blocking
 * connects and exact reads / writes with a deadline and an abort fd. */
#include "transport/tcp.h"
#include "transport/tcp_listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int tc__winsock_listen(const char *advertise, int *fd, int *port, char *addr, size_t alen,
                       char *err, size_t errlen) {
  int rc = tc__tcp_pick_addr(advertise, addr, alen, err, errlen);
  if (rc != TC_OK) return rc;
  int everywhere = 0;
  return tc__tcp_listen_on(addr, 256, fd, port, &everywhere, err, errlen);
}

/* Waits for fd to be ready for `events` before deadline, or wake_fd. */
static int ws_wait(int fd, short events, double deadline, int wake_fd, char *err, size_t errlen) {
  for (;;) {
    double left = deadline - tc__now();
    if (left <= 0) {
      snprintf(err, errlen, "timed out");
      return TC_ERR_TIMEOUT;
    }
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = wake_fd, .events = POLLIN}};
    int n = poll(p, wake_fd >= 0 ? 2 : 1, left > 0.25 ? 250 : (int)(left * 1000) + 1);
    if (n < 0 && errno != EINTR) {
      snprintf(err, errlen, "poll: %s", strerror(errno));
      return TC_ERR_SYSTEM;
    }
    if (n > 0 && wake_fd >= 0 && (p[1].revents & POLLIN)) {
      snprintf(err, errlen, "communicator was aborted");
      return TC_ERR_ABORTED;
    }
    if (n > 0 && p[0].revents) return TC_OK;
  }
}

int tc__winsock_connect(const char *addr, int port, double deadline, int wake_fd, int *fdp,
                        char *err, size_t errlen) {
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
  int g = getaddrinfo(addr, ps, &hints, &res);
  if (g != 0) {
    snprintf(err, errlen, "cannot resolve %s: %s", addr, gai_strerror(g));
    return TC_ERR_SYSTEM;
  }
  int rc = TC_ERR_SYSTEM;
  snprintf(err, errlen, "no address of %s", addr);
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r < 0 && errno == EINPROGRESS) {
      rc = ws_wait(fd, POLLOUT, deadline, wake_fd, err, errlen);
      if (rc == TC_OK) {
        int e = 0;
        socklen_t el = sizeof e;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
        if (e) {
          snprintf(err, errlen, "connect to %s:%d: %s", addr, port, strerror(e));
          rc = TC_ERR_SYSTEM;
        }
      }
    } else if (r < 0) {
      snprintf(err, errlen, "connect to %s:%d: %s", addr, port, strerror(errno));
      rc = TC_ERR_SYSTEM;
    } else {
      rc = TC_OK;
    }
    if (rc == TC_OK) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *fdp = fd; /* stays non-blocking: tc__winsock_io polls */
      freeaddrinfo(res);
      return TC_OK;
    }
    close(fd);
    if (rc == TC_ERR_TIMEOUT || rc == TC_ERR_ABORTED) break;
  }
  freeaddrinfo(res);
  return rc;
}

int tc__winsock_io(int fd, int is_send, void *buf, size_t len, double deadline, int wake_fd,
                   char *err, size_t errlen) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = is_send ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0 && !is_send) {
      snprintf(err, errlen, "closed its connection");
      return TC_ERR_REMOTE;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = ws_wait(fd, is_send ? POLLOUT : POLLIN, deadline, wake_fd, err, errlen);
      if (rc != TC_OK) return rc;
      continue;
    }
    int e = n < 0 ? errno : EPIPE;
    snprintf(err, errlen, "%s", e == ECONNRESET || e == EPIPE ? "reset its connection (process killed?)"
                                                              : strerror(e));
    return TC_ERR_REMOTE;
  }
  return TC_OK;
}
