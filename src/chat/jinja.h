/* Internal interface of the Jinja subset interpreter that renders chat templates: values, the
 * lexer's tokens, the parser's syntax tree and the evaluator's entry points. Semantics follow
 * Jinja2 as transformers configures it (trim_blocks, lstrip_blocks, loopcontrols, its tojson).
 * Everything a render allocates lives in one arena freed when the render ends. */
#ifndef DI_CHAT_JINJA_H
#define DI_CHAT_JINJA_H
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "util/status.h"

/* ---- arena ---------------------------------------------------------------------------------- */
typedef struct jj_arena_block jj_arena_block;
typedef struct jj_arena {
  jj_arena_block *head;
  size_t used_total;  /* bytes handed out, for the memory limit */
  size_t limit;       /* 0: none */
  int failed;         /* set when an allocation failed or passed the limit */
} jj_arena;
void *jj_alloc(jj_arena *a, size_t n); /* zeroed; NULL on failure (a->failed set) */
void jj_arena_free(jj_arena *a);

/* ---- values --------------------------------------------------------------------------------- */
typedef enum {
  JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC, JV_LOOP
} jv_kind;

typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
typedef struct jv_func jv_func;
typedef struct jv_loop jv_loop;

typedef struct jv {
  uint8_t kind;
  uint8_t tuple; /* JV_LIST: JV_SEQ_LIST, JV_SEQ_TUPLE, or JV_SEQ_ITER (a generator or iterator, as
                   Jinja's map/select/unique/items/reverse filters return: always true, no len(),
                   no subscripts, not JSON) */
  union {
    int64_t i;   /* JV_INT, JV_BOOL */
    double f;
    struct { const char *p; size_t n; } s; /* JV_STR (UTF-8, not NUL-terminated); JV_UNDEF: its name */
    jv_list *l;
    jv_dict *d;  /* JV_DICT, JV_NS */
    jv_func *fn;
    jv_loop *loop; /* JV_LOOP: a for loop's `loop` variable */
  } u;
} jv;

struct jv_list {
  size_t n, cap;
  jv *v;
  const char *err; /* JV_SEQ_ITER: the error consuming this generator raises (Jinja filters are lazy) */
  int64_t start, stop, step; /* JV_SEQ_RANGE */
};
/* JV_LIST flavours (jv.tuple): Python's list, tuple, generator/iterator, dict views and range. */
enum {
  JV_SEQ_LIST = 0, JV_SEQ_TUPLE = 1, JV_SEQ_ITER = 2,
  JV_SEQ_ITEMS = 3, JV_SEQ_KEYS = 4, JV_SEQ_VALUES = 5, /* dict.items()/keys()/values() */
  JV_SEQ_RANGE = 6                                      /* range(start, stop, step) */
};
/* Supports x[i] and slicing (list, tuple, range). */
static inline int jv_subscriptable(jv v) {
  return v.kind == JV_LIST && (v.tuple == JV_SEQ_LIST || v.tuple == JV_SEQ_TUPLE || v.tuple == JV_SEQ_RANGE);
}
struct jv_dict { size_t n, cap; jv *k, *v; };
struct jv_loop { int64_t i, n; const jv_list *items; };

static inline jv jv_undef(void) { jv r = {0}; r.kind = JV_UNDEF; return r; }
static inline jv jv_none(void) { jv r = {0}; r.kind = JV_NONE; return r; }
static inline jv jv_bool(int b) { jv r = {0}; r.kind = JV_BOOL; r.u.i = b ? 1 : 0; return r; }
static inline jv jv_int(int64_t i) { jv r = {0}; r.kind = JV_INT; r.u.i = i; return r; }
static inline jv jv_float(double f) { jv r = {0}; r.kind = JV_FLOAT; r.u.f = f; return r; }
static inline jv jv_strn(const char *p, size_t n) { jv r = {0}; r.kind = JV_STR; r.u.s.p = p; r.u.s.n = n; return r; }

/* A growable byte buffer (malloc'd, for the output and for string building in the arena). */
/* failed: a put did not fit (the limit, or realloc); over_limit: it was the limit (a render's output
 * over its max_output is then DI_ERR_CONTEXT_OVERFLOW, not out of memory) */
