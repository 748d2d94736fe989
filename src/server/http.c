/* The request view and the response header-line splitter (http.h). */
#include "server/http.h"
#include <string.h>
#include <strings.h>

const char *di_http_header_get(const di_http_request *req, const char *name, size_t *len) {
  size_t n = strlen(name);
  for (int i = 0; i < req->n_headers; i++)
    if (req->headers[i].name_len == n && strncasecmp(req->headers[i].name, name, n) == 0) {
      if (len) *len = req->headers[i].value_len;
      return req->headers[i].value;
    }
  return NULL;
}

static int is_tchar(unsigned char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
  return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

int di_http_next_header_line(const char **p, const char **name, size_t *name_len, const char **value,
                             size_t *value_len) {
  const char *s = *p;
  while (s && *s) {
    const char *end = strstr(s, "\r\n");
    const char *next = end ? end + 2 : s + strlen(s);
    if (!end) end = next;
    const char *colon = memchr(s, ':', (size_t)(end - s));
    int ok = colon && colon > s;
    for (const char *q = s; ok && q < colon; q++) ok = is_tchar((unsigned char)*q);
    const char *v = colon ? colon + 1 : end, *ve = end;
    while (v < ve && (*v == ' ' || *v == '\t')) v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
    for (const char *q = v; ok && q < ve; q++) ok = !(((unsigned char)*q < 0x20 && *q != '\t') || *q == 0x7f);
    if (ok) {
      *name = s;
      *name_len = (size_t)(colon - s);
      *value = v;
      *value_len = (size_t)(ve - v);
      *p = next;
      return 1;
    }
    s = next;
  }
  *p = s;
  return 0;
}
