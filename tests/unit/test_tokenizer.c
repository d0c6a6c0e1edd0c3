/* Tokenizer tests: fixture parity (qwen2, qwen35, demo vocab), round trip on
 * a generated corpus of >= 10,000 strings (invalid UTF-8, emoji, marks, CJK,
 * whitespace runs), the streaming detokeniser, synthetic vocabularies
 * (gpt2 pre-tokeniser, USER_DEFINED vs CONTROL, virtual merges) and hostile
 * metadata. Files are found under $TDM_ROOT (default "."). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "tokenizer.h"
#include "unicode.h"

static char *root_path(const char *rel)
{
    const char *root = getenv("TDM_ROOT");
    if (!root || !*root)
        root = ".";
    size_t n = strlen(root) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", root, rel);
    return p;
}

static char *read_file(const char *rel, size_t *len)
{
    char *p = root_path(rel);
    FILE *f = fopen(p, "rb");
    if (!f)
        fail_msg("cannot open %s", p);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    free(p);
    if (len)
        *len = (size_t)n;
    return b;
}

static tdm_tokenizer *open_tk(const char *rel)
{
    char *p = root_path(rel);
    tdm_tokenizer *tk;
    tdm_error err;
    if (tdm_tokenizer_open(p, &tk, &err))
        fail_msg("%s: %s", p, err.msg);
    free(p);
    return tk;
}

#define QWEN2_GGUF "tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf"
#define QWEN35_GGUF "tests/fixtures/micro-qwen35moe/micro-qwen35moe-f32.gguf"
#define DEMO_GGUF "models/demo/demo-Q4_K_M.gguf"

/* ---- independent UTF-8 reference (value-range checks, not the lead-byte table) ---- */

static int ref_seq_len(const uint8_t *s, size_t n)
{
    int len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n)
        return 0;
    uint32_t cp = len == 1 ? s[0] : s[0] & (0xFF >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static size_t ref_sanitize(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int k = ref_seq_len((const uint8_t *)s + i, n - i);
        if (k == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        }
    }
    return o;
}

static int ref_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int k = ref_seq_len((const uint8_t *)s + i, n - i);
        if (!k)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

/* ---- checks shared by the tests ---- */

typedef struct buffers {
    int32_t *ids;
    size_t ids_cap;
    char *text, *clean, *stream, *chunk;
    size_t text_cap, chunk_cap;
} buffers;

static void buffers_init(buffers *b, const tdm_tokenizer *tk, size_t max_len)
{
    b->ids_cap = tdm_tokenizer_encode_bound(max_len);
    b->ids = malloc(b->ids_cap * sizeof *b->ids);
    b->text_cap = 3 * max_len + 16;
    b->text = malloc(b->text_cap);
    b->clean = malloc(b->text_cap);
    b->stream = malloc(b->text_cap);
    b->chunk_cap = tdm_detok_cap(tk);
    b->chunk = malloc(b->chunk_cap);
}

static void buffers_free(buffers *b)
{
    free(b->ids);
    free(b->text);
    free(b->clean);
    free(b->stream);
    free(b->chunk);
}

/* Streams ids through a tdm_detok; every chunk must be valid UTF-8. Returns the text length. */
static size_t stream_decode(const tdm_tokenizer *tk, buffers *b, const int32_t *ids, size_t n, unsigned flags)
{
    tdm_detok d;
    tdm_detok_init(&d, flags);
    size_t o = 0;
    tdm_error err;
    for (size_t i = 0; i < n; i++) {
        size_t m;
        if (tdm_detok_push(&d, tk, ids[i], b->chunk, b->chunk_cap, &m, &err))
            fail_msg("detok_push: %s", err.msg);
        if (!ref_valid(b->chunk, m))
            fail_msg("streamed chunk %zu (token %d) is not valid UTF-8", i, ids[i]);
        assert_true(o + m <= b->text_cap);
        memcpy(b->stream + o, b->chunk, m);
        o += m;
    }
    char tail[TDM_DETOK_FLUSH_MAX];
    size_t m = tdm_detok_flush(&d, tail);
    assert_true(m <= TDM_DETOK_FLUSH_MAX && ref_valid(tail, m));
    assert_true(o + m <= b->text_cap);
    memcpy(b->stream + o, tail, m);
    return o + m;
}