typedef struct jj_buf { char *p; size_t n, cap; int failed; size_t limit; int over_limit; } jj_buf;
void jj_buf_put(jj_buf *b, const char *s, size_t n);
void jj_buf_puts(jj_buf *b, const char *s);
void jj_buf_putc(jj_buf *b, char c);
void jj_buf_printf(jj_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jj_buf_free(jj_buf *b);

jv_list *jj_list_new(jj_arena *a, size_t cap);
int jj_list_push(jj_arena *a, jv_list *l, jv v);
jv_dict *jj_dict_new(jj_arena *a, size_t cap);
int jj_dict_set(jj_arena *a, jv_dict *d, jv k, jv v);
jv *jj_dict_get(const jv_dict *d, jv k);
jv *jj_dict_gets(const jv_dict *d, const char *k, size_t n);
jv jj_str_dup(jj_arena *a, const char *p, size_t n); /* JV_STR copied into the arena */

int jj_truthy(jv v);
int jj_equal(jv a, jv b);
const char *jj_kind_name(jv v); /* Python type name: "str", "int", "list", ... */
/* str(v) as Python/Jinja print it: appends to `b`. Undefined prints nothing. */
void jj_to_str(jj_buf *b, jv v);
/* repr(v) in Python's spelling. */
void jj_repr(jj_buf *b, jv v);
void jj_float_repr(jj_buf *b, double f);
/* json.dumps(v, ensure_ascii, indent (<0: none, or indent_str), separators, sort_keys). Returns 0
 * on success, -1 when a value is not JSON serializable (sets *bad to its type name). */
typedef struct jj_json_opts {
  int ensure_ascii, sort_keys;
  const char *indent; /* NULL: no indent */
  const char *item_sep, *key_sep;
} jj_json_opts;
int jj_to_json(jj_buf *b, jv v, const jj_json_opts *o, int depth, const char **bad);
/* Converts a cJSON tree into values in the arena. */
jv jj_from_cjson(jj_arena *a, const cJSON *j);

/* UTF-8 helpers (lenient: an invalid byte counts as one code point). */
size_t jj_utf8_len(const char *p, size_t n);
uint32_t jj_utf8_next(const char *p, size_t n, size_t *i);
void jj_utf8_put(jj_buf *b, uint32_t cp);
int jj_py_isspace(uint32_t cp);

/* ---- lexer ------------------------------------------------------------------------------------ */
typedef enum {
  TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
  TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP, TK_EOF
} jj_tok_type;

typedef struct jj_tok {
  uint8_t type;
  char op[3];        /* TK_OP: the operator, NUL-terminated */
  int line, col;
  const char *p;     /* TEXT, NAME, STRING (decoded): bytes */
  size_t n;
  int64_t i;
  double f;
} jj_tok;

/* Tokenizes `src` (normalizing newlines, dropping one trailing newline, applying trim_blocks,
 * lstrip_blocks and whitespace control). Tokens and decoded strings live in `a`. */
di_status jj_lex(jj_arena *a, const char *src, size_t len, jj_tok **toks, size_t *ntoks);

/* ---- syntax tree ------------------------------------------------------------------------------ */
typedef enum {
  /* statements */
  N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BLOCK,
  N_WITH, N_FILTER_BLOCK, N_CALL_BLOCK,
  /* expressions */
  E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
  E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BINOP, E_COMPARE, E_COND, E_CONCAT,
  E_STAR, E_DSTAR /* *args and **kwargs in a call's arguments */
} jn_kind;

typedef enum {
  OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
} jn_op;

typedef struct jnode jnode;
typedef struct jn_list { jnode **v; int n, cap; } jn_list;

struct jnode {
  uint8_t kind, op, negated; /* negated: E_TEST "is not"; N_MACRO op: uses varargs 1, kwargs 2 */
  int line, col;
  const char *name;         /* NAME, ATTR, FILTER/TEST/MACRO name, TEXT bytes */
  size_t name_len;
  jv val;                   /* E_CONST */
  jnode *a, *b, *c;            /* operands / target / iterable / condition */
  jn_list list;             /* items, positional args, body */
  jn_list list2;            /* else body, keyword-argument values, macro defaults */
  const char **kwnames;     /* keyword-argument names (NUL-terminated, arena) */
  uint8_t *ops;             /* E_COMPARE: operator of each operand in `list` */
};

typedef struct jj_template {
  jj_arena arena;  /* tokens, tree, constants */
  jn_list body;
} jj_template;

/* Parses a template. On failure the message names the construct and its line and column. */
di_status jj_parse(const char *src, size_t len, jj_template **out);
void jj_template_free(jj_template *t);

/* ---- evaluation ------------------------------------------------------------------------------- */
/* How a render runs: its limits (zero: the default) and its clock. */
typedef struct jj_render_options {
  size_t max_memory;  /* arena bytes; 0: default 256 MiB */
  size_t max_output;  /* 0: default 64 MiB */
  uint64_t max_steps; /* evaluation steps; 0: default 50 million */
  /* The render's clock: when clock_pinned, strftime_now() formats the instant pinned_now (Unix
   * seconds) in UTC instead of reading the local clock, so that a render is reproducible (tests,
   * goldens); users keep the real clock. */
  int clock_pinned;
  int64_t pinned_now;
} jj_render_options;

/* The variables a render starts from, in the arena the render then uses (jinja_json.c). */
typedef struct jj_vars {
  jj_arena arena;
  jv_dict *d;
} jj_vars;
di_status jj_vars_init(jj_vars *v);
void jj_vars_free(jj_vars *v);
di_status jj_vars_set(jj_vars *v, const char *name, jv val); /* replaces an existing name */
di_status jj_vars_set_cjson(jj_vars *v, const char *name, const cJSON *j);
/* JSON text to a value with Python's json.loads semantics ("3" int, "3.0" float). */
di_status jj_json_parse(jj_arena *a, const char *text, size_t n, const char *what, jv *out);

/* Renders with `vars` (consumed: their arena holds the render's values; free them after). *out is
 * malloc'd and NUL-terminated. */
di_status jj_render_vars(const jj_template *t, jj_vars *vars, const jj_render_options *opt, char **out,
                         size_t *len);
/* The same with the members of a cJSON object as the variables (NULL: none). */
di_status jj_render(const jj_template *t, const cJSON *vars, const jj_render_options *opt, char **out,
                    size_t *len);

/* Builtins (jinja_builtins.c), called by the evaluator. */
struct jj_ctx;
typedef struct jj_args {
  int n;            /* positional */
  const jv *v;
  int nkw;          /* keyword */
  const char **kwn;
  const jv *kwv;
} jj_args;
int jj_filter_exists(const char *name, size_t n);
int jj_test_exists(const char *name, size_t n);
di_status jj_call_filter(struct jj_ctx *c, const jnode *at, const char *name, jv self, const jj_args *args, jv *out);
di_status jj_call_test(struct jj_ctx *c, const jnode *at, const char *name, jv self, const jj_args *args, int *out);
/* Looks up `obj.name` as a method; returns 1 and a bound method value when `obj` has one. */
int jj_method_lookup(struct jj_ctx *c, jv obj, const char *name, size_t n, jv *out);
/* Global functions: range, namespace, dict, raise_exception, strftime_now. */
int jj_global_lookup(const char *name, size_t n, jv *out);

/* Function values: builtin methods (bound to `self`), global functions, macros, loop.cycle. */
typedef enum { FN_METHOD, FN_GLOBAL, FN_MACRO, FN_CYCLE } jj_fn_type;
struct jv_func {
  uint8_t type;
  const char *name;
  jv self;              /* FN_METHOD: the bound object; FN_CYCLE: the loop index (int) */
  const jnode *macro;      /* FN_MACRO */
  void *closure;        /* FN_MACRO: the defining frame */
};
di_status jj_call_method(struct jj_ctx *c, const jnode *at, const jv_func *fn, const jj_args *args, jv *out);
di_status jj_call_global(struct jj_ctx *c, const jnode *at, const jv_func *fn, const jj_args *args, jv *out);

/* Error helpers used by the evaluator and builtins: set the thread error with "chat template line
 * L column C: " and return `st`. */
di_status jj_err(struct jj_ctx *c, const jnode *at, di_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
jj_arena *jj_ctx_arena(struct jj_ctx *c);
/* fmt % args, Python's printf-style formatting (jinja_format.c). */
di_status jj_format(struct jj_ctx *c, const jnode *at, jv fmt, jv args, jv *out);
size_t jj_ctx_out_limit(struct jj_ctx *c); /* the render's output limit, for temporary strings */
/* The render's "now" for strftime_now(): local time, or the pinned instant in UTC. 0 on failure. */
struct tm;
int jj_ctx_now(struct jj_ctx *c, struct tm *tmv);
#endif
