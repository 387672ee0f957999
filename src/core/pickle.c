/* pickle.c -- JSON text to a Python pickle (protocol 2), for the flight
 * recorder's dump files: torch's analyser (torch.distributed.flight_recorder)
 * reads pickles only. The input is the recorder's own JSON (flight.c), so
 * the parser takes well-formed JSON and refuses anything else.
 *
 * Objects become dicts, arrays lists, strings str, whole numbers int (any
 * size up to 64 bits), other numbers float, true/false bool, null None. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *p;
  char *out;
  size_t n, cap;
  int bad;
} pk_t;

static void emit(pk_t *k, const void *b, size_t len) {
  if (k->bad) return;
  if (k->n + len > k->cap) {
    size_t cap = k->cap ? 2 * k->cap : 4096;
    while (cap < k->n + len) cap *= 2;
    char *o = realloc(k->out, cap);
    if (!o) {
      k->bad = 1;
      return;
    }
    k->out = o;
    k->cap = cap;
  }
  memcpy(k->out + k->n, b, len);
  k->n += len;
}

static void op(pk_t *k, unsigned char c) { emit(k, &c, 1); }

static void ws(pk_t *k) {
  while (*k->p == ' ' || *k->p == '\n' || *k->p == '\t' || *k->p == '\r') k->p++;
}

static void put_utf8(char *buf, size_t *n, unsigned cp) {
  if (cp < 0x80) {
    buf[(*n)++] = (char)cp;
  } else if (cp < 0x800) {
    buf[(*n)++] = (char)(0xc0 | (cp >> 6));
    buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else {
    buf[(*n)++] = (char)(0xe0 | (cp >> 12));
    buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
  }
}

static void string(pk_t *k) {
  const char *s = ++k->p; /* after the quote */
  size_t max = 0;
  while (s[max] && s[max] != '"') max += s[max] == '\\' && s[max + 1] ? 2 : 1;
  char *buf = malloc(max * 3 + 1);
  if (!buf) {
    k->bad = 1;
    return;
  }
  size_t n = 0;
  while (*k->p && *k->p != '"') {
    if (*k->p != '\\') {
      buf[n++] = *k->p++;
      continue;
    }
    k->p++;
    char e = *k->p++;
    switch (e) {
    case 'n': buf[n++] = '\n'; break;
    case 't': buf[n++] = '\t'; break;
    case 'r': buf[n++] = '\r'; break;
    case 'b': buf[n++] = '\b'; break;
    case 'f': buf[n++] = '\f'; break;
    case 'u': {
      unsigned cp = 0;
      for (int i = 0; i < 4 && *k->p; i++, k->p++) {
        char h = *k->p;
        cp = cp * 16 + (unsigned)(h >= 'a' ? h - 'a' + 10 : h >= 'A' ? h - 'A' + 10 : h - '0');
      }
      put_utf8(buf, &n, cp);
      break;
    }
    default: buf[n++] = e; break; /* \" \\ \/ */
    }
  }
  if (*k->p != '"') k->bad = 1;
  else k->p++;
  uint32_t len = (uint32_t)n;
  unsigned char hdr[5] = {'X', (unsigned char)len, (unsigned char)(len >> 8),
                          (unsigned char)(len >> 16), (unsigned char)(len >> 24)};
  emit(k, hdr, 5); /* BINUNICODE */
  emit(k, buf, n);
  free(buf);
}

static void number(pk_t *k) {
  char *end;
  const char *s = k->p;
  size_t span = strspn(s, "+-0123456789.eE");
  int is_float = memchr(s, '.', span) || memchr(s, 'e', span) || memchr(s, 'E', span);
  if (is_float) {
    double d = strtod(s, &end);
    uint64_t bits;
    memcpy(&bits, &d, 8);
    unsigned char b[9] = {'G'}; /* BINFLOAT, big-endian */
    for (int i = 0; i < 8; i++) b[1 + i] = (unsigned char)(bits >> (56 - 8 * i));
    emit(k, b, 9);
  } else {
    long long v = strtoll(s, &end, 10);
    if (v >= INT32_MIN && v <= INT32_MAX) {
      uint32_t u = (uint32_t)(int32_t)v;
      unsigned char b[5] = {'J', (unsigned char)u, (unsigned char)(u >> 8),
                            (unsigned char)(u >> 16), (unsigned char)(u >> 24)};
      emit(k, b, 5); /* BININT */
    } else {
      uint64_t u = (uint64_t)v;
      unsigned char b[10] = {0x8a, 8}; /* LONG1, 8 bytes, two's complement */
      for (int i = 0; i < 8; i++) b[2 + i] = (unsigned char)(u >> (8 * i));
      emit(k, b, 10);
    }
  }
  if (end == s) k->bad = 1;
  k->p = end;
}

static void value(pk_t *k, int depth) {
  ws(k);
  if (depth > 32) {
    k->bad = 1;
    return;
  }
  char c = *k->p;
  if (c == '{' || c == '[') {
    int obj = c == '{';
    k->p++;
    op(k, obj ? '}' : ']'); /* EMPTY_DICT / EMPTY_LIST */
    ws(k);
    if (*k->p == (obj ? '}' : ']')) {
      k->p++;
      return;
    }
    op(k, '('); /* MARK */
    for (;;) {
      ws(k);
      if (obj) {
        if (*k->p != '"') {
          k->bad = 1;
          return;
        }
        string(k);
        ws(k);
        if (*k->p++ != ':') {
          k->bad = 1;
          return;
        }
      }
      value(k, depth + 1);
      if (k->bad) return;
      ws(k);
      if (*k->p == ',') {
        k->p++;
        continue;
      }
      if (*k->p == (obj ? '}' : ']')) {
        k->p++;
        break;
      }
      k->bad = 1;
      return;
    }
    op(k, obj ? 'u' : 'e'); /* SETITEMS / APPENDS */
  } else if (c == '"') {
    string(k);
  } else if (!strncmp(k->p, "true", 4)) {
    op(k, 0x88);
    k->p += 4;
  } else if (!strncmp(k->p, "false", 5)) {
    op(k, 0x89);
    k->p += 5;
  } else if (!strncmp(k->p, "null", 4)) {
    op(k, 'N');
    k->p += 4;
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    number(k);
  } else {
    k->bad = 1;
  }
}

int tc__json_to_pickle(const char *json, char **out, size_t *len) {
  pk_t k = {.p = json};
  static const unsigned char proto[2] = {0x80, 2};
  emit(&k, proto, 2);
  value(&k, 0);
  op(&k, '.'); /* STOP */
  ws(&k);
  if (k.bad || *k.p) {
    free(k.out);
    return TC_ERR_INVALID_ARGUMENT;
  }
  *out = k.out;
  *len = k.n;
  return TC_OK;
}
