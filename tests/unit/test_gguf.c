/* test_gguf: the GGUF reader and writer.
 *  - hostile input: a valid file built in memory with the writer, one field
 *    corrupted per case, each rejected with TDM_ERR_FORMAT and a message
 *    naming the field;
 *  - round trip writer -> reader for every value type, both versions,
 *    alignments, all four output paths of the writer.
 * The fixture files are checked in test_gguf_fixtures.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_writer.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void fill_random(void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
}

#define OK(expr)                                                                    \
    do {                                                                            \
        tdm_error e_ = {0};                                                         \
        tdm_status s_ = (expr);                                                     \
        if (s_ != TDM_OK) fail_msg("%s -> %s: %s", #expr, tdm_status_name(s_), e_.msg); \
    } while (0)
/* Same, for calls that take an explicit `&e_`-less err: use E as the error arg. */
#define E (&e_)

static size_t find_bytes(const uint8_t *buf, size_t size, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= size; i++)
        if (memcmp(buf + i, needle, n) == 0) return i;
    fail_msg("needle '%s' not found", needle);
    return 0;
}

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i); return v; }

/* ------------------------------------------------------------------ the base file */

/* Tensors of the base file (names unique in the header, so byte search finds them). */
static const char *const T0 = "blk.0.attn_q.weight";      /* F32 [64, 2] */
static const char *const T1 = "blk.0.attn_k.weight";      /* F32 [64, 3] */
static const char *const T2 = "blk.0.ffn_up_exps.weight"; /* Q4_K [256, 2, 2] */
static const char *const T3 = "output_norm.weight";       /* F32 [64] */

typedef struct base_file {
    uint8_t *buf;
    size_t size;
    uint8_t data[4][4096];
} base_file;

static base_file *make_base(void)
{
    base_file *b = calloc(1, sizeof *b);
    assert_non_null(b);
    fill_random(b->data, sizeof b->data);
    tdm_gguf_writer *w;
    OK(tdm_gguf_writer_create(&w, E));
    OK(tdm_gguf_writer_set_alignment(w, 32, E));
    OK(tdm_gguf_writer_add_str(w, "general.architecture", "qwen3moe", E));
    OK(tdm_gguf_writer_add_str(w, "general.name", "corruptme", E));
    OK(tdm_gguf_writer_add_u32(w, "test.block_count", 3, E));
    OK(tdm_gguf_writer_add_u32(w, "test.aaaa", 1, E));
    OK(tdm_gguf_writer_add_u32(w, "test.aaab", 2, E));
    const char *toks[] = {"a", "bb", "ccc"};
    OK(tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3, E));
    int32_t tt[5] = {1, 2, 3, 4, 5};
    OK(tdm_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TDM_GGUF_INT32, tt, 5, E));
    OK(tdm_gguf_writer_add_str(w, "test.pad", "x", E)); /* makes the infos end unaligned */
    int64_t ne0[] = {64, 2}, ne1[] = {64, 3}, ne2[] = {256, 2, 2}, ne3[] = {64};
    OK(tdm_gguf_writer_add_tensor(w, T0, TDM_Q_F32, 2, ne0, b->data[0], E));
    OK(tdm_gguf_writer_add_tensor(w, T1, TDM_Q_F32, 2, ne1, b->data[1], E));
    OK(tdm_gguf_writer_add_tensor(w, T2, TDM_Q_Q4_K, 3, ne2, b->data[2], E));
    OK(tdm_gguf_writer_add_tensor(w, T3, TDM_Q_F32, 1, ne3, b->data[3], E));
    void *mem;
    OK(tdm_gguf_writer_write_memory(w, &mem, &b->size, E));
    b->buf = mem;
    tdm_gguf_writer_free(w);
    return b;
}

static void free_base(base_file *b)
{
    free(b->buf);
    free(b);
}

/* Offsets inside the base file. */
static size_t key_pos(base_file *b, const char *key) /* the key's length prefix */
{
    return find_bytes(b->buf, b->size, key) - 8;
}
static size_t key_type_pos(base_file *b, const char *key) { return key_pos(b, key) + 8 + strlen(key); }
static size_t tinfo_pos(base_file *b, const char *name) /* the name's length prefix */
{
    return find_bytes(b->buf, b->size, name) - 8;
}
static size_t ndims_pos(base_file *b, const char *name) { return tinfo_pos(b, name) + 8 + strlen(name); }
static size_t ne_pos(base_file *b, const char *name, int d) { return ndims_pos(b, name) + 4 + 8 * (size_t)d; }
static size_t ttype_pos(base_file *b, const char *name)
{
    size_t p = ndims_pos(b, name);
    return p + 4 + 8 * (size_t)(b->buf[p]);
}
static size_t toffset_pos(base_file *b, const char *name) { return ttype_pos(b, name) + 4; }

static void expect_reject(const void *buf, size_t size, const char *expect, const char *what)
{
    tdm_gguf *g = (tdm_gguf *)(uintptr_t)1;
    tdm_error err = {0};
    tdm_status st = tdm_gguf_open_memory(buf, size, &g, &err);
    if (st != TDM_ERR_FORMAT)
        fail_msg("%s: expected TDM_ERR_FORMAT, got %s (%s)", what, tdm_status_name(st), err.msg);
    assert_null(g);
    if (!strstr(err.msg, expect))
        fail_msg("%s: message '%s' does not contain '%s'", what, err.msg, expect);
    print_message("  rejected %-34s %s\n", what, err.msg);
}

/* ------------------------------------------------------------------ hostile input */

typedef void (*corrupt_fn)(base_file *b, size_t *size);

