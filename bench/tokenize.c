/* tokenize: tokenizer speed on one core.
 *  - encode / decode / stream-decode 1 MB of mixed text (English prose, code,
 *    CJK, emoji, whitespace runs) with the demo vocab (qwen35) and a micro
 *    fixture vocab (qwen2);
 *  - load time of the demo vocab and of a synthetic vocab of Qwen3.5's size
 *    (248,320 tokens, ~248k merges) built in memory with the GGUF writer,
 *    and encoding the same 1 MB with it.
 * Times are CPU seconds of the calling thread (best of 3).
 * Prints a table; writes JSON (default bench/results/tokenize.json).
 *   tokenize [--out FILE] [--mb N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "tokenizer.h"
#include "bench_json.h"

/* Thread CPU time: the machine may be shared, and every case runs on one core. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

_Noreturn static void die(const char *what, const tdm_error *err)
{
    fprintf(stderr, "bench tokenize: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)((rs >> 11) % n);
}

static const char *const pieces[] = {
    ("The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
     "produced no evidence that any irregularities took place. "),
    "It's been 1,234 days; they'll say we've won 56.7% of 2026-11-30's vote! ",
    "def main(argc, argv):\n    return argv[1] * 2  # comment\n\n",
    "    if (x == NULL) {\n        return -1;\n    }\n",
    "\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8\xE5\xB7\xA5\xE4\xBD\x9C\xE5\xA4\xA9\xE3\x80\x82 ",
    "caf\xC3\xA9 na\xC3\xAFve \xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE \xE0\xA4\x95\xE0\xA4\xBF\xE0\xA4\xA4\xE0\xA4\xBE\xE0\xA4\xAC ",
    "\xF0\x9F\x9A\x80 \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F \xE2\x9C\x85 ",
    "\n\n   \t  \n",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n391<|im_end|>\n",
};

static char *make_text(size_t n)
{
    char *t = malloc(n + 256);
    size_t o = 0;
    while (o < n) {
        const char *p = pieces[rnd(sizeof pieces / sizeof pieces[0])];
        size_t k = strlen(p);
        memcpy(t + o, p, k);
        o += k;
    }
    return t;
}

typedef struct row {
    const char *name;
    double seconds, bytes, tokens;
} row;

static row rows[16];
static int n_rows;

static double best_of(int reps, double (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t = fn(arg);
        if (t < best)
            best = t;
    }
    return best;
}

typedef struct job {
    tdm_tokenizer *tk;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t cap, n;
    char *out;
    size_t out_cap;
} job;

static double run_encode(void *a)
{
    job *j = a;
    tdm_error err;
    double t0 = now();
    if (tdm_tokenizer_encode(j->tk, j->text, j->len, TDM_TOKENIZE_PARSE_SPECIAL, j->ids, j->cap, &j->n, &err))
        die("encode", &err);
    return now() - t0;
}

static double run_decode(void *a)
{
    job *j = a;
    tdm_error err;
    size_t len;
    double t0 = now();
    if (tdm_tokenizer_decode(j->tk, j->ids, j->n, TDM_DECODE_SPECIAL, j->out, j->out_cap, &len, &err))
        die("decode", &err);
    return now() - t0;
}

static double run_stream(void *a)
{
    job *j = a;
    tdm_error err;
    tdm_detok d;
    tdm_detok_init(&d, TDM_DECODE_SPECIAL);
    size_t cap = tdm_detok_cap(j->tk), o = 0, m;
    double t0 = now();
    for (size_t i = 0; i < j->n; i++) {
        if (tdm_detok_push(&d, j->tk, j->ids[i], j->out + o, cap, &m, &err))
            die("detok", &err);
        o += m;
    }
    o += tdm_detok_flush(&d, j->out + o);
    return now() - t0;
}

static void bench_text(const char *label, const char *path, const char *text, size_t len)
{
    tdm_tokenizer *tk;
    tdm_error err;
    double t0 = now();
    if (tdm_tokenizer_open(path, &tk, &err))
        die(path, &err);
    double load = now() - t0;
    job j = {tk, text, len, NULL, tdm_tokenizer_encode_bound(len), 0, NULL, 0};
    j.ids = malloc(j.cap * sizeof *j.ids);
    j.out_cap = len + tdm_detok_cap(tk) + 16;
    j.out = malloc(j.out_cap);
    char *name = malloc(4 * 64);
    snprintf(name, 64, "load %s vocab", label);
    rows[n_rows++] = (row){name, load, 0, tdm_tokenizer_n_vocab(tk)};
    double enc = best_of(3, run_encode, &j);
    snprintf(name + 64, 64, "encode %s", label);
    rows[n_rows++] = (row){name + 64, enc, (double)len, (double)j.n};
    double dec = best_of(3, run_decode, &j);
    snprintf(name + 128, 64, "decode %s", label);
    rows[n_rows++] = (row){name + 128, dec, (double)len, (double)j.n};
    double str = best_of(3, run_stream, &j);
    snprintf(name + 192, 64, "stream-decode %s", label);
    rows[n_rows++] = (row){name + 192, str, (double)len, (double)j.n};
    free(j.ids);
    free(j.out);
    tdm_tokenizer_free(tk);
}

/* ---- a vocabulary of Qwen3.5's size: random merges of existing tokens ---- */

