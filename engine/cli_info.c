/* tandem info: what a GGUF file holds (architecture, hyper-parameters,
 * tokenizer, tensor bytes by type, expert vs non-expert bytes) and whether
 * the file is complete. Opens with TDM_GGUF_OPEN_PARTIAL so that a truncated
 * download is described (and reported as incomplete, exit 1) rather than
 * only rejected. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"

const char tdm_cli_info_help[] =
    "describe a GGUF file: architecture, hyper-parameters, tensors, expert bytes, completeness\n"
    "usage: tandem info [MODEL.gguf] [--json] [--check]\n"
    "  MODEL.gguf   the file (default: the demo model)\n"
    "  --json       machine-readable output (one JSON object)\n"
    "  --check      also read every tensor: values and block scales must be finite\n"
    "               (llama.cpp --check-tensors); reads the whole file\n"
    "exit status: 0 complete (and clean) file, 1 unreadable, incomplete or failing\n"
    "the check, 2 usage error\n";

/* llama_ftype names (../shared/specs/gguf.md §2.1). */
static const char *ftype_name(uint32_t ft)
{
    static const char *const names[] = {
        [0] = "ALL_F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [7] = "Q8_0", [8] = "Q5_0",
        [9] = "Q5_1", [10] = "Q2_K", [11] = "Q3_K_S", [12] = "Q3_K_M", [13] = "Q3_K_L",
        [14] = "Q4_K_S", [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M", [18] = "Q6_K",
        [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S", [22] = "IQ3_XS", [23] = "IQ3_XXS",
        [24] = "IQ1_S", [25] = "IQ4_NL", [26] = "IQ3_S", [27] = "IQ3_M", [28] = "IQ2_S",
        [29] = "IQ2_M", [30] = "IQ4_XS", [31] = "IQ1_M", [32] = "BF16", [36] = "TQ1_0",
        [37] = "TQ2_0", [38] = "MXFP4_MOE", [39] = "NVFP4", [40] = "Q1_0", [41] = "Q2_0",
    };
    uint32_t base = ft & ~1024u;
    const char *n = base < sizeof names / sizeof names[0] ? names[base] : NULL;
    return n ? n : "?";
}

typedef struct type_stat { int64_t count; uint64_t bytes; } type_stat;

typedef struct layer_exp {
    int64_t n_expert;
    uint64_t gate, up, down, gate_up; /* bytes of ONE expert */
} layer_exp;

typedef struct summary {
    char arch[64];
    uint64_t tensor_bytes, expert_bytes, non_expert_bytes;
    int64_t expert_tensors;
    type_stat types[TDM_Q_COUNT];
    layer_exp *layers; /* [n_layers] */
    int64_t n_layers;
} summary;

static bool is_prefixed(const char *key, const char *arch)
{
    size_t n = strlen(arch);
    if (!strncmp(key, "general.", 8)) return true;
    return n && !strncmp(key, arch, n) && key[n] == '.';
}

/* "blk.N." -> N, else -1. */
static int64_t layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4)) return -1;
    char *end;
    long long v = strtoll(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && v >= 0 && v < 100000 ? v : -1;
}