static void c_magic(base_file *b, size_t *n) { (void)n; b->buf[0] = 'X'; }
static void c_version0(base_file *b, size_t *n) { (void)n; put32(b->buf + 4, 0); }
static void c_version1(base_file *b, size_t *n) { (void)n; put32(b->buf + 4, 1); }
static void c_version4(base_file *b, size_t *n) { (void)n; put32(b->buf + 4, 4); }
static void c_version_swapped(base_file *b, size_t *n) { (void)n; put32(b->buf + 4, 0x03000000u); }
static void c_ntensors_huge(base_file *b, size_t *n) { (void)n; put64(b->buf + 8, 1ull << 40); }
static void c_ntensors_neg(base_file *b, size_t *n) { (void)n; put64(b->buf + 8, UINT64_MAX); }
static void c_nkv_huge(base_file *b, size_t *n) { (void)n; put64(b->buf + 16, 1ull << 60); }
static void c_key_len_overflow(base_file *b, size_t *n) { (void)n; put64(b->buf + 24, UINT64_MAX - 7); }
static void c_empty_key(base_file *b, size_t *n) { (void)n; put64(b->buf + 24, 0); }
static void c_key_nul(base_file *b, size_t *n)
{ (void)n; b->buf[key_pos(b, "general.name") + 8 + 3] = 0; }
static void c_str_len_past_eof(base_file *b, size_t *n)
{ put64(b->buf + key_type_pos(b, "general.name") + 4, *n); }
static void c_unknown_vtype(base_file *b, size_t *n)
{ (void)n; put32(b->buf + key_type_pos(b, "test.block_count"), 13); }
static void c_unknown_elem_type(base_file *b, size_t *n)
{ (void)n; put32(b->buf + key_type_pos(b, "tokenizer.ggml.token_type") + 4, 77); }
static void c_array_count_overflow(base_file *b, size_t *n)
{ (void)n; put64(b->buf + key_type_pos(b, "tokenizer.ggml.token_type") + 8, 1ull << 62); }
static void c_array_count_past_eof(base_file *b, size_t *n)
{ (void)n; put64(b->buf + key_type_pos(b, "tokenizer.ggml.token_type") + 8, 1ull << 28); }
static void c_str_array_elem_past_eof(base_file *b, size_t *n)
{ /* the length of "bb" */ put64(b->buf + key_type_pos(b, "tokenizer.ggml.tokens") + 16 + 9, *n); }
static void c_dup_key(base_file *b, size_t *n) { (void)n; b->buf[find_bytes(b->buf, b->size, "test.aaab") + 8] = 'a'; }
static void c_align_type(base_file *b, size_t *n) { (void)n; put32(b->buf + key_type_pos(b, "general.alignment"), TDM_GGUF_INT32); }
static void c_align_npot(base_file *b, size_t *n) { (void)n; put32(b->buf + key_type_pos(b, "general.alignment") + 4, 48); }
static void c_align_zero(base_file *b, size_t *n) { (void)n; put32(b->buf + key_type_pos(b, "general.alignment") + 4, 0); }
static void c_ttype_removed(base_file *b, size_t *n) { (void)n; put32(b->buf + ttype_pos(b, T0), 4); }
static void c_ttype_unknown(base_file *b, size_t *n) { (void)n; put32(b->buf + ttype_pos(b, T0), 99); }
static void c_ttype_removed36(base_file *b, size_t *n) { (void)n; put32(b->buf + ttype_pos(b, T1), 36); }
static void c_ne0_block(base_file *b, size_t *n) { (void)n; put64(b->buf + ne_pos(b, T2, 0), 128); }
static void c_ndims5(base_file *b, size_t *n) { (void)n; put32(b->buf + ndims_pos(b, T1), 5); }
static void c_ndims0(base_file *b, size_t *n) { (void)n; put32(b->buf + ndims_pos(b, T1), 0); }
static void c_ne_overflow(base_file *b, size_t *n) { (void)n; put64(b->buf + ne_pos(b, T1, 1), 1ull << 62); }
static void c_ne_negative(base_file *b, size_t *n) { (void)n; put64(b->buf + ne_pos(b, T1, 0), (uint64_t)-64); }
static void c_bytes_overflow(base_file *b, size_t *n)
{ /* element count fits int64, byte size (x4) does not fit in 63 bits */
    (void)n;
    put64(b->buf + ne_pos(b, T0, 0), 1ull << 31);
    put64(b->buf + ne_pos(b, T0, 1), 1ull << 31);
}
static void c_misaligned(base_file *b, size_t *n) { (void)n; put64(b->buf + toffset_pos(b, T1), get64(b->buf + toffset_pos(b, T1)) + 16); }
static void c_overlap(base_file *b, size_t *n) { (void)n; put64(b->buf + toffset_pos(b, T3), get64(b->buf + toffset_pos(b, T2))); }
static void c_outside(base_file *b, size_t *n) { (void)n; put64(b->buf + toffset_pos(b, T3), get64(b->buf + toffset_pos(b, T3)) + 4096); }
static void c_offset_overflow(base_file *b, size_t *n) { (void)n; put64(b->buf + toffset_pos(b, T3), UINT64_MAX - 31); }
static void c_dup_tensor(base_file *b, size_t *n) { (void)n; b->buf[find_bytes(b->buf, b->size, T1) + 11] = 'q'; }
static void c_name64(base_file *b, size_t *n) { (void)n; put64(b->buf + tinfo_pos(b, T1), 64); }
static void c_name_empty(base_file *b, size_t *n) { (void)n; put64(b->buf + tinfo_pos(b, T1), 0); }
static void c_tname_nul(base_file *b, size_t *n) { (void)n; b->buf[find_bytes(b->buf, b->size, T3) + 2] = 0; }
static void c_trunc_header(base_file *b, size_t *n) { (void)b; *n = 20; }
static void c_trunc_kv(base_file *b, size_t *n) { *n = key_type_pos(b, "tokenizer.ggml.tokens") + 20; }
static void c_trunc_tinfo(base_file *b, size_t *n) { *n = ne_pos(b, T2, 1) + 3; }
static void c_trunc_before_data(base_file *b, size_t *n) { *n = toffset_pos(b, T3) + 8 + 1; }
static void c_trunc_data(base_file *b, size_t *n) { (void)b; *n -= 100; }
static void c_empty(base_file *b, size_t *n) { (void)b; *n = 0; }
static void c_tiny(base_file *b, size_t *n) { (void)b; *n = 3; }

static const struct {
    const char *what;
    corrupt_fn fn;
    const char *expect;
} k_cases[] = {
    {"bad magic", c_magic, "magic"},
    {"version 0", c_version0, "version 0 not supported"},
    {"version 1", c_version1, "version 1 not supported"},
    {"version 4", c_version4, "version 4 "},
    {"byte-swapped version", c_version_swapped, "byte-swapped"},
    {"tensor_count too large", c_ntensors_huge, "tensor_count"},
    {"tensor_count negative", c_ntensors_neg, "tensor_count -1 is negative"},
    {"metadata_kv_count too large", c_nkv_huge, "metadata_kv_count"},
    {"key length overflow", c_key_len_overflow, "kv 0 key"},
    {"empty key", c_empty_key, "kv 0: empty key"},
    {"key with NUL", c_key_nul, "contains a NUL byte"},
    {"string length past EOF", c_str_len_past_eof, "key 'general.name': truncated"},
    {"unknown value type", c_unknown_vtype, "key 'test.block_count': unknown value type 13"},
    {"unknown array element type", c_unknown_elem_type, "key 'tokenizer.ggml.token_type': unknown array element type 77"},
    {"array count overflow", c_array_count_overflow, "key 'tokenizer.ggml.token_type': array count"},
    {"array count past EOF", c_array_count_past_eof, "key 'tokenizer.ggml.token_type': truncated"},
    {"string element past EOF", c_str_array_elem_past_eof, "key 'tokenizer.ggml.tokens': truncated"},
    {"duplicate key", c_dup_key, "duplicate key 'test.aaaa'"},
    {"alignment not UINT32", c_align_type, "key 'general.alignment': type INT32"},
    {"alignment 48", c_align_npot, "key 'general.alignment': value 48 is not a power of two"},
    {"alignment 0", c_align_zero, "key 'general.alignment': value 0"},
    {"removed tensor type 4", c_ttype_removed, "tensor 'blk.0.attn_q.weight': unknown or removed tensor type 4"},
    {"unknown tensor type 99", c_ttype_unknown, "tensor 'blk.0.attn_q.weight': unknown or removed tensor type 99"},
    {"removed tensor type 36", c_ttype_removed36, "tensor 'blk.0.attn_k.weight': unknown or removed tensor type 36"},
    {"ne[0] not a block multiple", c_ne0_block, "tensor 'blk.0.ffn_up_exps.weight': ne[0] = 128 is not a multiple of the Q4_K block size 256"},
    {"n_dims 5", c_ndims5, "tensor 'blk.0.attn_k.weight': n_dims 5"},
    {"n_dims 0", c_ndims0, "tensor 'blk.0.attn_k.weight': n_dims 0"},
    {"element count overflow", c_ne_overflow, "tensor 'blk.0.attn_k.weight': element count overflows"},
    {"negative dimension", c_ne_negative, "tensor 'blk.0.attn_k.weight': ne[0] = -64 is negative"},
    {"byte size overflow", c_bytes_overflow, "tensor 'blk.0.attn_q.weight'"},
    {"misaligned offset", c_misaligned, "tensor 'blk.0.attn_k.weight': offset 528 not a multiple of alignment 32"},
    {"overlapping tensors", c_overlap, "overlaps tensor"},
    {"tensor past EOF", c_outside, "tensor 'output_norm.weight': data"},
    {"offset overflow", c_offset_overflow, "tensor 'output_norm.weight'"},
    {"duplicate tensor name", c_dup_tensor, "duplicate tensor name 'blk.0.attn_q.weight'"},
    {"name of 64 bytes", c_name64, "tensor 1: name"},
    {"empty tensor name", c_name_empty, "tensor 1: empty name"},
    {"tensor name with NUL", c_tname_nul, "tensor 3: name"},
    {"truncated header", c_trunc_header, "metadata_kv_count: truncated"},
    {"truncated in metadata", c_trunc_kv, "key 'tokenizer.ggml.tokens': truncated"},
    {"truncated in tensor infos", c_trunc_tinfo, "tensor 'blk.0.ffn_up_exps.weight': truncated"},
    {"truncated before data", c_trunc_before_data, "data section"},
    {"truncated in data", c_trunc_data, "extends past the end of the file"},
    {"empty file", c_empty, "empty file"},
    {"3-byte file", c_tiny, "magic"},
};