/* encode -> decode == sanitized input; streaming gives the same bytes. */
static void check_round_trip(const tdm_tokenizer *tk, buffers *b, const char *s, size_t n, unsigned flags)
{
    size_t nid, len;
    tdm_error err;
    if (tdm_tokenizer_encode(tk, s, n, flags, b->ids, b->ids_cap, &nid, &err))
        fail_msg("encode: %s", err.msg);
    if (tdm_tokenizer_decode(tk, b->ids, nid, TDM_DECODE_SPECIAL, b->text, b->text_cap, &len, &err))
        fail_msg("decode: %s", err.msg);
    size_t cn = ref_sanitize(s, n, b->clean);
    if (len != cn || memcmp(b->text, b->clean, cn) != 0) {
        fprintf(stderr, "input (%zu bytes):", n);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %02x", (uint8_t)s[i]);
        fprintf(stderr, "\n");
        fail_msg("round trip differs: %zu vs %zu bytes", len, cn);
    }
    size_t lib = tdm_utf8_sanitize(s, n, b->stream);
    assert_true(lib == cn && memcmp(b->stream, b->clean, cn) == 0);
    size_t sn = stream_decode(tk, b, b->ids, nid, TDM_DECODE_SPECIAL);
    assert_int_equal(sn, cn);
    assert_memory_equal(b->stream, b->clean, cn);
}

/* ---- fixture parity ---- */

static void run_fixture(const char *gguf, const char *json, const char *pre)
{
    tdm_tokenizer *tk = open_tk(gguf);
    char *txt = read_file(json, NULL);
    cJSON *j = cJSON_Parse(txt);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "pre")->valuestring, pre);
    buffers b;
    buffers_init(&b, tk, 4096);
    cJSON *t;
    int n_cases = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "tests"))
    {
        const char *s = cJSON_GetObjectItem(t, "text")->valuestring;
        const char *dec = cJSON_GetObjectItem(t, "decoded")->valuestring;
        cJSON *ex = cJSON_GetObjectItem(t, "ids");
        size_t nid, len;
        tdm_error err;
        assert_int_equal(tdm_tokenizer_encode(tk, s, strlen(s), TDM_TOKENIZE_PARSE_SPECIAL, b.ids, b.ids_cap,
                                              &nid, &err), TDM_OK);
        if ((int)nid != cJSON_GetArraySize(ex))
            fail_msg("'%s': %zu ids, want %d", s, nid, cJSON_GetArraySize(ex));
        for (size_t i = 0; i < nid; i++)
            if (b.ids[i] != cJSON_GetArrayItem(ex, (int)i)->valueint)
                fail_msg("'%s': id %zu is %d, want %d", s, i, b.ids[i], cJSON_GetArrayItem(ex, (int)i)->valueint);
        assert_int_equal(tdm_tokenizer_decode(tk, b.ids, nid, TDM_DECODE_SPECIAL, b.text, b.text_cap, &len, &err),
                         TDM_OK);
        assert_int_equal(len, strlen(dec));
        assert_string_equal(b.text, dec);
        assert_string_equal(b.text, s);
        check_round_trip(tk, &b, s, strlen(s), TDM_TOKENIZE_PARSE_SPECIAL);
        check_round_trip(tk, &b, s, strlen(s), 0);
        n_cases++;
    }
    assert_true(n_cases >= 15);
    buffers_free(&b);
    cJSON_Delete(j);
    free(txt);
    tdm_tokenizer_free(tk);
}

static void test_fixture_qwen2(void **state)
{
    (void)state;
    run_fixture(QWEN2_GGUF, "tests/fixtures/tokenizer-qwen2.tests.json", "qwen2");
}

static void test_fixture_qwen35(void **state)
{
    (void)state;
    run_fixture(QWEN35_GGUF, "tests/fixtures/tokenizer-qwen35.tests.json", "qwen35");
}

/* The other fixture models carry the same vocabularies. */
static void test_fixture_other_models(void **state)
{
    (void)state;
    run_fixture("tests/fixtures/micro-qwen3next/micro-qwen3next-f32.gguf", "tests/fixtures/tokenizer-qwen2.tests.json",
                "qwen2");
    run_fixture("tests/fixtures/small-qwen35moe/small-qwen35moe-Q4_K_M.gguf",
                "tests/fixtures/tokenizer-qwen35.tests.json", "qwen35");
}

