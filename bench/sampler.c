/* sampler: CPU time of one tdm_sampler_sample() + accept over a Qwen3.5-size
 * vocabulary (248,320 logits) for the common settings, on one core.
 * Logits: a peaked distribution (a few dozen plausible tokens, a long tail)
 * like a real model's, and a flat one (worst case for top-p).
 * Prints a table; writes JSON (default bench/results/sampler.json).
 *   sampler [--out FILE] [--iters N] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "sampler.h"
#include "bench_json.h"

#define N_VOCAB 248320

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

int main(int argc, char **argv)
{
    const char *out = "bench/results/sampler.json";
    int iters = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: sampler [--out FILE] [--iters N]\n");
            return 2;
        }
    }
    float *peaked = malloc(N_VOCAB * sizeof *peaked), *flat = malloc(N_VOCAB * sizeof *flat);
    for (int i = 0; i < N_VOCAB; i++) {
        flat[i] = (float)(urand() * 4.0);
        peaked[i] = (float)(urand() * 8.0 - 10.0) + (i % 5000 == 7 ? 12.0f + (float)(urand() * 6.0) : 0.0f);
    }
    struct {
        const char *name;
        float temp, top_p, min_p;
        int top_k;
    } cases[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, 0},
        {"defaults (T .8, k 40, p .95, min-p .05)", 0.8f, 0.95f, 0.05f, 40},
        {"temperature only", 0.8f, 1.0f, 0.0f, 0},
        {"top-p .95 only", 0.8f, 0.95f, 0.0f, 0},
        {"top-k 1000, top-p .9", 0.8f, 0.9f, 0.0f, 1000},
    };
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "results");
    cJSON_AddStringToObject(root, "bench", "sampler");
    cJSON_AddNumberToObject(root, "n_vocab", N_VOCAB);
    cJSON_AddStringToObject(root, "clock", "CLOCK_THREAD_CPUTIME_ID, mean over iters");
    printf("%-42s %14s %14s\n", "case (repeat penalty 1.1, last 64)", "peaked ms/tok", "flat ms/tok");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tdm_sampler_params p = tdm_sampler_default_params();
        p.temperature = cases[c].temp;
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.repeat_penalty = 1.1f;
        double ms[2];
        for (int d = 0; d < 2; d++) {
            tdm_sampler *s;
            tdm_error err;
            if (tdm_sampler_new(N_VOCAB, &p, &s, &err)) {
                fprintf(stderr, "sampler: %s\n", err.msg);
                return 1;
            }
            const float *l = d ? flat : peaked;
            double t0 = now();
            for (int i = 0; i < iters; i++)
                tdm_sampler_accept(s, tdm_sampler_sample(s, l));
            ms[d] = (now() - t0) / iters * 1e3;
            tdm_sampler_free(s);
        }
        printf("%-42s %14.3f %14.3f\n", cases[c].name, ms[0], ms[1]);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "case", cases[c].name);
        cJSON_AddNumberToObject(o, "peaked_ms_per_token", ms[0]);
        cJSON_AddNumberToObject(o, "flat_ms_per_token", ms[1]);
        cJSON_AddItemToArray(arr, o);
    }
    free(peaked);
    free(flat);
    return bench_write_json(root, out);
}