static void test_base_is_valid(void **state)
{
    (void)state;
    base_file *b = make_base();
    tdm_gguf *g;
    OK(tdm_gguf_open_memory(b->buf, b->size, &g, E));
    assert_int_equal(tdm_gguf_tensor_count(g), 4);
    /* the "truncated before data" case needs padding between infos and data */
    assert_true(toffset_pos(b, T3) + 8 + 1 < tdm_gguf_data_offset(g));
    assert_int_equal(get64(b->buf + toffset_pos(b, T1)) + 16, 528);
    tdm_gguf_free(g);
    free_base(b);
}

static void test_hostile(void **state)
{
    (void)state;
    size_t n = sizeof k_cases / sizeof k_cases[0];
    assert_true(n >= 20);
    for (size_t i = 0; i < n; i++) {
        base_file *b = make_base();
        size_t size = b->size;
        k_cases[i].fn(b, &size);
        /* an exact-size copy, so that ASan sees any read past the end */
        uint8_t *copy = malloc(size ? size : 1);
        memcpy(copy, b->buf, size);
        expect_reject(copy, size, k_cases[i].expect, k_cases[i].what);
        free(copy);
        free_base(b);
    }
}

/* Every prefix of the base file is rejected (never a crash or an accepted file). */
static void test_every_truncation(void **state)
{
    (void)state;
    base_file *b = make_base();
    for (size_t n = 0; n < b->size; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b->buf, n);
        tdm_gguf *g = NULL;
        tdm_error err = {0};
        tdm_status st = tdm_gguf_open_memory(copy, n, &g, &err);
        if (st != TDM_ERR_FORMAT) fail_msg("prefix of %zu bytes: %s", n, tdm_status_name(st));
        assert_null(g);
        free(copy);
    }
    free_base(b);
}

/* Each byte of the header flipped: never a crash; if accepted, still consistent. */
static void test_byte_flips(void **state)
{
    (void)state;
    base_file *b = make_base();
    tdm_gguf *g0;
    OK(tdm_gguf_open_memory(b->buf, b->size, &g0, E));
    size_t hdr = (size_t)tdm_gguf_data_offset(g0);
    tdm_gguf_free(g0);
    int accepted = 0, rejected = 0;
    uint8_t *copy = malloc(b->size);
    for (size_t i = 0; i < hdr; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(copy, b->buf, b->size);
            copy[i] ^= (uint8_t)(1u << bit);
            tdm_gguf *g = NULL;
            tdm_error err = {0};
            tdm_status st = tdm_gguf_open_memory(copy, b->size, &g, &err);
            if (st == TDM_OK) {
                accepted++;
                for (int64_t t = 0; t < tdm_gguf_tensor_count(g); t++) {
                    const tdm_gguf_tensor *tt = tdm_gguf_tensor_at(g, t);
                    assert_true((const uint8_t *)tt->data + tt->nbytes <= copy + b->size);
                    assert_true(tt->offset % tdm_gguf_alignment(g) == 0);
                }
                tdm_gguf_free(g);
            } else {
                assert_int_equal(st, TDM_ERR_FORMAT);
                assert_true(err.msg[0] != '\0');
                rejected++;
            }
        }
    }
    free(copy);
    print_message("  byte flips: %d accepted, %d rejected\n", accepted, rejected);
    assert_true(rejected > 0);
    free_base(b);
}

/* ------------------------------------------------------------------ round trip */

static const int64_t k_i64[] = {INT64_MIN, -1, 0, 1, INT64_MAX};