/* reference.json prompts (ids only): decode, re-encode, same ids. */
static void test_reference_prompts(void **state)
{
    (void)state;
    static const char *const models[][2] = {
        {QWEN2_GGUF, "tests/fixtures/micro-qwen3moe/reference.json"},
        {QWEN35_GGUF, "tests/fixtures/micro-qwen35moe/reference.json"},
        {"tests/fixtures/micro-qwen3next/micro-qwen3next-f32.gguf", "tests/fixtures/micro-qwen3next/reference.json"},
        {"tests/fixtures/small-qwen35moe/small-qwen35moe-Q4_K_M.gguf", "tests/fixtures/small-qwen35moe/reference.json"},
    };
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        tdm_tokenizer *tk = open_tk(models[m][0]);
        char *txt = read_file(models[m][1], NULL);
        cJSON *j = cJSON_Parse(txt), *pr;
        assert_non_null(j);
        buffers b;
        buffers_init(&b, tk, 8192);
        int n_prompts = 0;
        cJSON_ArrayForEach(pr, cJSON_GetObjectItem(j, "prompts"))
        {
            cJSON *toks = cJSON_GetObjectItem(pr, "tokens");
            size_t n = (size_t)cJSON_GetArraySize(toks), len, n2;
            int32_t *want = malloc(n * sizeof *want);
            for (size_t i = 0; i < n; i++)
                want[i] = cJSON_GetArrayItem(toks, (int)i)->valueint;
            tdm_error err;
            assert_int_equal(tdm_tokenizer_decode(tk, want, n, TDM_DECODE_SPECIAL, b.text, b.text_cap, &len, &err), TDM_OK);
            assert_int_equal(tdm_tokenizer_encode(tk, b.text, len, TDM_TOKENIZE_PARSE_SPECIAL, b.ids, b.ids_cap, &n2, &err),
                             TDM_OK);
            if (n2 != n || memcmp(b.ids, want, n * sizeof *want))
                fail_msg("%s prompt '%s' does not re-encode to its ids", models[m][1], pr->string);
            free(want);
            n_prompts++;
        }
        assert_int_equal(n_prompts, 3);
        buffers_free(&b);
        cJSON_Delete(j);
        free(txt);
        tdm_tokenizer_free(tk);
    }
}

/* Demo model: llama.cpp's tokenisation of the prompts, and its greedy text. */
static void test_demo_prompts(void **state)
{
    (void)state;
    tdm_tokenizer *tk = open_tk(DEMO_GGUF);
    assert_int_equal(tdm_tokenizer_n_vocab(tk), 8192);
    assert_int_equal(tdm_tokenizer_pretok(tk), TDM_PRETOK_QWEN35);
    assert_int_equal(tdm_tokenizer_find(tk, "<|im_start|>"), 8186);
    assert_int_equal(tdm_tokenizer_find(tk, "<think>"), 8188);
    assert_int_equal(tdm_tokenizer_find(tk, "no such token"), -1);
    assert_true(tdm_tokenizer_is_eog(tk, 8187) && tdm_tokenizer_is_eog(tk, 8185));
    assert_false(tdm_tokenizer_is_eog(tk, 8186) || tdm_tokenizer_is_eog(tk, 198) || tdm_tokenizer_is_eog(tk, -1));
    assert_int_equal(tdm_tokenizer_eos(tk), 8187);
    assert_false(tdm_tokenizer_add_bos(tk));
    char *txt = read_file("models/demo/peer-greedy.json", NULL);
    cJSON *j = cJSON_Parse(txt), *c;
    buffers b;
    buffers_init(&b, tk, 4096);
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases"))
    {
        const char *prompt = cJSON_GetObjectItem(c, "prompt")->valuestring;
        cJSON *ex = cJSON_GetObjectItem(c, "prompt_tokens");
        size_t nid, len;
        tdm_error err;
        assert_int_equal(tdm_tokenizer_encode(tk, prompt, strlen(prompt), TDM_TOKENIZE_PARSE_SPECIAL, b.ids,
                                              b.ids_cap, &nid, &err), TDM_OK);
        assert_int_equal(nid, cJSON_GetArraySize(ex));
        for (size_t i = 0; i < nid; i++)
            assert_int_equal(b.ids[i], cJSON_GetArrayItem(ex, (int)i)->valueint);
        /* greedy_text is llama.cpp's detokenisation without specials */
        cJSON *g = cJSON_GetObjectItem(c, "greedy_tokens");
        size_t ng = (size_t)cJSON_GetArraySize(g);
        for (size_t i = 0; i < ng; i++)
            b.ids[i] = cJSON_GetArrayItem(g, (int)i)->valueint;
        assert_int_equal(tdm_tokenizer_decode(tk, b.ids, ng, 0, b.text, b.text_cap, &len, &err), TDM_OK);
        assert_string_equal(b.text, cJSON_GetObjectItem(c, "greedy_text")->valuestring);
        size_t sn = stream_decode(tk, &b, b.ids, ng, 0);
        assert_int_equal(sn, len);
        assert_memory_equal(b.stream, b.text, len);
        n_cases++;
    }
    assert_int_equal(n_cases, 5);
    buffers_free(&b);
    cJSON_Delete(j);
    free(txt);
    tdm_tokenizer_free(tk);
}