static bool summarise(const tdm_gguf *g, summary *s)
{
    memset(s, 0, sizeof *s);
    const char *a;
    size_t alen;
    if (!tdm_gguf_get_str(g, "general.architecture", &a, &alen, NULL))
        snprintf(s->arch, sizeof s->arch, "%.*s", (int)(alen < 63 ? alen : 63), a);
    int64_t n_t = tdm_gguf_tensor_count(g);
    for (int64_t i = 0; i < n_t; i++) {
        int64_t l = layer_of(tdm_gguf_tensor_at(g, i)->name);
        if (l + 1 > s->n_layers) s->n_layers = l + 1;
    }
    s->layers = calloc(s->n_layers ? (size_t)s->n_layers : 1, sizeof *s->layers);
    if (!s->layers) return false;
    for (int64_t i = 0; i < n_t; i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(g, i);
        s->types[t->type].count++;
        s->types[t->type].bytes += t->nbytes;
        s->tensor_bytes += t->nbytes;
        if (!strstr(t->name, "_exps")) {
            s->non_expert_bytes += t->nbytes;
            continue;
        }
        s->expert_bytes += t->nbytes;
        s->expert_tensors++;
        int64_t l = layer_of(t->name);
        if (l < 0 || t->n_dims != 3 || t->ne[2] <= 0) continue;
        layer_exp *e = &s->layers[l];
        uint64_t one = t->nbytes / (uint64_t)t->ne[2];
        const char *kind = strchr(t->name + 4, '.') + 1;
        if (!strncmp(kind, "ffn_gate_exps.", 14)) e->gate = one;
        else if (!strncmp(kind, "ffn_up_exps.", 12)) e->up = one;
        else if (!strncmp(kind, "ffn_down_exps.", 14)) e->down = one;
        else if (!strncmp(kind, "ffn_gate_up_exps.", 17)) e->gate_up = one;
        else continue;
        e->n_expert = t->ne[2];
    }
    return true;
}

/* Scalar value as text (strings quoted and cut at 120 bytes). */
static void scalar_text(const tdm_gguf *g, const char *key, tdm_gguf_vtype t, char *buf, size_t cap)
{
    int64_t i64;
    uint64_t u64;
    double d;
    bool b;
    const char *s;
    size_t n;
    if (t == TDM_GGUF_UINT64 && !tdm_gguf_get_u64(g, key, &u64, NULL))
        snprintf(buf, cap, "%" PRIu64, u64);
    else if (!tdm_gguf_get_i64(g, key, &i64, NULL))
        snprintf(buf, cap, "%" PRId64, i64);
    else if (!tdm_gguf_get_f64(g, key, &d, NULL))
        snprintf(buf, cap, "%.9g", d);
    else if (!tdm_gguf_get_bool(g, key, &b, NULL))
        snprintf(buf, cap, "%s", b ? "true" : "false");
    else if (!tdm_gguf_get_str(g, key, &s, &n, NULL))
        snprintf(buf, cap, "\"%.*s\"%s", (int)(n > 120 ? 120 : n), s, n > 120 ? "..." : "");
    else
        snprintf(buf, cap, "?");
}