static tdm_gguf_writer *make_all_types(uint32_t version, uint32_t alignment, const void *tdata[3])
{
    tdm_gguf_writer *w;
    OK(tdm_gguf_writer_create(&w, E));
    OK(tdm_gguf_writer_set_version(w, version, E));
    if (alignment) OK(tdm_gguf_writer_set_alignment(w, alignment, E));
    OK(tdm_gguf_writer_add_u8(w, "v.u8", 250, E));
    OK(tdm_gguf_writer_add_i8(w, "v.i8", -100, E));
    OK(tdm_gguf_writer_add_u16(w, "v.u16", 65000, E));
    OK(tdm_gguf_writer_add_i16(w, "v.i16", -32768, E));
    OK(tdm_gguf_writer_add_u32(w, "v.u32", 4000000000u, E));
    OK(tdm_gguf_writer_add_i32(w, "v.i32", -2000000000, E));
    OK(tdm_gguf_writer_add_f32(w, "v.f32", -1.5e-7f, E));
    OK(tdm_gguf_writer_add_bool(w, "v.bool", true, E));
    OK(tdm_gguf_writer_add_bool(w, "v.bool0", false, E));
    OK(tdm_gguf_writer_add_str(w, "v.str", "hello", E));
    OK(tdm_gguf_writer_add_strn(w, "v.strnul", "a\0b", 3, E));
    OK(tdm_gguf_writer_add_str(w, "v.empty", "", E));
    OK(tdm_gguf_writer_add_u64(w, "v.u64", UINT64_MAX, E));
    OK(tdm_gguf_writer_add_i64(w, "v.i64", INT64_MIN, E));
    OK(tdm_gguf_writer_add_f64(w, "v.f64", 1e300, E));
    OK(tdm_gguf_writer_add_f64(w, "v.f64s", -0.375, E));
    uint8_t au8[] = {0, 255, 7};
    int8_t ai8[] = {-128, 127};
    uint16_t au16[] = {65535, 1};
    int16_t ai16[] = {-32768, 5};
    uint32_t au32[] = {UINT32_MAX, 0, 42};
    int32_t ai32[] = {INT32_MIN, -1};
    float af32[] = {0.25f, -3.0f};
    uint8_t abool[] = {1, 0, 1};
    uint64_t au64[] = {UINT64_MAX, 3};
    double af64[] = {-2.5, 1e-300};
    OK(tdm_gguf_writer_add_arr(w, "a.u8", TDM_GGUF_UINT8, au8, 3, E));
    OK(tdm_gguf_writer_add_arr(w, "a.i8", TDM_GGUF_INT8, ai8, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.u16", TDM_GGUF_UINT16, au16, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.i16", TDM_GGUF_INT16, ai16, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.u32", TDM_GGUF_UINT32, au32, 3, E));
    OK(tdm_gguf_writer_add_arr(w, "a.i32", TDM_GGUF_INT32, ai32, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.f32", TDM_GGUF_FLOAT32, af32, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.bool", TDM_GGUF_BOOL, abool, 3, E));
    OK(tdm_gguf_writer_add_arr(w, "a.u64", TDM_GGUF_UINT64, au64, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.i64", TDM_GGUF_INT64, k_i64, 5, E));
    OK(tdm_gguf_writer_add_arr(w, "a.f64", TDM_GGUF_FLOAT64, af64, 2, E));
    OK(tdm_gguf_writer_add_arr(w, "a.empty", TDM_GGUF_INT32, NULL, 0, E));
    const char *strs[] = {"x", "", "zz\0z"};
    size_t lens[] = {1, 0, 4};
    OK(tdm_gguf_writer_add_arr_str(w, "a.str", strs, lens, 3, E));
    OK(tdm_gguf_writer_add_arr_str(w, "a.str0", NULL, NULL, 0, E));
    /* nested: ARRAY of 2 arrays: [u8 x2], [string "q"] */
    uint8_t nested[4 + 8 + (4 + 8 + 2) + (4 + 8 + 8 + 1)], *p = nested;
    put32(p, TDM_GGUF_ARRAY); put64(p + 4, 2); p += 12;
    put32(p, TDM_GGUF_UINT8); put64(p + 4, 2); p[12] = 9; p[13] = 8; p += 14;
    put32(p, TDM_GGUF_STRING); put64(p + 4, 1); put64(p + 12, 1); p[20] = 'q'; p += 21;
    OK(tdm_gguf_writer_add_raw(w, "a.nested", TDM_GGUF_ARRAY, nested, (size_t)(p - nested), E));
    int64_t ne0[] = {33, 3}, ne1[] = {512, 1, 2, 2}, ne2[] = {7};
    OK(tdm_gguf_writer_add_tensor(w, "t.f32", TDM_Q_F32, 2, ne0, tdata[0], E));
    OK(tdm_gguf_writer_add_tensor(w, "t.q6k", TDM_Q_Q6_K, 4, ne1, tdata[1], E));
    OK(tdm_gguf_writer_add_tensor(w, "t.empty", TDM_Q_F16, 1, (int64_t[]){0}, NULL, E));
    OK(tdm_gguf_writer_add_tensor(w, "t.bf16", TDM_Q_BF16, 1, ne2, tdata[2], E));
    return w;
}

static const size_t k_tbytes[3] = {33 * 3 * 4, 2 * 4 * 210, 14};

static void check_all_types(const tdm_gguf *g, uint32_t version, uint32_t alignment,
                            const void *tdata[3])
{
    uint32_t u32; uint64_t u64; int64_t i64; float f; bool bo; const char *s; size_t n;
    tdm_gguf_vtype et; uint64_t cnt; double d;
    assert_int_equal(tdm_gguf_version(g), version);
    assert_int_equal(tdm_gguf_alignment(g), alignment ? alignment : 32);
    OK(tdm_gguf_get_u32(g, "v.u8", &u32, E)); assert_int_equal(u32, 250);
    OK(tdm_gguf_get_i64(g, "v.i8", &i64, E)); assert_int_equal(i64, -100);
    OK(tdm_gguf_get_u32(g, "v.u16", &u32, E)); assert_int_equal(u32, 65000);
    OK(tdm_gguf_get_i64(g, "v.i16", &i64, E)); assert_int_equal(i64, -32768);
    OK(tdm_gguf_get_u32(g, "v.u32", &u32, E)); assert_int_equal(u32, 4000000000u);
    OK(tdm_gguf_get_i64(g, "v.i32", &i64, E)); assert_int_equal(i64, -2000000000);
    OK(tdm_gguf_get_f32(g, "v.f32", &f, E)); assert_true(f == -1.5e-7f);
    OK(tdm_gguf_get_bool(g, "v.bool", &bo, E)); assert_true(bo);
    OK(tdm_gguf_get_bool(g, "v.bool0", &bo, E)); assert_false(bo);
    OK(tdm_gguf_get_str(g, "v.str", &s, &n, E)); assert_int_equal(n, 5); assert_memory_equal(s, "hello", 5);
    OK(tdm_gguf_get_str(g, "v.strnul", &s, &n, E)); assert_int_equal(n, 3); assert_memory_equal(s, "a\0b", 3);
    OK(tdm_gguf_get_str(g, "v.empty", &s, &n, E)); assert_int_equal(n, 0);
    OK(tdm_gguf_get_u64(g, "v.u64", &u64, E)); assert_true(u64 == UINT64_MAX);
    OK(tdm_gguf_get_i64(g, "v.i64", &i64, E)); assert_true(i64 == INT64_MIN);
    OK(tdm_gguf_get_f32(g, "v.f64s", &f, E)); assert_true(f == -0.375f);
    OK(tdm_gguf_get_f64(g, "v.f64", &d, E)); assert_true(d == 1e300);
    OK(tdm_gguf_get_f64(g, "v.f32", &d, E)); assert_true(d == (double)-1.5e-7f);
    OK(tdm_gguf_get_u64(g, "v.u32", &u64, E)); assert_true(u64 == 4000000000u);
    /* kinds of the index */
    int64_t k = tdm_gguf_find_key(g, "v.i16");
    assert_true(k >= 0);
    assert_string_equal(tdm_gguf_kv_key(g, k), "v.i16");
    assert_int_equal(tdm_gguf_kv_type(g, k), TDM_GGUF_INT16);
    assert_null(tdm_gguf_kv_key(g, tdm_gguf_kv_count(g)));
    assert_int_equal(tdm_gguf_find_key(g, "v.nope"), -1);
    assert_int_equal(tdm_gguf_find_key(g, "v.i1"), -1);
    /* arrays */
    static const struct { const char *key; tdm_gguf_vtype t; uint64_t n; int64_t v0, vlast; } ints[] = {
        {"a.u8", TDM_GGUF_UINT8, 3, 0, 7}, {"a.i8", TDM_GGUF_INT8, 2, -128, 127},
        {"a.u16", TDM_GGUF_UINT16, 2, 65535, 1}, {"a.i16", TDM_GGUF_INT16, 2, -32768, 5},
        {"a.u32", TDM_GGUF_UINT32, 3, UINT32_MAX, 42}, {"a.i32", TDM_GGUF_INT32, 2, INT32_MIN, -1},
        {"a.bool", TDM_GGUF_BOOL, 3, 1, 1}, {"a.i64", TDM_GGUF_INT64, 5, INT64_MIN, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        OK(tdm_gguf_get_arr(g, ints[i].key, &et, &cnt, E));
        assert_int_equal(et, ints[i].t);
        assert_int_equal(cnt, ints[i].n);
        OK(tdm_gguf_arr_int(g, ints[i].key, 0, &i64, E)); assert_true(i64 == ints[i].v0);
        OK(tdm_gguf_arr_int(g, ints[i].key, cnt - 1, &i64, E)); assert_true(i64 == ints[i].vlast);
    }
    OK(tdm_gguf_arr_int(g, "a.u8", 1, &i64, E)); assert_int_equal(i64, 255);
    OK(tdm_gguf_arr_int(g, "a.bool", 1, &i64, E)); assert_int_equal(i64, 0);
    OK(tdm_gguf_arr_int(g, "a.u64", 1, &i64, E)); assert_int_equal(i64, 3);
    assert_int_equal(tdm_gguf_arr_int(g, "a.u64", 0, &i64, NULL), TDM_ERR_FORMAT); /* UINT64_MAX */
    OK(tdm_gguf_arr_float(g, "a.f32", 0, &d, E)); assert_true(d == 0.25);
    OK(tdm_gguf_arr_float(g, "a.f32", 1, &d, E)); assert_true(d == -3.0);
    OK(tdm_gguf_arr_float(g, "a.f64", 1, &d, E)); assert_true(d == 1e-300);
    OK(tdm_gguf_get_arr(g, "a.empty", &et, &cnt, E)); assert_int_equal(cnt, 0);
    assert_int_equal(tdm_gguf_arr_int(g, "a.empty", 0, &i64, NULL), TDM_ERR_INVALID);
    OK(tdm_gguf_get_arr(g, "a.str", &et, &cnt, E));
    assert_int_equal(et, TDM_GGUF_STRING); assert_int_equal(cnt, 3);
    OK(tdm_gguf_arr_str(g, "a.str", 0, &s, &n, E)); assert_int_equal(n, 1); assert_memory_equal(s, "x", 1);
    OK(tdm_gguf_arr_str(g, "a.str", 1, &s, &n, E)); assert_int_equal(n, 0);
    OK(tdm_gguf_arr_str(g, "a.str", 2, &s, &n, E)); assert_int_equal(n, 4); assert_memory_equal(s, "zz\0z", 4);
    OK(tdm_gguf_get_arr(g, "a.str0", &et, &cnt, E)); assert_int_equal(cnt, 0);
    OK(tdm_gguf_get_arr(g, "a.nested", &et, &cnt, E));
    assert_int_equal(et, TDM_GGUF_ARRAY); assert_int_equal(cnt, 2);
    assert_int_equal(tdm_gguf_arr_int(g, "a.nested", 0, &i64, NULL), TDM_ERR_FORMAT);
    /* tensors */
    assert_int_equal(tdm_gguf_tensor_count(g), 4);
    static const char *names[] = {"t.f32", "t.q6k", "t.bf16"};
    for (int i = 0; i < 3; i++) {
        const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, names[i]);
        assert_non_null(t);
        assert_string_equal(t->name, names[i]);
        assert_int_equal(t->nbytes, k_tbytes[i]);
        assert_int_equal(t->offset % tdm_gguf_alignment(g), 0);
        assert_ptr_equal(t->data, (const uint8_t *)tdm_gguf_base(g) + tdm_gguf_data_offset(g) + t->offset);
        assert_memory_equal(t->data, tdata[i], k_tbytes[i]);
    }
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, "t.q6k");
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->type, TDM_Q_Q6_K);
    assert_true(t->ne[0] == 512 && t->ne[1] == 1 && t->ne[2] == 2 && t->ne[3] == 2);
    t = tdm_gguf_find_tensor(g, "t.f32");
    assert_true(t->n_dims == 2 && t->ne[2] == 1 && t->ne[3] == 1);
    t = tdm_gguf_find_tensor(g, "t.empty");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 0);
    assert_ptr_equal(tdm_gguf_tensor_at(g, 2), t);
    assert_null(tdm_gguf_find_tensor(g, "t.f3"));
    assert_null(tdm_gguf_tensor_at(g, 4));
    assert_null(tdm_gguf_tensor_at(g, -1));
    assert_true(tdm_gguf_complete(g));
    assert_true(tdm_gguf_data_end(g) <= tdm_gguf_file_size(g));
}

static void test_round_trip(void **state)
{
    (void)state;
    static uint8_t d0[33 * 3 * 4], d1[2 * 4 * 210], d2[14];
    fill_random(d0, sizeof d0); fill_random(d1, sizeof d1); fill_random(d2, sizeof d2);
    const void *tdata[3] = {d0, d1, d2};
    static const uint32_t versions[] = {3, 2};
    static const uint32_t aligns[] = {0, 1, 8, 64, 4096};
    for (int v = 0; v < 2; v++)
        for (int a = 0; a < 5; a++) {
            tdm_gguf_writer *w = make_all_types(versions[v], aligns[a], tdata);
            void *mem;
            size_t size;
                    uint64_t expect = tdm_gguf_writer_file_size(w);
            OK(tdm_gguf_writer_write_memory(w, &mem, &size, E));
            assert_int_equal(size, expect);
            tdm_gguf *g;
            OK(tdm_gguf_open_memory(mem, size, &g, E));
            assert_int_equal(tdm_gguf_data_offset(g), tdm_gguf_writer_header_size(w));
            check_all_types(g, versions[v], aligns[a], tdata);
            tdm_gguf_free(g);
            free(mem);
            tdm_gguf_writer_free(w);
        }
}

static void test_getter_errors(void **state)
{
    (void)state;
    static uint8_t d0[33 * 3 * 4], d1[2 * 4 * 210], d2[14];
    const void *tdata[3] = {d0, d1, d2};
    tdm_gguf_writer *w = make_all_types(3, 0, tdata);
    void *mem; size_t size; tdm_gguf *g;
    OK(tdm_gguf_writer_write_memory(w, &mem, &size, E));
    OK(tdm_gguf_open_memory(mem, size, &g, E));
    uint32_t u32; uint64_t u64; int64_t i64; float f; bool b; const char *s; size_t n; double d;
    tdm_error err;
#define REJECT(call, code, text)                                                         \
    do {                                                                                 \
        tdm_error_clear(&err);                                                           \
        assert_int_equal((call), code);                                                  \
        if (!strstr(err.msg, text)) fail_msg("'%s' lacks '%s'", err.msg, text);          \
    } while (0)
    REJECT(tdm_gguf_get_u32(g, "v.missing", &u32, &err), TDM_ERR_FORMAT, "key 'v.missing' missing");
    REJECT(tdm_gguf_get_u32(g, "v.i8", &u32, &err), TDM_ERR_FORMAT, "key 'v.i8': value -100 does not fit uint32");
    REJECT(tdm_gguf_get_u32(g, "v.u64", &u32, &err), TDM_ERR_FORMAT, "does not fit uint32");
    REJECT(tdm_gguf_get_u64(g, "v.i64", &u64, &err), TDM_ERR_FORMAT, "does not fit uint64");
    REJECT(tdm_gguf_get_i64(g, "v.u64", &i64, &err), TDM_ERR_FORMAT, "does not fit int64");
    REJECT(tdm_gguf_get_u32(g, "v.str", &u32, &err), TDM_ERR_FORMAT, "key 'v.str': type STRING");
    REJECT(tdm_gguf_get_u32(g, "v.f32", &u32, &err), TDM_ERR_FORMAT, "type FLOAT32");
    REJECT(tdm_gguf_get_u32(g, "v.bool", &u32, &err), TDM_ERR_FORMAT, "type BOOL");
    REJECT(tdm_gguf_get_f32(g, "v.u32", &f, &err), TDM_ERR_FORMAT, "expected FLOAT32 or FLOAT64");
    REJECT(tdm_gguf_get_f64(g, "v.str", &d, &err), TDM_ERR_FORMAT, "key 'v.str': type STRING, expected FLOAT32 or FLOAT64");
    REJECT(tdm_gguf_get_bool(g, "v.u8", &b, &err), TDM_ERR_FORMAT, "expected BOOL");
    REJECT(tdm_gguf_get_f32(g, "v.f64", &f, &err), TDM_ERR_FORMAT, "key 'v.f64': value 1e+300 does not fit float32");
    REJECT(tdm_gguf_get_str(g, "a.str", &s, &n, &err), TDM_ERR_FORMAT, "type ARRAY, expected STRING");
    REJECT(tdm_gguf_get_arr(g, "v.str", NULL, NULL, &err), TDM_ERR_FORMAT, "expected ARRAY");
    REJECT(tdm_gguf_arr_str(g, "a.u8", 0, &s, &n, &err), TDM_ERR_FORMAT, "array of UINT8, expected STRING");
    REJECT(tdm_gguf_arr_str(g, "a.str", 3, &s, &n, &err), TDM_ERR_INVALID, "index 3 out of range (3 elements)");
    REJECT(tdm_gguf_arr_int(g, "a.f32", 0, &i64, &err), TDM_ERR_FORMAT, "expected integers");
    REJECT(tdm_gguf_arr_int(g, "a.str", 0, &i64, &err), TDM_ERR_FORMAT, "expected integers");
    REJECT(tdm_gguf_arr_float(g, "a.i32", 0, &d, &err), TDM_ERR_FORMAT, "expected FLOAT32 or FLOAT64");
    REJECT(tdm_gguf_arr_float(g, "a.f32", 2, &d, &err), TDM_ERR_INVALID, "index 2");
    REJECT(tdm_gguf_arr_int(g, "v.missing", 0, &i64, &err), TDM_ERR_FORMAT, "v.missing");
#undef REJECT
    tdm_gguf_free(g);
    free(mem);
    tdm_gguf_writer_free(w);
}

/* Deeper nesting than 8 is rejected; 8 levels are accepted. */
static void test_nesting(void **state)
{
    (void)state;
    for (int depth = 7; depth <= 9; depth++) {
        uint8_t payload[16 * 12], *p = payload;
        for (int i = 1; i < depth; i++) { put32(p, TDM_GGUF_ARRAY); put64(p + 4, 1); p += 12; }
        put32(p, TDM_GGUF_UINT8); put64(p + 4, 0); p += 12;
        tdm_gguf_writer *w;
            OK(tdm_gguf_writer_create(&w, E));
        OK(tdm_gguf_writer_add_raw(w, "deep", TDM_GGUF_ARRAY, payload, (size_t)(p - payload), E));
        void *mem; size_t size; tdm_gguf *g = NULL;
        OK(tdm_gguf_writer_write_memory(w, &mem, &size, E));
        tdm_error err = {0};
        tdm_status st = tdm_gguf_open_memory(mem, size, &g, &err);
        if (depth <= 8) {
            assert_int_equal(st, TDM_OK);
            tdm_gguf_free(g);
        } else {
            assert_int_equal(st, TDM_ERR_FORMAT);
            assert_non_null(strstr(err.msg, "key 'deep': arrays nested deeper than 8"));
        }
        free(mem);
        tdm_gguf_writer_free(w);
    }
}

/* 0 tensors, 0 keys. */
static void test_empty_files(void **state)
{
    (void)state;
    tdm_gguf_writer *w;
    OK(tdm_gguf_writer_create(&w, E));
    void *mem; size_t size; tdm_gguf *g;
    OK(tdm_gguf_writer_write_memory(w, &mem, &size, E));
    assert_int_equal(size, 24);
    OK(tdm_gguf_open_memory(mem, size, &g, E));
    assert_int_equal(tdm_gguf_kv_count(g), 0);
    assert_int_equal(tdm_gguf_tensor_count(g), 0);
    assert_int_equal(tdm_gguf_find_key(g, "x"), -1);
    assert_null(tdm_gguf_find_tensor(g, "x"));
    assert_true(tdm_gguf_complete(g));
    tdm_gguf_free(g);
    free(mem);
    tdm_gguf_writer_free(w);
    /* the same with a NULL buffer of size 0 */
    tdm_error err;
    assert_int_equal(tdm_gguf_open_memory(NULL, 0, &g, &err), TDM_ERR_FORMAT);
    assert_null(g);
}

/* ------------------------------------------------------------------ writer paths */

typedef struct fill_ctx { const uint8_t *src[4]; int calls; } fill_ctx;

static tdm_status fill_cb(void *user, int64_t index, uint64_t offset, void *dst, size_t n, tdm_error *err)
{
    fill_ctx *c = user;
    c->calls++;
    if (index < 0 || index > 3) return tdm_error_set(err, TDM_ERR_INVALID, "bad index");
    memcpy(dst, c->src[index] + offset, n);
    return TDM_OK;
}

static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Builds the same file four ways: memory, write_file from pointers, write_file
 * with callbacks (chunked: one tensor exceeds a chunk), streaming in odd chunk
 * sizes; all must be byte-identical. */
static void test_writer_paths(void **state)
{
    (void)state;
    size_t big = TDM_GGUF_WRITER_CHUNK + 4 * 1000; /* F32 [1000, k] spanning > 1 chunk */
    int64_t rows = (int64_t)(big / 4000);
    size_t nbig = (size_t)rows * 4000;
    uint8_t *src[4];
    size_t nb[4] = {nbig, 18 * 5, 7 * 2, 4 * 3};
    for (int i = 0; i < 4; i++) { src[i] = malloc(nb[i]); fill_random(src[i], nb[i]); }
    int64_t ne[4][2] = {{1000, rows}, {32 * 5, 1}, {7, 1}, {3, 1}};
    tdm_qtype ty[4] = {TDM_Q_F32, TDM_Q_Q4_0, TDM_Q_F16, TDM_Q_F32};
    const char *names[4] = {"big", "q40", "f16", "tail"};
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_gguf_%d.gguf", (int)getpid());
    uint8_t *ref = NULL;
    size_t ref_size = 0;
    for (int mode = 0; mode < 4; mode++) {
        tdm_gguf_writer *w;
        fill_ctx fc = {{src[0], src[1], src[2], src[3]}, 0};
        OK(tdm_gguf_writer_create(&w, E));
        if (mode & 1) OK(tdm_gguf_writer_add_u32(w, "general.alignment", 64, E)); /* == set_alignment */
        else OK(tdm_gguf_writer_set_alignment(w, 64, E));
        OK(tdm_gguf_writer_add_str(w, "general.architecture", "x", E));
        for (int i = 0; i < 4; i++) {
            if (mode == 2) OK(tdm_gguf_writer_add_tensor_cb(w, names[i], ty[i], 2, ne[i], fill_cb, &fc, E));
            else OK(tdm_gguf_writer_add_tensor(w, names[i], ty[i], 2, ne[i], mode == 3 ? NULL : src[i], E));
        }
        uint8_t *out;
        size_t out_size;
        if (mode == 0) {
            void *m;
            OK(tdm_gguf_writer_write_memory(w, &m, &out_size, E));
            out = m;
        } else if (mode <= 2) {
            OK(tdm_gguf_writer_write_file(w, path, E));
            out = read_file(path, &out_size);
        } else {
            OK(tdm_gguf_writer_begin(w, path, E));
            uint8_t *all = malloc(nbig + 200);
            size_t k = 0;
            for (int i = 0; i < 4; i++) { memcpy(all + k, src[i], nb[i]); k += nb[i]; }
            size_t chunk[] = {1, 4095, 3, 100000, 17};
            for (size_t pos = 0, c = 0; pos < k; c++) {
                size_t m = chunk[c % 5] < k - pos ? chunk[c % 5] : k - pos;
                OK(tdm_gguf_writer_write_data(w, all + pos, m, E));
                pos += m;
            }
            tdm_error err;
            assert_int_equal(tdm_gguf_writer_write_data(w, all, 1, &err), TDM_ERR_INVALID);
            OK(tdm_gguf_writer_finish(w, E));
            free(all);
            out = read_file(path, &out_size);
        }
        if (mode == 2) assert_true(fc.calls >= 5); /* the big tensor came in two chunks */
        assert_int_equal(out_size, tdm_gguf_writer_file_size(w));
        tdm_gguf *g;
        OK(tdm_gguf_open_memory(out, out_size, &g, E));
        for (int i = 0; i < 4; i++) {
            const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, names[i]);
            assert_non_null(t);
            assert_int_equal(t->nbytes, nb[i]);
            assert_int_equal(t->offset, tdm_gguf_writer_tensor_offset(w, i));
            assert_memory_equal(t->data, src[i], nb[i]);
        }
        /* every byte that is not header or tensor data is a zero pad */
        for (int i = 0; i < 4; i++) {
            const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, names[i]);
            uint64_t end = tdm_gguf_data_offset(g) + t->offset + t->nbytes;
            for (uint64_t j = end; j < (end + 63) / 64 * 64; j++) assert_int_equal(out[j], 0);
        }
        assert_int_equal(out[tdm_gguf_data_offset(g) - 1], 0);
        tdm_gguf_free(g);
        if (!ref) { ref = out; ref_size = out_size; }
        else {
            assert_int_equal(out_size, ref_size);
            assert_memory_equal(out, ref, ref_size);
            free(out);
        }
        tdm_gguf_writer_free(w);
    }
    /* partial open: the same file cut inside the f16 tensor */
    {
        tdm_gguf *r;
        OK(tdm_gguf_open_memory(ref, ref_size, &r, E));
        uint64_t d0 = tdm_gguf_data_offset(r);
        size_t cut = (size_t)(d0 + tdm_gguf_find_tensor(r, "f16")->offset + 5);
        uint64_t data_end = d0 + tdm_gguf_find_tensor(r, "tail")->offset + nb[3];
        tdm_gguf_free(r);
        FILE *f = fopen(path, "wb");
        assert_int_equal(fwrite(ref, 1, cut, f), cut);
        fclose(f);
        tdm_gguf *g = NULL;
        tdm_error err = {0};
        assert_int_equal(tdm_gguf_open(path, &g, &err), TDM_ERR_FORMAT);
        assert_non_null(strstr(err.msg, path));
        assert_non_null(strstr(err.msg, "extends past the end of the file"));
        OK(tdm_gguf_open_ex(path, TDM_GGUF_OPEN_PARTIAL, &g, E));
        assert_false(tdm_gguf_complete(g));
        assert_int_equal(tdm_gguf_data_end(g), data_end);
        assert_non_null(tdm_gguf_find_tensor(g, "big")->data);
        assert_int_equal(tdm_gguf_file_size(g), cut);
        assert_non_null(tdm_gguf_find_tensor(g, "q40")->data);
        assert_null(tdm_gguf_find_tensor(g, "f16")->data);
        assert_null(tdm_gguf_find_tensor(g, "tail")->data);
        tdm_gguf_free(g);
    }
    unlink(path);
    free(ref);
    for (int i = 0; i < 4; i++) free(src[i]);
}

