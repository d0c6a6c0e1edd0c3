/* projection_validate: reads back what a `tandem bench --validate` run
 * recorded (a tandem-bench JSON of the hybrid path), so that the projection
 * can be recomputed offline with the current model (`tandem bench
 * --revalidate`, docs/BENCH.md) when neither the GPU machine nor the model
 * file is at hand. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "projection.h"
#include "projection_internal.h"

/* A required number; where says which object it belongs to in the message. */
static tdm_status need_num(const cJSON *o, const char *where, const char *k, const char *name,
                           double *out, tdm_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: %s.%s missing or not a number", name, where, k);
    *out = v->valuedouble;
    return TDM_OK;
}

/* An optional number: def when absent or null. */
static double opt_num(const cJSON *o, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static void opt_str(const cJSON *o, const char *k, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(out, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static tdm_status read_run(const cJSON *r, int i, const char *name, tdm_proj_valrun *out,
                           tdm_error *err)
{
    char where[32];
    snprintf(where, sizeof where, "runs[%d]", i);
    double thr = 0, prompt = 0, gen = 0;
    tdm_status st;
    if ((st = need_num(r, where, "threads", name, &thr, err)) ||
        (st = need_num(r, where, "prompt_tokens", name, &prompt, err)) ||
        (st = need_num(r, where, "gen_tokens", name, &gen, err)) ||
        (st = need_num(r, where, "gpu_mem_gib", name, &out->gpu_mem_gib, err)) ||
        (st = need_num(r, where, "decode_tok_s", name, &out->decode_tok_s, err)) ||
        (st = need_num(r, where, "hit_rate", name, &out->hit_rate, err)))
        return st;
    if (!(thr >= 1 && prompt >= 1 && gen >= 1 && thr < 1e5 && prompt < 1e8 && gen < 1e8 &&
          out->gpu_mem_gib > 0 && out->decode_tok_s > 0))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: %s: threads %g, prompt %g, gen %g, "
                             "gpu_mem_gib %g, decode_tok_s %g out of range", name, where, thr, prompt,
                             gen, out->gpu_mem_gib, out->decode_tok_s);
    out->threads = (int32_t)thr;
    out->prompt_tokens = (int32_t)prompt;
    out->gen_tokens = (int32_t)gen;
    opt_str(r, "fill", out->fill, sizeof out->fill);
    if (strcmp(out->fill, "layer") && strcmp(out->fill, "profile") && strcmp(out->fill, "adaptive"))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: %s.fill '%s' (want layer, profile or adaptive)",
                             name, where, out->fill);
    out->dram_gbps = opt_num(r, "dram_gbps", 0); /* null: the probe refused the count */
    out->cpu_ms = opt_num(r, "cpu_ms_per_token", 0);
    out->gpu_ms = opt_num(r, "gpu_ms_per_token", 0);
    out->wait_ms = opt_num(r, "wait_ms_per_token", 0);
    out->projected_slots = (int64_t)opt_num(r, "projected_slots", -1);
    return TDM_OK;
}

static tdm_status read_doc(const cJSON *doc, const char *name, tdm_proj_valfile *out, tdm_error *err)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tandem-bench"))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: not a tandem-bench JSON (format '%s')", name,
                             cJSON_IsString(fmt) ? fmt->valuestring : "?");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(doc, "engine_path");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(doc, "validation");
    if (!cJSON_IsString(path) || strcmp(path->valuestring, "hybrid") || !cJSON_IsObject(val))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: engine_path '%s'%s: only a hybrid run (tandem "
                             "bench --device cuda) records the projection's inputs", name,
                             cJSON_IsString(path) ? path->valuestring : "?",
                             cJSON_IsObject(val) ? "" : " without a validation object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    double active = 0, dense = 0, reserve = 0;
    tdm_status st;
    if ((st = need_num(model, "model", "active_expert_bytes_per_token", name, &active, err)) ||
        (st = need_num(model, "model", "dense_bytes_per_token", name, &dense, err)) ||
        (st = need_num(val, "validation", "vram_gbps", name, &out->vram_gbps, err)) ||
        (st = need_num(val, "validation", "efficiency", name, &out->efficiency, err)) ||
        (st = need_num(val, "validation", "latency_us", name, &out->latency_us, err)) ||
        (st = need_num(val, "validation", "reserve_bytes", name, &reserve, err)))
        return st;
    if (!(active > 0 && dense > 0 && reserve >= 0))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: model bytes %g / %g, reserve %g", name, active,
                             dense, reserve);
    out->active_expert_bytes = (uint64_t)active;
    out->dense_bytes = (uint64_t)dense;
    out->reserve_bytes = (uint64_t)reserve;
    out->vram_efficiency = opt_num(val, "vram_efficiency", 1);
    opt_str(doc, "command", out->command, sizeof out->command);
    opt_str(model, "name", out->model_name, sizeof out->model_name);
    opt_str(model, "path", out->model_path, sizeof out->model_path);
    opt_str(model, "arch", out->arch, sizeof out->arch);
    opt_str(val, "efficiency_source", out->efficiency_source, sizeof out->efficiency_source);
    opt_str(val, "hit_curve", out->hit_curve, sizeof out->hit_curve);
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs"), *r;
    if (!cJSON_IsArray(runs) || cJSON_GetArraySize(runs) < 1 ||
        cJSON_GetArraySize(runs) > TDM_PROJ_VAL_RUNS_MAX)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: runs: want an array of 1..%d runs", name,
                             TDM_PROJ_VAL_RUNS_MAX);
    cJSON_ArrayForEach(r, runs) {
        if ((st = read_run(r, out->n_runs, name, &out->runs[out->n_runs], err)))
            return st;
        out->n_runs++;
    }
    return TDM_OK;
}

