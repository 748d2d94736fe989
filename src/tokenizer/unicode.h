/* Unicode helpers for the tokenizer: UTF-8 decoding/encoding, the lossy UTF-8 repair both encode
 * (invalid input) and decode (byte tokens) use, White_Space, normalization forms (NFC, NFD, NFKC,
 * NFKD) and per-character lowercase. Data tables live in unicode_tables.c (generated). */
#ifndef DI_TOKENIZER_UNICODE_H
#define DI_TOKENIZER_UNICODE_H
#include <stddef.h>
#include <stdint.h>
#include "tokenizer/buf.h"

typedef struct { uint32_t cp; uint8_t ccc; } di_uc_ccc;
typedef struct { uint32_t cp; uint32_t off; uint32_t len; } di_uc_map;
typedef struct { uint32_t a, b, c; } di_uc_pair;

extern const di_uc_ccc di_uc_ccc_table[];
extern const size_t di_uc_ccc_count;
extern const di_uc_map di_uc_canon_table[], di_uc_compat_table[], di_uc_lower_table[];
extern const size_t di_uc_canon_count, di_uc_compat_count, di_uc_lower_count;
extern const uint32_t *const di_uc_canon_seq, *const di_uc_compat_seq, *const di_uc_lower_seq;
extern const di_uc_pair di_uc_pair_table[];
extern const size_t di_uc_pair_count;
extern const uint32_t di_uc_alnum_ranges[][2];
extern const size_t di_uc_alnum_count;

/* Length of the valid UTF-8 character at s[0..n) (1-4), or 0 when s does not start with one
 * (overlong forms, surrogates and code points above U+10FFFF are invalid). *cp gets the value. */
int di_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 into out (4 bytes room); returns the length. */
int di_utf8_encode(uint32_t cp, char *out);
/* Nonzero when s[0..n) is valid UTF-8. */
int di_utf8_valid(const char *s, size_t n);
/* Appends s[0..n) to b with every maximal invalid subsequence replaced by U+FFFD, exactly as Rust's
 * String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do. */
int di_utf8_lossy_append(di_buf *b, const char *s, size_t n);
/* Rust's char::is_whitespace (the White_Space property). */
int di_uc_is_whitespace(uint32_t cp);
/* The Rust regex crate's \\w (letters, marks, Nd, Nl, Pc, joiners): HF's single_word test. */
int di_uc_is_word(uint32_t cp);

typedef enum { DI_NF_NFC, DI_NF_NFD, DI_NF_NFKC, DI_NF_NFKD } di_nf_form;
/* Appends the normalization of s[0..n) (valid UTF-8) to b. */
int di_uc_normalize_append(di_buf *b, const char *s, size_t n, di_nf_form form);
/* Appends the per-character lowercase of s[0..n) (Rust's char::to_lowercase for each char). */
int di_uc_lowercase_append(di_buf *b, const char *s, size_t n);
#endif