/* ---- generated corpus ---- */

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)((rng_state >> 11) % n);
}

static size_t put_cp(char *o, uint32_t cp)
{
    return tdm_utf8_encode(cp, (uint8_t *)o);
}

static const char *const real_strings[] = {
    "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election.",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "3 33 333 3333 33333 3.14159 1,000,000 2026-11-30",
    "\xF0\x9F\x9A\x80 (normal) \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F \xE2\x9C\x85 \xF0\x9F\xA6\x99",
    "\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8" "apple\xE5\xB7\xA5\xE4\xBD\x9C" "1314151\xE5\xA4\xA9\xEF\xBD\x9E",
    "caf\xC3\xA9 vs cafe\xCC\x81 na\xC3\xAFve \xE0\xA4\x95\xE0\xA4\xBF\xE0\xA4\xA4\xE0\xA4\xBE\xE0\xA4\xAC",
    "def main(argc, argv):\n    return argv[1] * 2  # comment\n",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n391<|im_end|>",
    "a<think>b</think>c<tool_call>{\"x\": 1}</tool_call>",
    "   leading and trailing spaces   ",
    "\r\n\r\n\t\t  \xE3\x80\x80\xC2\xA0\xE2\x80\xA8 x\xE2\x80\x83y",
    "<|im_<|im_start|start|>><think<think>></think",
};

static const uint32_t cp_pools[][2] = {
    {0x20, 0x7E},       /* ASCII */
    {0xA0, 0x24F},      /* Latin-1, Latin extended */
    {0x300, 0x36F},     /* combining marks */
    {0x400, 0x4FF},     /* Cyrillic */
    {0x600, 0x6FF},     /* Arabic (incl. digits) */
    {0x900, 0x97F},     /* Devanagari (letters + marks) */
    {0x2000, 0x206F},   /* general punctuation, odd spaces, ZWJ */
    {0x3000, 0x303F},   /* CJK punctuation, ideographic space */
    {0x4E00, 0x9FFF},   /* CJK */
    {0xE000, 0xE0FF},   /* private use */
    {0xFE00, 0xFE0F},   /* variation selectors */
    {0x1F300, 0x1FAFF}, /* emoji */
    {0x10000, 0x10FFFF} /* anything astral, mostly unassigned */
};

/* Writes one test string of kind k into o (at most 1400 bytes); returns its length. */
static size_t gen_string(char *o, int k)
{
    size_t n = 0;
    switch (k) {
    case 0: /* random bytes: mostly invalid UTF-8 */
        for (uint32_t i = 0, len = rnd(64); i < len; i++)
            o[n++] = (char)rnd(256);
        break;
    case 1: { /* code points from the pools, plus whitespace */
        static const uint32_t ws[] = {' ', '\n', '\r', '\t', 0x3000, 0xA0, 0x2028, 0x85, 0x200D, 0xFE0F, '\'', '0'};
        for (uint32_t i = 0, len = rnd(120); i < len; i++) {
            if (rnd(4) == 0) {
                n += put_cp(o + n, ws[rnd(sizeof ws / sizeof ws[0])]);
                continue;
            }
            const uint32_t *p = cp_pools[rnd(sizeof cp_pools / sizeof cp_pools[0])];
            uint32_t cp = p[0] + rnd(p[1] - p[0] + 1);
            if (cp >= 0xD800 && cp <= 0xDFFF)
                cp = 0xFFFD;
            n += put_cp(o + n, cp);
        }
        break;
    }
    case 2: /* long whitespace runs between words */
        for (uint32_t i = 0, len = 1 + rnd(6); i < len; i++) {
            static const char wsc[] = " \t\n\r\v\f";
            for (uint32_t r = 0, rl = rnd(200); r < rl; r++)
                o[n++] = wsc[rnd(rnd(2) ? 1 : 6)];
            for (uint32_t r = 0, rl = rnd(8); r < rl; r++)
                o[n++] = (char)('a' + rnd(26));
        }
        break;
    case 3: { /* slices of real strings (may cut a code point) */
        const char *s = real_strings[rnd(sizeof real_strings / sizeof real_strings[0])];
        size_t sl = strlen(s), a = rnd((uint32_t)sl + 1), b = a + rnd((uint32_t)(sl - a) + 1);
        memcpy(o, s + a, b - a);
        n = b - a;
        break;
    }
    case 4: { /* contractions and specials glued to text */
        static const char *const parts[] = {"'s", "'T", "'rE", "'VE", "'m", "'Ll", "'d", "'", "x", " ", "<think>",
                                            "</think>", "<|im_start|>", "<|im_end|>", "<|im_", "\n", "12", ".."};
        for (uint32_t i = 0, len = rnd(20); i < len; i++) {
            const char *p = parts[rnd(sizeof parts / sizeof parts[0])];
            memcpy(o + n, p, strlen(p));
            n += strlen(p);
        }
        break;
    }
    default: { /* malformed sequences mixed with text */
        static const char *const bad[] = {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF8\x88",
                                          "\xE4\xB8", "\xF0\x9F\x98", "\x80\x80", "\xFF", "\xC3", "\xEF\xBF\xBD"};
        for (uint32_t i = 0, len = rnd(12); i < len; i++) {
            const char *p = rnd(2) ? bad[rnd(sizeof bad / sizeof bad[0])] : "ab c";
            memcpy(o + n, p, strlen(p));
            n += strlen(p);
        }
        break;
    }
    }
    return n;
}

