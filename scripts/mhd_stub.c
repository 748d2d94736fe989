/* A stand-in libmicrohttpd.so.12 for device runs that never serve HTTP (scripts/pack_ep_request.sh: a
 * device request is capped at 6 MB and the real library pulls in GnuTLS). Every entry point fails. */
#include <stddef.h>
void *MHD_start_daemon(unsigned f, unsigned short p, ...) { (void)f; (void)p; return NULL; }
void MHD_stop_daemon(void *d) { (void)d; }
int MHD_quiesce_daemon(void *d) { (void)d; return -1; }
int MHD_add_response_header(void *r, const char *h, const char *v) { (void)r; (void)h; (void)v; return 0; }
void *MHD_create_response_from_buffer(size_t n, void *b, int m) { (void)n; (void)b; (void)m; return NULL; }
void *MHD_create_response_from_callback(unsigned long long s, size_t b, void *c, void *x, void *f) { (void)s; (void)b; (void)c; (void)x; (void)f; return NULL; }
void MHD_destroy_response(void *r) { (void)r; }
const void *MHD_get_connection_info(void *c, int k, ...) { (void)c; (void)k; return NULL; }
int MHD_get_connection_values(void *c, int k, void *i, void *x) { (void)c; (void)k; (void)i; (void)x; return 0; }
int MHD_queue_response(void *c, unsigned s, void *r) { (void)c; (void)s; (void)r; return 0; }
void MHD_resume_connection(void *c) { (void)c; }
void MHD_suspend_connection(void *c) { (void)c; }