tdm_status tdm_proj_valfile_parse(const char *text, const char *name, tdm_proj_valfile *out,
                                  tdm_error *err)
{
    if (!text || !out)
        return tdm_error_set(err, TDM_ERR_INVALID, "tdm_proj_valfile_parse: NULL argument");
    if (!name)
        name = "bench JSON";
    memset(out, 0, sizeof *out);
    cJSON *doc = cJSON_Parse(text);
    if (!doc)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: not JSON", name);
    tdm_status st = read_doc(doc, name, out, err);
    cJSON_Delete(doc);
    return st;
}

tdm_status tdm_proj_valfile_load(const char *path, tdm_proj_valfile *out, tdm_error *err)
{
    char *text;
    tdm_status st = tdm_proj_read_text(path, &text, err);
    if (st)
        return st;
    st = tdm_proj_valfile_parse(text, path, out, err);
    free(text);
    return st;
}

/* The first preset with the recorded arch and active expert bytes (the routed
 * experts fix the cache slots and A exactly). */
static const char *match_preset(const tdm_proj_valfile *v, tdm_proj_model *m, tdm_error *err)
{
    for (int i = 0; i < tdm_proj_preset_count(); i++) {
        const char *p = tdm_proj_preset_name(i);
        if (tdm_proj_model_preset(p, m, err) == TDM_OK && !strcmp(m->arch, v->arch) &&
            m->active_expert_bytes == v->active_expert_bytes)
            return p;
    }
    return NULL;
}

tdm_status tdm_proj_valfile_model(const tdm_proj_valfile *v, const char *preset, tdm_proj_model *out,
                                  char *note, size_t note_cap, tdm_error *err)
{
    if (!v || !out)
        return tdm_error_set(err, TDM_ERR_INVALID, "tdm_proj_valfile_model: NULL argument");
    tdm_status st = TDM_OK;
    if (preset)
        st = tdm_proj_model_preset(preset, out, err);
    else if (!(preset = match_preset(v, out, err)))
        return tdm_error_set(err, TDM_ERR_INVALID, "no preset with arch '%s' and %llu active expert "
                             "bytes per token (the recorded model '%s'): give -m MODEL.gguf or "
                             "--preset NAME", v->arch, (unsigned long long)v->active_expert_bytes,
                             v->model_name);
    if (st)
        return st;
    const uint64_t pre_dense = tdm_proj_dense_bytes(out);
    const int64_t diff = (int64_t)v->dense_bytes - (int64_t)pre_dense;
    if (diff < 0 && (uint64_t)-diff > out->attn_bytes)
        return tdm_error_set(err, TDM_ERR_INVALID, "recorded %llu non-expert bytes per token do not fit "
                             "preset %s (%llu, of which attention %llu)",
                             (unsigned long long)v->dense_bytes, preset,
                             (unsigned long long)pre_dense, (unsigned long long)out->attn_bytes);
    /* the file's attention/head type mix may differ from llama-quantize's; the
     * recorded total is the file's, the split stays the preset's */
    out->attn_bytes = (uint64_t)((int64_t)out->attn_bytes + diff);
    if (note)
        snprintf(note, note_cap, "preset %s (the model file is not read): %s active expert bytes %llu "
                 "%s the recorded; non-expert bytes per token %llu recorded (preset %llu, %+lld to "
                 "attention); slots, KV, DeltaNet state and layer counts from the preset", preset,
                 out->name, (unsigned long long)out->active_expert_bytes,
                 out->active_expert_bytes == v->active_expert_bytes ? "=" : "!=",
                 (unsigned long long)v->dense_bytes, (unsigned long long)pre_dense, (long long)diff);
    return TDM_OK;
}