static int round_trip_corpus(const char *gguf, int count, int kind_offset)
{
    tdm_tokenizer *tk = open_tk(gguf);
    buffers b;
    buffers_init(&b, tk, 2048);
    char s[2048];
    int done = 0;
    for (int i = 0; i < count; i++) {
        size_t n = gen_string(s, (i + kind_offset) % 6);
        check_round_trip(tk, &b, s, n, (i & 1) ? TDM_TOKENIZE_PARSE_SPECIAL : 0);
        done++;
    }
    for (size_t i = 0; i < sizeof real_strings / sizeof real_strings[0]; i++, done++)
        check_round_trip(tk, &b, real_strings[i], strlen(real_strings[i]), TDM_TOKENIZE_PARSE_SPECIAL);
    buffers_free(&b);
    tdm_tokenizer_free(tk);
    return done;
}

static void test_round_trip_corpus(void **state)
{
    (void)state;
    int n = round_trip_corpus(DEMO_GGUF, 6000, 0) + round_trip_corpus(QWEN2_GGUF, 4000, 3);
    assert_true(n >= 10000);
    printf("round trip: %d strings identical after U+FFFD replacement\n", n);
}

/* A long input: one word of 100k letters and a 100k whitespace run (BPE heap, scanner). */
static void test_long_runs(void **state)
{
    (void)state;
    tdm_tokenizer *tk = open_tk(QWEN35_GGUF);
    size_t n = 200000;
    char *s = malloc(n);
    for (size_t i = 0; i < n / 2; i++)
        s[i] = (char)('a' + (i * 7 % 26));
    memset(s + n / 2, ' ', n / 2 - 1);
    s[n - 1] = 'x';
    buffers b;
    buffers_init(&b, tk, n);
    check_round_trip(tk, &b, s, n, 0);
    buffers_free(&b);
    free(s);
    tdm_tokenizer_free(tk);
}

/* Random token sequences: the stream never emits broken UTF-8 and equals the sanitised raw text. */
static void test_stream_random_ids(void **state)
{
    (void)state;
    tdm_tokenizer *tk = open_tk(DEMO_GGUF);
    buffers b;
    buffers_init(&b, tk, 2048);
    int32_t ids[24];
    int32_t nv = tdm_tokenizer_n_vocab(tk);
    for (int it = 0; it < 3000; it++) {
        size_t n = 1 + rnd(24), len;
        for (size_t i = 0; i < n; i++) /* favour the byte tokens (ids < 256) that split code points */
            ids[i] = rnd(3) ? (int32_t)(0x40 + rnd(0xC0)) : (int32_t)rnd((uint32_t)nv);
        tdm_error err;
        assert_int_equal(tdm_tokenizer_decode(tk, ids, n, TDM_DECODE_SPECIAL, b.text, b.text_cap, &len, &err), TDM_OK);
        size_t cn = ref_sanitize(b.text, len, b.clean);
        size_t sn = stream_decode(tk, &b, ids, n, TDM_DECODE_SPECIAL);
        assert_int_equal(sn, cn);
        assert_memory_equal(b.stream, b.clean, cn);
    }
    /* a 4-byte emoji split over its byte tokens: nothing until the last byte */
    tdm_detok d;
    tdm_detok_init(&d, 0);
    const uint8_t emoji[4] = {0xF0, 0x9F, 0xA6, 0x99};
    char byte_text[8];
    for (int i = 0; i < 4; i++) {
        uint32_t cp = emoji[i] >= 0xA1 && emoji[i] != 0xAD ? emoji[i] : 0; /* 0x9F, 0x99: remapped bytes */
        int32_t id = -1;
        if (cp) {
            byte_text[put_cp(byte_text, cp)] = '\0';
            id = tdm_tokenizer_find(tk, byte_text);
        } else {
            for (int32_t t = 0; t < nv && id < 0; t++) { /* the token whose piece is that single byte */
                size_t pl;
                const char *p = tdm_tokenizer_piece(tk, t, &pl);
                if (pl == 1 && (uint8_t)p[0] == emoji[i])
                    id = t;
            }
        }
        assert_true(id >= 0);
        size_t m;
        tdm_error err;
        assert_int_equal(tdm_detok_push(&d, tk, id, b.chunk, b.chunk_cap, &m, &err), TDM_OK);
        assert_int_equal(m, i < 3 ? 0 : 4);
    }
    assert_memory_equal(b.chunk, emoji, 4);
    buffers_free(&b);
    tdm_tokenizer_free(tk);
}

