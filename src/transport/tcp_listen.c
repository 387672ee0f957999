/* tcp_listen.c -- the accepting side of the TCP mesh setup (tcp_listen.h):
 * hello encoding and parsing, the listening socket bound to the one address
 * this rank publishes (TORCHCOMMS_CPU_IFNAME picks an interface), and the
 * log of refused connections: the first from each source logged, the rest
 * counted and reported once. */
#include "transport/tcp_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- hello ---- */

void tc__tcp_put_hello(unsigned char *b, int rank, int size, uint32_t epoch,
                       const unsigned char tok[16]) {
  uint32_t m = TC__TCP_HELLO_MAGIC, v = TC__TCP_HELLO_VERSION;
  int32_t r = rank, n = size;
  memcpy(b, &m, 4);
  memcpy(b + 4, &v, 4);
  memcpy(b + 8, &r, 4);
  memcpy(b + 12, &n, 4);
  memcpy(b + 16, tok, 16);
  memcpy(b + 32, &epoch, 4);
}

int tc__tcp_parse_hello(const unsigned char *b, size_t len, int size, uint32_t epoch,
                        const unsigned char tok[16], const char **why) {
  uint32_t m, v, e;
  int32_t r, n;
  if (len < TC__TCP_HELLO_BYTES) {
    *why = "a truncated hello";
    return -1;
  }
  memcpy(&m, b, 4);
  memcpy(&v, b + 4, 4);
  memcpy(&r, b + 8, 4);
  memcpy(&n, b + 12, 4);
  memcpy(&e, b + 32, 4);
  if (m != TC__TCP_HELLO_MAGIC)
    *why = "no torchcomms hello (a port scan or another program?)";
  else if (v != TC__TCP_HELLO_VERSION)
    *why = "a hello of another protocol version (a different torchcomms?)";
  else if (n != size)
    *why = "a hello for another world size (another job or communicator?)";
  else if (e != epoch)
    *why = "a hello of another configuration (epoch) of this communicator (a late "
           "connection of a dead epoch)";
  else if (memcmp(b + 16, tok, 16) != 0)
    *why = "a wrong token (another job or communicator?)";
  else if (r < 0 || r >= size)
    *why = "a hello naming a rank out of range";
  else
    return r;
  return -1;
}

/* ---- the listening address ---- */

/* Formats the address of an interface into buf. */
static void ifa_text(const struct ifaddrs *i, char *buf, size_t len) {
  if (i->ifa_addr->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)i->ifa_addr)->sin_addr,
              buf, (socklen_t)len);
  else
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
              buf, (socklen_t)len);
}

int tc__tcp_pick_addr(const char *advertise, char *addr, size_t len,
                      char *err, size_t errlen) {
  const char *ifname = tc__setting_str(TC_SET_CPU_IFNAME);
  if (!ifname) {
    snprintf(addr, len, "%s",
             advertise && *advertise ? advertise : "127.0.0.1");
    return TC_OK;
  }
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all) != 0) {
    snprintf(err, errlen, "TORCHCOMMS_CPU_IFNAME=%s: getifaddrs failed: %s",
             ifname, strerror(errno));
    return TC_ERR_SYSTEM;
  }
  const struct ifaddrs *v4 = NULL, *v6 = NULL;
  char names[256] = "";
  for (const struct ifaddrs *i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET &&
                         i->ifa_addr->sa_family != AF_INET6))
      continue;
    if (!strstr(names, i->ifa_name) && strlen(names) + strlen(i->ifa_name) + 3 <
                                           sizeof names) {
      if (names[0]) strcat(names, ", ");
      strcat(names, i->ifa_name);
    }
    if (strcmp(i->ifa_name, ifname)) continue;
    if (i->ifa_addr->sa_family == AF_INET && !v4) v4 = i;
    if (i->ifa_addr->sa_family == AF_INET6 && !v6 &&
        !IN6_IS_ADDR_LINKLOCAL(
            &((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
      v6 = i;
  }
  int rc = TC_OK;
  if (v4 || v6) {
    ifa_text(v4 ? v4 : v6, addr, len);
  } else {
    snprintf(err, errlen, "TORCHCOMMS_CPU_IFNAME=%s names no interface with "
             "an IPv4 or a global IPv6 address (interfaces with addresses: "
             "%s); set it to one of them, or unset it to use the advertise "
             "address", ifname, names[0] ? names : "none");
    rc = TC_ERR_INVALID_ARGUMENT;
  }
  freeifaddrs(all);
  return rc;
}

/* Listens on an ephemeral port of every interface (dual stack if
 * possible); the fd or -1 (errno set). */
static int listen_any(int backlog) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        listen(fd, backlog) == 0)
      return fd;
    close(fd);
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      listen(fd, backlog) == 0)
    return fd;
  int e = errno;
  close(fd);
  errno = e;
  return -1;
}