static void bench_big_vocab(const char *text, size_t len)
{
    const int n_tok = 248320, n_special = 33;
    char **tok = malloc((size_t)n_tok * sizeof *tok);
    char **merge = malloc((size_t)n_tok * sizeof *merge);
    int32_t *types = malloc((size_t)n_tok * sizeof *types);
    int n = 0, nm = 0;
    for (int b = 0; b < 256; b++) { /* the byte-level alphabet, in byte order */
        int ok = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE, k = 0;
        for (int c = 0; c < b && !ok; c++)
            k += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        unsigned cp = ok ? (unsigned)b : 0x100u + (unsigned)k;
        tok[n] = malloc(3);
        if (cp < 0x80) {
            tok[n][0] = (char)cp;
            tok[n][1] = 0;
        } else {
            tok[n][0] = (char)(0xC0 | (cp >> 6));
            tok[n][1] = (char)(0x80 | (cp & 0x3F));
            tok[n][2] = 0;
        }
        types[n++] = 1;
    }
    /* hash set of texts so that every merged token is new */
    size_t hcap = 1u << 20;
    int32_t *h = malloc(hcap * sizeof *h);
    memset(h, 0xff, hcap * sizeof *h);
    while (n < n_tok - n_special) {
        int a = (int)rnd((uint32_t)n), b = (int)rnd(n < 2000 ? (uint32_t)n : 2000u);
        size_t la = strlen(tok[a]), lb = strlen(tok[b]);
        if (la + lb > 24)
            continue;
        char buf[32];
        memcpy(buf, tok[a], la);
        memcpy(buf + la, tok[b], lb);
        buf[la + lb] = 0;
        uint64_t x = 1469598103934665603ull;
        for (size_t i = 0; i < la + lb; i++)
            x = (x ^ (uint8_t)buf[i]) * 1099511628211ull;
        size_t s = x & (hcap - 1);
        while (h[s] >= 0 && strcmp(tok[h[s]], buf))
            s = (s + 1) & (hcap - 1);
        if (h[s] >= 0)
            continue;
        h[s] = n;
        tok[n] = strdup(buf);
        types[n++] = 1;
        merge[nm] = malloc(la + lb + 2);
        snprintf(merge[nm++], la + lb + 2, "%s %s", tok[a], tok[b]);
    }
    for (int i = 0; i < n_special; i++) {
        tok[n] = malloc(24);
        snprintf(tok[n], 24, "<|special_%d|>", i);
        types[n++] = 3;
    }
    tdm_gguf_writer *w;
    tdm_error err;
    void *buf;
    size_t size;
    if (tdm_gguf_writer_create(&w, &err) || tdm_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", &err) ||
        tdm_gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen35", &err) ||
        tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, NULL, (uint64_t)n, &err) ||
        tdm_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TDM_GGUF_INT32, types, (uint64_t)n, &err) ||
        tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merge, NULL, (uint64_t)nm, &err) ||
        tdm_gguf_writer_write_memory(w, &buf, &size, &err))
        die("synthetic vocab", &err);
    tdm_gguf_writer_free(w);
    tdm_gguf *g;
    if (tdm_gguf_open_memory(buf, size, &g, &err))
        die("open synthetic", &err);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        tdm_tokenizer *tk;
        double t0 = now();
        if (tdm_tokenizer_load(g, &tk, &err))
            die("load synthetic", &err);
        double t = now() - t0;
        best = t < best ? t : best;
        tdm_tokenizer_free(tk);
    }
    rows[n_rows++] = (row){"load 248k-token vocab (synthetic)", best, (double)nm, (double)n};
    tdm_tokenizer *tk;
    if (tdm_tokenizer_load(g, &tk, &err))
        die("load synthetic", &err);
    job j = {tk, text, len, NULL, tdm_tokenizer_encode_bound(len), 0, NULL, 0};
    j.ids = malloc(j.cap * sizeof *j.ids);
    double enc = best_of(3, run_encode, &j);
    rows[n_rows++] = (row){"encode 248k-token vocab (synthetic)", enc, (double)len, (double)j.n};
    free(j.ids);
    tdm_tokenizer_free(tk);
    tdm_gguf_free(g);
    free(buf);
    for (int i = 0; i < n; i++)
        free(tok[i]);
    for (int i = 0; i < nm; i++)
        free(merge[i]);
    free(tok);
    free(merge);
    free(types);
    free(h);
}