static void test_api_errors(void **state)
{
    (void)state;
    tdm_tokenizer *tk = open_tk(QWEN2_GGUF);
    tdm_error err;
    int32_t ids[4];
    size_t n, len;
    const char *s = "Hello world, this is long";
    assert_int_equal(tdm_tokenizer_encode(tk, s, strlen(s), 0, NULL, 0, &n, &err), TDM_ERR_INVALID);
    assert_true(n > 4);
    size_t need = n;
    assert_int_equal(tdm_tokenizer_encode(tk, s, strlen(s), 0, ids, 4, &n, &err), TDM_ERR_INVALID);
    assert_int_equal(n, need);
    assert_int_equal(tdm_tokenizer_encode(tk, "", 0, 0, ids, 4, &n, &err), TDM_OK);
    assert_int_equal(n, 0);
    int32_t bad[2] = {1, 2048};
    char out[8];
    assert_int_equal(tdm_tokenizer_decode(tk, bad, 2, 0, out, sizeof out, &len, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "2048"));
    int32_t many[8] = {745, 300, 78, 858, 745, 300, 78, 858}; /* "Hello worldHello world" */
    assert_int_equal(tdm_tokenizer_decode(tk, many, 8, 0, out, sizeof out, &len, &err), TDM_ERR_INVALID);
    assert_int_equal(len, 22);
    assert_int_equal(strlen(out), 7);
    tdm_detok d;
    tdm_detok_init(&d, 0);
    assert_int_equal(tdm_detok_push(&d, tk, 1, out, sizeof out, &len, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_detok_push(&d, tk, -3, out, sizeof out, &len, &err), TDM_ERR_INVALID);
    assert_null(tdm_tokenizer_piece(tk, 5000, NULL));
    assert_int_equal(tdm_tokenizer_token_type(tk, 2034), TDM_TOKEN_CONTROL);
    assert_int_equal(tdm_tokenizer_token_type(tk, 2040), TDM_TOKEN_UNUSED);
    /* CONTROL tokens: split out only with PARSE_SPECIAL, dropped by decode without SPECIAL */
    const char *chat = "<|im_start|>hi";
    int32_t big[64];
    assert_int_equal(tdm_tokenizer_encode(tk, chat, strlen(chat), TDM_TOKENIZE_PARSE_SPECIAL, big, 64, &n, &err), TDM_OK);
    assert_int_equal(big[0], 2034);
    assert_int_equal(tdm_tokenizer_decode(tk, big, n, 0, out, sizeof out, &len, &err), TDM_OK);
    assert_string_equal(out, "hi");
    assert_int_equal(tdm_tokenizer_encode(tk, chat, strlen(chat), 0, big, 64, &n, &err), TDM_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(big[i] < 2033);
    tdm_tokenizer_free(tk);
    char *missing = root_path("tests/fixtures/no-such-model.gguf");
    assert_int_not_equal(tdm_tokenizer_open(missing, &tk, &err), TDM_OK);
    assert_null(tk);
    free(missing);
}

/* ---- synthetic vocabularies ---- */

typedef struct synth {
    const char *model, *pre;  /* NULL: key absent */
    const char *extra_merge;  /* appended to the merges */
    int special_type;         /* type of "<think>" */
    int bad_type;             /* non-zero: token 0 gets this type */
} synth;

/* 256 byte-level symbols, "12", "123", "Ġw", "<think>", "<|im_start|>"; merges
 * "1 2", "12 3", "Ġ w", "Ġw o" (the last makes a virtual "Ġwo"). */
static tdm_status synth_load(const synth *o, tdm_tokenizer **tk, tdm_error *err)
{
    const char *toks[300];
    char bytes[256][4];
    int32_t types[300];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) ? (uint32_t)b : 0;
        if (!cp) { /* rank among remapped bytes */
            uint32_t k = 0;
            for (int c = 0; c < b; c++)
                k += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
            cp = 0x100 + k;
        }
        bytes[b][put_cp(bytes[b], cp)] = '\0';
        types[n] = 1;
        toks[n++] = bytes[b];
    }
    const char *extra[] = {"12", "123", "\xC4\xA0w", "<think>", "<|im_start|>"};
    for (int i = 0; i < 5; i++) {
        types[n] = i == 3 ? o->special_type : i == 4 ? 3 : 1;
        toks[n++] = extra[i];
    }
    if (o->bad_type)
        types[0] = o->bad_type;
    const char *merges[5] = {"1 2", "12 3", "\xC4\xA0 w", "\xC4\xA0w o", o->extra_merge};
    tdm_gguf_writer *w;
    tdm_status st = tdm_gguf_writer_create(&w, err);
    if (st)
        return st;
    if (o->model)
        st = tdm_gguf_writer_add_str(w, "tokenizer.ggml.model", o->model, err);
    if (!st && o->pre)
        st = tdm_gguf_writer_add_str(w, "tokenizer.ggml.pre", o->pre, err);
    if (!st)
        st = tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n, err);
    if (!st)
        st = tdm_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TDM_GGUF_INT32, types, (uint64_t)n, err);
    if (!st)
        st = tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, NULL, o->extra_merge ? 5 : 4, err);
    if (!st)
        st = tdm_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 9999, err); /* out of range: ignored */
    void *buf = NULL;
    size_t size;
    if (!st)
        st = tdm_gguf_writer_write_memory(w, &buf, &size, err);
    tdm_gguf_writer_free(w);
    tdm_gguf *g = NULL;
    if (!st)
        st = tdm_gguf_open_memory(buf, size, &g, err);
    *tk = NULL;
    if (!st)
        st = tdm_tokenizer_load(g, tk, err);
    tdm_gguf_free(g);
    free(buf);
    return st;
}