static void array_text(const tdm_gguf *g, const char *key, char *buf, size_t cap)
{
    tdm_gguf_vtype et;
    uint64_t n;
    if (tdm_gguf_get_arr(g, key, &et, &n, NULL)) {
        snprintf(buf, cap, "?");
        return;
    }
    if (n > 16 || et == TDM_GGUF_STRING || et == TDM_GGUF_ARRAY) {
        snprintf(buf, cap, "[%" PRIu64 " x %s]", n, tdm_gguf_vtype_name(et));
        return;
    }
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (uint64_t i = 0; i < n && k < cap; i++) {
        int64_t v;
        double d;
        if (!tdm_gguf_arr_int(g, key, i, &v, NULL))
            k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", v);
        else if (!tdm_gguf_arr_float(g, key, i, &d, NULL))
            k += (size_t)snprintf(buf + k, cap - k, "%s%.9g", i ? ", " : "", d);
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static void tokenizer_info(const tdm_gguf *g, const char **model, size_t *mlen, const char **pre,
                           size_t *plen, uint64_t *vocab, uint64_t *merges)
{
    *model = *pre = "";
    *mlen = *plen = 0;
    *vocab = *merges = 0;
    tdm_gguf_get_str(g, "tokenizer.ggml.model", model, mlen, NULL);
    tdm_gguf_get_str(g, "tokenizer.ggml.pre", pre, plen, NULL);
    tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, vocab, NULL);
    tdm_gguf_get_arr(g, "tokenizer.ggml.merges", NULL, merges, NULL);
}

static void print_text(const char *path, const tdm_gguf *g, const summary *s)
{
    char buf[512];
    const char *name = "", *model, *pre;
    size_t nlen = 0, mlen, plen;
    uint64_t vocab, merges;
    uint32_t ft = 0;
    bool have_ft = !tdm_gguf_get_u32(g, "general.file_type", &ft, NULL);
    tdm_gguf_get_str(g, "general.name", &name, &nlen, NULL);
    printf("file:              %s\n", path);
    printf("file size:         %" PRIu64 " bytes (%.2f MiB)\n", tdm_gguf_file_size(g),
           (double)tdm_gguf_file_size(g) / 1048576.0);
    printf("gguf:              version %u, alignment %u, data section at %" PRIu64 "\n",
           tdm_gguf_version(g), tdm_gguf_alignment(g), tdm_gguf_data_offset(g));
    printf("architecture:      %s\n", s->arch[0] ? s->arch : "(none)");
    printf("name:              %.*s\n", (int)nlen, name);
    if (have_ft) printf("file type:         %u (%s)\n", ft, ftype_name(ft));
    else printf("file type:         (not set)\n");
    printf("hyper-parameters:\n");
    for (int64_t i = 0; i < tdm_gguf_kv_count(g); i++) {
        const char *key = tdm_gguf_kv_key(g, i);
        tdm_gguf_vtype t = tdm_gguf_kv_type(g, i);
        if (!is_prefixed(key, s->arch)) continue;
        if (t == TDM_GGUF_ARRAY) array_text(g, key, buf, sizeof buf);
        else scalar_text(g, key, t, buf, sizeof buf);
        printf("  %-44s %s\n", key, buf);
    }
    tokenizer_info(g, &model, &mlen, &pre, &plen, &vocab, &merges);
    printf("tokenizer:         model %.*s, pre %.*s, vocab %" PRIu64 ", merges %" PRIu64 "\n",
           (int)mlen, model, (int)plen, pre, vocab, merges);
    printf("tensors:           %" PRId64 "\n", tdm_gguf_tensor_count(g));
    printf("tensor bytes:      %" PRIu64 "\n", s->tensor_bytes);
    printf("by type:\n");
    for (int t = 0; t < TDM_Q_COUNT; t++)
        if (s->types[t].count)
            printf("  %-8s %5" PRId64 " tensors %14" PRIu64 " bytes\n", tdm_qtype_name((uint32_t)t),
                   s->types[t].count, s->types[t].bytes);
    printf("expert bytes:      %" PRIu64 " (%" PRId64 " tensors named *_exps)\n", s->expert_bytes,
           s->expert_tensors);
    printf("non-expert bytes:  %" PRIu64 "\n", s->non_expert_bytes);
    printf("one expert (gate+up+down) per layer:\n");
    for (int64_t l = 0; l < s->n_layers; l++) {
        const layer_exp *e = &s->layers[l];
        if (!e->n_expert) continue;
        printf("  layer %3" PRId64 ": %10" PRIu64 " bytes  (gate %" PRIu64 ", up %" PRIu64
               ", down %" PRIu64 "%s; %" PRId64 " experts)\n",
               l, e->gate + e->up + e->down + e->gate_up, e->gate + e->gate_up, e->up, e->down,
               e->gate_up ? ", gate+up fused" : "", e->n_expert);
    }
    uint64_t end = tdm_gguf_data_end(g), size = tdm_gguf_file_size(g);
    if (tdm_gguf_complete(g))
        printf("complete:          yes (data ends at %" PRIu64 ", file size %" PRIu64 ")\n", end, size);
    else
        printf("complete:          NO: data ends at %" PRIu64 " but the file has %" PRIu64
               " bytes (%" PRIu64 " missing)\n", end, size, end - size);
}

static cJSON *value_json(const tdm_gguf *g, const char *key, tdm_gguf_vtype t)
{
    int64_t i64;
    uint64_t u64;
    double d;
    bool b;
    const char *s;
    size_t n;
    if (t == TDM_GGUF_ARRAY) {
        tdm_gguf_vtype et;
        uint64_t cnt;
        tdm_gguf_get_arr(g, key, &et, &cnt, NULL);
        if (cnt > 64 || et == TDM_GGUF_STRING || et == TDM_GGUF_ARRAY) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "array_of", tdm_gguf_vtype_name(et));
            cJSON_AddNumberToObject(o, "count", (double)cnt);
            return o;
        }
        cJSON *arr = cJSON_CreateArray();
        for (uint64_t i = 0; i < cnt; i++) {
            if (!tdm_gguf_arr_int(g, key, i, &i64, NULL)) cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)i64));
            else if (!tdm_gguf_arr_float(g, key, i, &d, NULL)) cJSON_AddItemToArray(arr, cJSON_CreateNumber(d));
        }
        return arr;
    }
    if (t == TDM_GGUF_UINT64 && !tdm_gguf_get_u64(g, key, &u64, NULL)) return cJSON_CreateNumber((double)u64);
    if (!tdm_gguf_get_i64(g, key, &i64, NULL)) return cJSON_CreateNumber((double)i64);
    if (!tdm_gguf_get_f64(g, key, &d, NULL)) return cJSON_CreateNumber(d);
    if (!tdm_gguf_get_bool(g, key, &b, NULL)) return cJSON_CreateBool(b);
    if (!tdm_gguf_get_str(g, key, &s, &n, NULL)) {
        char *c = malloc(n + 1);
        if (!c) return cJSON_CreateNull();
        memcpy(c, s, n);
        c[n] = '\0';
        cJSON *r = cJSON_CreateString(c);
        free(c);
        return r;
    }
    return cJSON_CreateNull();
}