int tc__tcp_listen_on(const char *addr, int backlog, int *fdp, int *port,
                      int *everywhere, char *err, size_t errlen) {
  *everywhere = 0;
  char host[256];
  snprintf(host, sizeof host, "%s", addr);
  size_t hl = strlen(host);
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') { /* [v6] */
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *res = NULL;
  int g = getaddrinfo(host, "0", &hints, &res);
  if (g != 0) {
    snprintf(err, errlen, "cannot resolve its advertise address '%s': %s "
             "(set TORCHCOMMS_SOCKET_ADDR or TORCHCOMMS_CPU_IFNAME)", host,
             gai_strerror(g));
    return TC_ERR_INVALID_ARGUMENT;
  }
  int fd = -1, e = EADDRNOTAVAIL, naddr = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) naddr++;
  /* a name of several addresses: peers may reach any of them */
  for (struct addrinfo *ai = naddr == 1 ? res : NULL; ai && fd < 0;
       ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      e = errno;
      continue;
    }
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
      break;
    e = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0 && e == EADDRNOTAVAIL) { /* not ours (a NAT's?), or several */
    fd = listen_any(backlog);
    e = errno;
    *everywhere = fd < 0 ? 0 : naddr == 1 ? 1 : 2;
  }
  if (fd < 0) {
    snprintf(err, errlen, "could not listen on %s: %s", host, strerror(e));
    return TC_ERR_SYSTEM;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
    e = errno;
    close(fd);
    snprintf(err, errlen, "getsockname failed: %s", strerror(e));
    return TC_ERR_SYSTEM;
  }
  *port = ntohs(ss.ss_family == AF_INET6
                    ? ((struct sockaddr_in6 *)&ss)->sin6_port
                    : ((struct sockaddr_in *)&ss)->sin_port);
  *fdp = fd;
  return TC_OK;
}

/* ---- refused connections ---- */

void tc__tcp_refused(tc__tcp_refusals_t *r, const tc_backend_host_t *host,
                     const char *who, const char *ip, const char *why) {
  r->total++;
  for (int i = 0; i < r->nsrc; i++) {
    if (strcmp(r->src[i].ip, ip)) continue;
    r->src[i].n++;
    return;
  }
  if (r->nsrc == TC__TCP_REFUSAL_SOURCES) {
    if (r->other++ == 0)
      TC_BACKEND_LOGS(host, TC_LOG_WARN, TC_LOG_TCP,
                      "%s: refused a connection from %s: %s (more than %d sources "
                      "refused: the others are counted together)", who, ip, why,
                      TC__TCP_REFUSAL_SOURCES);
    return;
  }
  int i = r->nsrc++;
  snprintf(r->src[i].ip, sizeof r->src[i].ip, "%s", ip);
  snprintf(r->src[i].first, sizeof r->src[i].first, "%s", why);
  r->src[i].n = 1;
  TC_BACKEND_LOGS(host, TC_LOG_WARN, TC_LOG_TCP,
                  "%s: refused a connection from %s: %s (further refusals from %s are "
                  "counted and reported when the communicator %s)", who, ip, why,
                  ip, r->at_close ? "closes" : "is set up");
}

void tc__tcp_refusals_report(const tc__tcp_refusals_t *r,
                             const tc_backend_host_t *host, const char *who) {
  for (int i = 0; i < r->nsrc; i++)
    if (r->src[i].n > 1)
      TC_BACKEND_LOGS(host, TC_LOG_WARN, TC_LOG_TCP,
                      "%s: refused %lu connections from %s %s (the "
                      "first: %s)", who, r->src[i].n, r->src[i].ip,
                      r->at_close ? "while listening" : "while setting up", r->src[i].first);
  if (r->other > 1)
    TC_BACKEND_LOGS(host, TC_LOG_WARN, TC_LOG_TCP,
                    "%s: refused %lu connections from %lu+ other sources %s", who, r->other,
                    (unsigned long)TC__TCP_REFUSAL_SOURCES,
                    r->at_close ? "while listening" : "while setting up");
}