static size_t enc(tdm_tokenizer *tk, const char *s, unsigned flags, int32_t *ids)
{
    size_t n;
    tdm_error err;
    if (tdm_tokenizer_encode(tk, s, strlen(s), flags, ids, 64, &n, &err))
        fail_msg("encode: %s", err.msg);
    return n;
}

static void test_synthetic_vocab(void **state)
{
    (void)state;
    tdm_tokenizer *tk;
    tdm_error err;
    int32_t ids[64];
    /* gpt2 keeps digit runs together, qwen2 splits single digits */
    synth o = {"gpt2", "gpt2", NULL, 4, 0};
    assert_int_equal(synth_load(&o, &tk, &err), TDM_OK);
    assert_int_equal(tdm_tokenizer_pretok(tk), TDM_PRETOK_GPT2);
    assert_int_equal(tdm_tokenizer_eos(tk), -1);
    assert_int_equal(enc(tk, "123", 0, ids), 1);
    assert_int_equal(ids[0], 257);
    /* "Ġw o" merges into a symbol the vocab lacks: its bytes come out as 1-byte tokens */
    assert_int_equal(enc(tk, " wo", 0, ids), 2); /* 'Ġ' (C4 A0) has no 1-byte token: dropped */
    assert_int_equal(ids[0], 'w');
    assert_int_equal(ids[1], 'o');
    tdm_tokenizer_free(tk);
    o.pre = "qwen2";
    assert_int_equal(synth_load(&o, &tk, &err), TDM_OK);
    assert_int_equal(enc(tk, "123", 0, ids), 3);
    /* USER_DEFINED <think> is split out even without PARSE_SPECIAL, CONTROL is not */
    assert_int_equal(enc(tk, "a<think>b", 0, ids), 3);
    assert_int_equal(ids[1], 259);
    size_t n = enc(tk, "<|im_start|>", 0, ids);
    assert_true(n > 1);
    assert_int_equal(enc(tk, "<|im_start|>", TDM_TOKENIZE_PARSE_SPECIAL, ids), 1);
    assert_int_equal(ids[0], 260);
    char out[32];
    size_t len;
    int32_t think = 259;
    assert_int_equal(tdm_tokenizer_decode(tk, &think, 1, 0, out, sizeof out, &len, &err), TDM_OK);
    assert_string_equal(out, "<think>");
    tdm_tokenizer_free(tk);
    o.special_type = 3; /* as CONTROL, <think> needs PARSE_SPECIAL */
    assert_int_equal(synth_load(&o, &tk, &err), TDM_OK);
    assert_true(enc(tk, "a<think>b", 0, ids) > 3);
    assert_int_equal(tdm_tokenizer_decode(tk, &think, 1, 0, out, sizeof out, &len, &err), TDM_OK);
    assert_string_equal(out, "");
    tdm_tokenizer_free(tk);
}