int main(int argc, char **argv)
{
    const char *out = "bench/results/tokenize.json";
    double mb = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: tokenize [--out FILE] [--mb N]\n");
            return 2;
        }
    }
    const char *root = getenv("TDM_ROOT");
    char demo[4096], micro[4096];
    snprintf(demo, sizeof demo, "%s/models/demo/demo-Q4_K_M.gguf", root && *root ? root : ".");
    snprintf(micro, sizeof micro, "%s/tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf", root && *root ? root : ".");
    size_t len = (size_t)(mb * 1048576.0);
    char *text = make_text(len);
    bench_text("demo (qwen35, 8192)", demo, text, len);
    bench_text("micro (qwen2, 2048)", micro, text, len);
    bench_big_vocab(text, len);

    printf("%-36s %10s %10s %10s %10s\n", "case", "seconds", "MB/s", "tokens", "Mtok/s");
    cJSON *root_j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root_j, "results");
    cJSON_AddStringToObject(root_j, "bench", "tokenize");
    cJSON_AddNumberToObject(root_j, "text_bytes", (double)len);
    cJSON_AddStringToObject(root_j, "threads", "1");
    cJSON_AddStringToObject(root_j, "clock", "CLOCK_THREAD_CPUTIME_ID, best of 3");
    for (int i = 0; i < n_rows; i++) {
        row *r = &rows[i];
        double mbs = r->bytes > 0 ? r->bytes / 1048576.0 / r->seconds : 0;
        printf("%-36s %10.4f %10.1f %10.0f %10.2f\n", r->name, r->seconds, mbs, r->tokens,
               r->tokens / r->seconds / 1e6);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "case", r->name);
        cJSON_AddNumberToObject(o, "seconds", r->seconds);
        cJSON_AddNumberToObject(o, "mb_per_s", mbs);
        cJSON_AddNumberToObject(o, "tokens", r->tokens);
        cJSON_AddItemToArray(arr, o);
    }
    free(text);
    return bench_write_json(root_j, out);
}