static int print_json(const char *path, const tdm_gguf *g, const summary *s, bool check, int64_t bad)
{
    cJSON *o = cJSON_CreateObject();
    const char *name = "", *model, *pre;
    size_t nlen = 0, mlen, plen;
    uint64_t vocab, merges;
    uint32_t ft;
    char tmp[256];
    cJSON_AddStringToObject(o, "file", path);
    cJSON_AddNumberToObject(o, "file_size", (double)tdm_gguf_file_size(g));
    cJSON_AddNumberToObject(o, "version", tdm_gguf_version(g));
    cJSON_AddNumberToObject(o, "alignment", tdm_gguf_alignment(g));
    cJSON_AddNumberToObject(o, "data_offset", (double)tdm_gguf_data_offset(g));
    cJSON_AddNumberToObject(o, "data_end", (double)tdm_gguf_data_end(g));
    cJSON_AddBoolToObject(o, "complete", tdm_gguf_complete(g));
    cJSON_AddStringToObject(o, "architecture", s->arch);
    tdm_gguf_get_str(g, "general.name", &name, &nlen, NULL);
    snprintf(tmp, sizeof tmp, "%.*s", (int)(nlen < 255 ? nlen : 255), name);
    cJSON_AddStringToObject(o, "name", tmp);
    if (!tdm_gguf_get_u32(g, "general.file_type", &ft, NULL)) {
        cJSON_AddNumberToObject(o, "file_type", ft);
        cJSON_AddStringToObject(o, "file_type_name", ftype_name(ft));
    }
    cJSON *hp = cJSON_AddObjectToObject(o, "hparams");
    for (int64_t i = 0; i < tdm_gguf_kv_count(g); i++) {
        const char *key = tdm_gguf_kv_key(g, i);
        if (is_prefixed(key, s->arch)) cJSON_AddItemToObject(hp, key, value_json(g, key, tdm_gguf_kv_type(g, i)));
    }
    tokenizer_info(g, &model, &mlen, &pre, &plen, &vocab, &merges);
    cJSON *tk = cJSON_AddObjectToObject(o, "tokenizer");
    snprintf(tmp, sizeof tmp, "%.*s", (int)(mlen < 255 ? mlen : 255), model);
    cJSON_AddStringToObject(tk, "model", tmp);
    snprintf(tmp, sizeof tmp, "%.*s", (int)(plen < 255 ? plen : 255), pre);
    cJSON_AddStringToObject(tk, "pre", tmp);
    cJSON_AddNumberToObject(tk, "vocab_size", (double)vocab);
    cJSON_AddNumberToObject(tk, "merges", (double)merges);
    cJSON_AddNumberToObject(o, "tensor_count", (double)tdm_gguf_tensor_count(g));
    cJSON_AddNumberToObject(o, "tensor_bytes", (double)s->tensor_bytes);
    cJSON *ty = cJSON_AddObjectToObject(o, "types");
    for (int t = 0; t < TDM_Q_COUNT; t++) {
        if (!s->types[t].count) continue;
        cJSON *e = cJSON_AddObjectToObject(ty, tdm_qtype_name((uint32_t)t));
        cJSON_AddNumberToObject(e, "tensors", (double)s->types[t].count);
        cJSON_AddNumberToObject(e, "bytes", (double)s->types[t].bytes);
    }
    cJSON_AddNumberToObject(o, "expert_bytes", (double)s->expert_bytes);
    cJSON_AddNumberToObject(o, "expert_tensors", (double)s->expert_tensors);
    cJSON_AddNumberToObject(o, "non_expert_bytes", (double)s->non_expert_bytes);
    cJSON *ly = cJSON_AddArrayToObject(o, "expert_layers");
    for (int64_t l = 0; l < s->n_layers; l++) {
        const layer_exp *e = &s->layers[l];
        if (!e->n_expert) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "layer", (double)l);
        cJSON_AddNumberToObject(x, "n_expert", (double)e->n_expert);
        cJSON_AddNumberToObject(x, "one_expert_bytes", (double)(e->gate + e->up + e->down + e->gate_up));
        cJSON_AddNumberToObject(x, "gate", (double)(e->gate + e->gate_up));
        cJSON_AddNumberToObject(x, "up", (double)e->up);
        cJSON_AddNumberToObject(x, "down", (double)e->down);
        cJSON_AddBoolToObject(x, "gate_up_fused", e->gate_up != 0);
        cJSON_AddItemToArray(ly, x);
    }
    if (check) cJSON_AddNumberToObject(o, "check_failures", (double)bad);
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    if (!txt) {
        fprintf(stderr, "tandem info: out of memory\n");
        return 1;
    }
    puts(txt);
    cJSON_free(txt);
    return 0;
}