static void expect_load_error(synth o, tdm_status code, const char *needle)
{
    tdm_tokenizer *tk;
    tdm_error err = {0};
    assert_int_equal(synth_load(&o, &tk, &err), code);
    assert_null(tk);
    if (!strstr(err.msg, needle))
        fail_msg("error '%s' does not mention '%s'", err.msg, needle);
}

static void test_hostile_metadata(void **state)
{
    (void)state;
    expect_load_error((synth){"llama", "qwen2", NULL, 4, 0}, TDM_ERR_UNSUPPORTED, "tokenizer.ggml.model");
    expect_load_error((synth){NULL, "qwen2", NULL, 4, 0}, TDM_ERR_FORMAT, "tokenizer.ggml.model");
    expect_load_error((synth){"gpt2", "klingon", NULL, 4, 0}, TDM_ERR_UNSUPPORTED, "klingon");
    expect_load_error((synth){"gpt2", "qwen2", "nospace", 4, 0}, TDM_ERR_FORMAT, "merges[4]");
    expect_load_error((synth){"gpt2", "qwen2", " ", 4, 0}, TDM_ERR_FORMAT, "merges[4]");
    expect_load_error((synth){"gpt2", "qwen2", NULL, 4, 9}, TDM_ERR_FORMAT, "token_type[0]");
    /* no pre key: gpt2 with a warning */
    tdm_tokenizer *tk;
    tdm_error err;
    assert_int_equal(synth_load(&(synth){"gpt2", NULL, NULL, 4, 0}, &tk, &err), TDM_OK);
    assert_int_equal(tdm_tokenizer_pretok(tk), TDM_PRETOK_GPT2);
    tdm_tokenizer_free(tk);
    /* a merge whose left part starts with a space ("  x" = " " + "x") is legal */
    assert_int_equal(synth_load(&(synth){"gpt2", "qwen2", "  x", 4, 0}, &tk, &err), TDM_OK);
    tdm_tokenizer_free(tk);
}

static void test_unicode_tables(void **state)
{
    (void)state;
    assert_true(tdm_unicode_flags('a') & TDM_UCF_LETTER);
    assert_true(tdm_unicode_flags('7') & TDM_UCF_NUMBER);
    assert_true(tdm_unicode_flags(0x0663) & TDM_UCF_NUMBER);  /* Arabic-Indic three */
    assert_true(tdm_unicode_flags(0x0301) & TDM_UCF_MARK);
    assert_true(tdm_unicode_flags(0x4E00) & TDM_UCF_LETTER);
    assert_true(tdm_unicode_flags(0x3000) & TDM_UCF_WHITESPACE);
    assert_true(tdm_unicode_flags(0x2009) & TDM_UCF_WHITESPACE);
    assert_false(tdm_unicode_flags(0x200D) & TDM_UCF_WHITESPACE);
    assert_true(tdm_unicode_flags(0x1F680) & TDM_UCF_SYMBOL);
    assert_int_equal(tdm_unicode_flags(0x50000), TDM_UCF_UNDEFINED); /* unassigned: non-zero */
    assert_int_equal(tdm_unicode_flags(0x110000), 0);
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp += 97)
        assert_true(tdm_unicode_flags(cp) != 0);
    assert_int_equal(tdm_unicode_tolower('Q'), 'q');
    assert_int_equal(tdm_unicode_tolower(0x0416), 0x0436); /* Ж -> ж */
    assert_int_equal(tdm_unicode_tolower(0x0130), 'i');    /* İ -> i (first code point) */
    assert_int_equal(tdm_unicode_tolower(0x4E00), 0x4E00);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unicode_tables),   cmocka_unit_test(test_fixture_qwen2),
        cmocka_unit_test(test_fixture_qwen35),   cmocka_unit_test(test_fixture_other_models),
        cmocka_unit_test(test_reference_prompts), cmocka_unit_test(test_demo_prompts),
        cmocka_unit_test(test_round_trip_corpus), cmocka_unit_test(test_long_runs),
        cmocka_unit_test(test_stream_random_ids), cmocka_unit_test(test_api_errors),
        cmocka_unit_test(test_synthetic_vocab),  cmocka_unit_test(test_hostile_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