static void test_writer_rejects(void **state)
{
    (void)state;
    tdm_gguf_writer *w;
    tdm_error err;
    OK(tdm_gguf_writer_create(&w, E));
    OK(tdm_gguf_writer_add_u32(w, "k", 1, E));
    assert_int_equal(tdm_gguf_writer_add_u32(w, "k", 2, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "duplicate key 'k'"));
    assert_int_equal(tdm_gguf_writer_add_u32(w, "", 2, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gguf_writer_set_alignment(w, 24, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gguf_writer_set_version(w, 1, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gguf_writer_add_u64(w, "general.alignment", 64, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "set_alignment"));
    assert_int_equal(tdm_gguf_writer_add_arr(w, "s", TDM_GGUF_STRING, NULL, 0, &err), TDM_ERR_INVALID);
    int64_t ne[] = {100, 2};
    assert_int_equal(tdm_gguf_writer_add_tensor(w, "t", TDM_Q_Q4_K, 2, ne, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "block"));
    assert_int_equal(tdm_gguf_writer_add_tensor(w, "t", (tdm_qtype)4, 2, ne, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gguf_writer_add_tensor(w, "t", TDM_Q_F32, 5, ne, NULL, &err), TDM_ERR_INVALID);
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    assert_int_equal(tdm_gguf_writer_add_tensor(w, longname, TDM_Q_F32, 2, ne, NULL, &err), TDM_ERR_INVALID);
    longname[63] = 0; /* 63 bytes is the maximum */
    OK(tdm_gguf_writer_add_tensor(w, longname, TDM_Q_F32, 2, ne, NULL, E));
    assert_int_equal(tdm_gguf_writer_add_tensor(w, longname, TDM_Q_F32, 2, ne, NULL, &err), TDM_ERR_INVALID);
    int64_t neg[] = {-4, 2};
    assert_int_equal(tdm_gguf_writer_add_tensor(w, "neg", TDM_Q_F32, 2, neg, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gguf_writer_set_alignment(w, 64, &err), TDM_ERR_INVALID); /* after a tensor */
    /* no data and no callback: write_memory refuses */
    void *m; size_t n;
    assert_int_equal(tdm_gguf_writer_write_memory(w, &m, &n, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "neither data nor a fill callback"));
    tdm_gguf_writer_free(w);
    /* finish before all data came */
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_gguf_w_%d.gguf", (int)getpid());
    OK(tdm_gguf_writer_create(&w, E));
    OK(tdm_gguf_writer_add_tensor(w, "t", TDM_Q_F32, 2, ne, NULL, E));
    OK(tdm_gguf_writer_begin(w, path, E));
    assert_int_equal(tdm_gguf_writer_add_u32(w, "late", 1, &err), TDM_ERR_INVALID);
    OK(tdm_gguf_writer_write_data(w, ne, 8, E));
    assert_int_equal(tdm_gguf_writer_finish(w, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tensor 't'"));
    tdm_gguf_writer_free(w);
    unlink(path);
}

/* Real-size vocabulary (248k tokens, 247k merges): correct O(1) access; the
 * open time is printed, not asserted. */
static void test_big_vocab(void **state)
{
    (void)state;
    enum { NTOK = 248320, NMERGE = 247587 };
    char *pool = malloc((size_t)NTOK * 16 + (size_t)NMERGE * 24);
    const char **toks = malloc(sizeof *toks * NTOK), **merges = malloc(sizeof *merges * NMERGE);
    int32_t *types = malloc(sizeof *types * NTOK);
    char *p = pool;
    for (int i = 0; i < NTOK; i++) { toks[i] = p; p += sprintf(p, "tok%d", i) + 1; types[i] = i % 7; }
    for (int i = 0; i < NMERGE; i++) { merges[i] = p; p += sprintf(p, "m%d m%d", i, i + 1) + 1; }
    tdm_gguf_writer *w;
    OK(tdm_gguf_writer_create(&w, E));
    OK(tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, NTOK, E));
    OK(tdm_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TDM_GGUF_INT32, types, NTOK, E));
    OK(tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, NMERGE, E));
    void *mem; size_t size; tdm_gguf *g;
    OK(tdm_gguf_writer_write_memory(w, &mem, &size, E));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    OK(tdm_gguf_open_memory(mem, size, &g, E));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("  open with %d tokens + %d merges (%zu bytes): %.2f ms\n", NTOK, NMERGE, size,
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    for (int k = 0; k < NTOK; k++) { /* every element, in an order the index must not depend on */
        uint64_t i = NTOK - 1 - (uint64_t)k, j = (uint64_t)k % NMERGE;
        const char *s; size_t n; int64_t v;
        OK(tdm_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &n, E));
        assert_int_equal(n, strlen(toks[i])); assert_memory_equal(s, toks[i], n);
        OK(tdm_gguf_arr_str(g, "tokenizer.ggml.merges", j, &s, &n, E));
        assert_int_equal(n, strlen(merges[j])); assert_memory_equal(s, merges[j], n);
        OK(tdm_gguf_arr_int(g, "tokenizer.ggml.token_type", i, &v, E));
        assert_int_equal(v, types[i]);
    }
    tdm_gguf_free(g);
    free(mem);
    tdm_gguf_writer_free(w);
    free(pool); free(toks); free(merges); free(types);
}

/* ------------------------------------------------------------------ content check */

/* Scale fields per type, restated from spec gguf.md §2.4 (kind: 0 fp16 scale
 * at the offsets, 1 plain f32, 2 plain f16, 3 plain bf16, 4 f32 d at 0, 5 MXFP4 e). */
static const struct { tdm_qtype t; int kind; int n; int off[2]; } k_check[] = {
    {TDM_Q_F32, 1, 0, {0}}, {TDM_Q_F16, 2, 0, {0}}, {TDM_Q_BF16, 3, 0, {0}},
    {TDM_Q_Q4_0, 0, 1, {0}}, {TDM_Q_Q4_1, 0, 2, {0, 2}}, {TDM_Q_Q5_0, 0, 1, {0}},
    {TDM_Q_Q5_1, 0, 2, {0, 2}}, {TDM_Q_Q8_0, 0, 1, {0}}, {TDM_Q_Q8_1, 0, 2, {0, 2}},
    {TDM_Q_Q2_K, 0, 2, {80, 82}}, {TDM_Q_Q3_K, 0, 1, {108}}, {TDM_Q_Q4_K, 0, 2, {0, 2}},
    {TDM_Q_Q5_K, 0, 2, {0, 2}}, {TDM_Q_Q6_K, 0, 1, {208}}, {TDM_Q_Q8_K, 4, 0, {0}},
    {TDM_Q_IQ2_XXS, 0, 1, {0}}, {TDM_Q_IQ2_XS, 0, 1, {0}}, {TDM_Q_IQ3_XXS, 0, 1, {0}},
    {TDM_Q_IQ1_S, 0, 1, {0}}, {TDM_Q_IQ4_NL, 0, 1, {0}}, {TDM_Q_IQ3_S, 0, 1, {0}},
    {TDM_Q_IQ2_S, 0, 1, {0}}, {TDM_Q_IQ4_XS, 0, 1, {0}}, {TDM_Q_TQ1_0, 0, 1, {52}},
    {TDM_Q_TQ2_0, 0, 1, {64}}, {TDM_Q_MXFP4, 5, 0, {0}}, {TDM_Q_Q1_0, 0, 1, {0}},
    {TDM_Q_Q2_0, 0, 1, {0}},
};

static void test_check_data(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof k_check / sizeof k_check[0]; c++) {
        const tdm_qtype_info *q = tdm_qtype_get(k_check[c].t);
        int64_t ne[2] = {(int64_t)q->block * 3, 5};
        size_t nblk = 15, nb = nblk * q->type_size;
        if (q->block == 1) { ne[0] = 33; nblk = 33 * 5; nb = nblk * q->type_size; }
        uint8_t *d = malloc(nb);
        fill_random(d, nb);
        /* make every checked field finite, leave the rest random */
        for (size_t i = 0; i < nblk; i++) {
            uint8_t *b = d + i * q->type_size;
            uint16_t h = (uint16_t)(rnd() & 0xbfff); /* exponent < 0x1f: finite fp16, and bf16 */
            uint32_t f = (uint32_t)(rnd() & 0xbfffffffu); /* finite f32 */
            switch (k_check[c].kind) {
            case 1: case 4: memcpy(b, &f, 4); break;
            case 2: case 3: memcpy(b, &h, 2); break;
            case 5: b[0] = (uint8_t)(rnd() % 255); break;
            default:
                for (int k = 0; k < k_check[c].n; k++) {
                    h = (uint16_t)(rnd() & 0xbfff);
                    memcpy(b + k_check[c].off[k], &h, 2);
                }
            }
        }
        tdm_gguf_writer *w;
        void *mem; size_t size; tdm_gguf *g;
        OK(tdm_gguf_writer_create(&w, E));
        OK(tdm_gguf_writer_add_tensor(w, "t", k_check[c].t, 2, ne, d, E));
        OK(tdm_gguf_writer_write_memory(w, &mem, &size, E));
        OK(tdm_gguf_open_memory(mem, size, &g, E));
        const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, "t");
        if (tdm_gguf_check_tensor_data(t, NULL) != TDM_OK)
            fail_msg("%s: clean tensor rejected", q->name);
        /* poison one field of one block/element (NaN or Inf) */
        for (int rep = 0; rep < 4; rep++) {
            size_t i = (size_t)(rnd() % nblk);
            uint8_t *b = (uint8_t *)t->data + i * q->type_size;
            uint8_t save[4];
            int off = k_check[c].n ? k_check[c].off[rnd() % (uint64_t)k_check[c].n] : 0;
            memcpy(save, b + off, 4 <= q->type_size - off ? 4 : 2);
            uint16_t h = rep & 1 ? 0x7c00 : 0x7e01;
            uint32_t f = rep & 1 ? 0x7f800000u : 0xffc00001u;
            switch (k_check[c].kind) {
            case 1: case 4: memcpy(b, &f, 4); break;
            case 3: h = rep & 1 ? 0x7f80 : 0xffc1; memcpy(b, &h, 2); break;
            case 5: b[0] = 0xff; break;
            default: memcpy(b + off, &h, 2);
            }
            tdm_error err = {0};
            assert_int_equal(tdm_gguf_check_tensor_data(t, &err), TDM_ERR_FORMAT);
            char expect[64];
            snprintf(expect, sizeof expect, "tensor 't': %s %zu ", q->block == 1 ? "element" : "block", i);
            if (!strstr(err.msg, expect)) fail_msg("%s: '%s' lacks '%s'", q->name, err.msg, expect);
            memcpy(b + off, save, 4 <= q->type_size - off ? 4 : 2);
            assert_int_equal(tdm_gguf_check_tensor_data(t, NULL), TDM_OK);
        }
        tdm_gguf_free(g);
        free(mem);
        free(d);
        tdm_gguf_writer_free(w);
    }
}

static void test_open_errors(void **state)
{
    (void)state;
    tdm_gguf *g = (tdm_gguf *)(uintptr_t)1;
    tdm_error err = {0};
    assert_int_equal(tdm_gguf_open("/nonexistent/x.gguf", &g, &err), TDM_ERR_IO);
    assert_null(g);
    assert_non_null(strstr(err.msg, "/nonexistent/x.gguf"));
    assert_int_equal(tdm_gguf_open("/tmp", &g, &err), TDM_ERR_IO);
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_gguf_e_%d.gguf", (int)getpid());
    FILE *f = fopen(path, "wb");
    fclose(f);
    assert_int_equal(tdm_gguf_open(path, &g, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "empty file"));
    unlink(path);
    /* NULL-safe accessors */
    assert_int_equal(tdm_gguf_tensor_count(NULL), 0);
    assert_int_equal(tdm_gguf_find_key(NULL, "x"), -1);
    assert_null(tdm_gguf_find_tensor(NULL, "x"));
    tdm_gguf_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_is_valid),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_empty_files),
        cmocka_unit_test(test_writer_paths),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_big_vocab),
        cmocka_unit_test(test_check_data),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