/* Content check of every tensor; failures go to stderr. Returns their count. */
static int64_t check_data(const tdm_gguf *g)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < tdm_gguf_tensor_count(g); i++) {
        tdm_error err;
        if (tdm_gguf_check_tensor_data(tdm_gguf_tensor_at(g, i), &err) != TDM_OK) {
            fprintf(stderr, "tandem info: %s\n", err.msg);
            bad++;
        }
    }
    return bad;
}

int tdm_cli_info(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false, check = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--check")) {
            check = true;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "tandem info: unexpected argument '%s'\n%s", argv[i], tdm_cli_info_help);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) path = tdm_cli_default_model();
    tdm_gguf *g;
    tdm_error err;
    if (tdm_gguf_open_ex(path, TDM_GGUF_OPEN_PARTIAL, &g, &err) != TDM_OK) {
        fprintf(stderr, "tandem info: %s\n", err.msg);
        return 1;
    }
    summary s;
    if (!summarise(g, &s)) {
        fprintf(stderr, "tandem info: out of memory\n");
        tdm_gguf_free(g);
        return 1;
    }
    int64_t bad = check ? check_data(g) : 0;
    int rc = json ? print_json(path, g, &s, check, bad) : (print_text(path, g, &s), 0);
    if (check && !json) printf("content check:     %s (%" PRId64 " of %" PRId64 " tensors fail)\n",
                               bad ? "FAILED" : "ok", bad, tdm_gguf_tensor_count(g));
    if (bad) rc = 1;
    if (!tdm_gguf_complete(g)) {
        fprintf(stderr, "tandem info: %s is incomplete: data ends at %" PRIu64 ", file has %" PRIu64 " bytes\n",
                path, tdm_gguf_data_end(g), tdm_gguf_file_size(g));
        rc = 1;
    }
    free(s.layers);
    tdm_gguf_free(g);
    return rc;
}
