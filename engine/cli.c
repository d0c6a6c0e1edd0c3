/* Helpers shared by the CLI commands and tools (engine/cli.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char *tdm_cli_default_model(void)
{
    static char path[PATH_MAX]; /* written once per process by main's thread */
    const char *env = getenv("TANDEM_MODEL");
    if (env && *env)
        return env;
    const char *rel = "models/demo/demo-Q4_K_M.gguf";
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n > 0) {
        path[n] = '\0';
        /* the binary sits in <root>/build[/...]/tandem: walk up to a folder holding rel */
        for (char *slash = strrchr(path, '/'); slash; slash = strrchr(path, '/')) {
            *slash = '\0';
            size_t len = strlen(path);
            if (len + 1 + strlen(rel) + 1 > sizeof path)
                break;
            path[len] = '/';
            strcpy(path + len + 1, rel);
            if (access(path, R_OK) == 0)
                return path;
            path[len] = '\0';
        }
    }
    return rel;
}

int tdm_cli_parse_ids(const char *s, int32_t *ids, int cap)
{
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || n >= cap)
            return -1;
        ids[n++] = (int32_t)v;
        s = end;
        while (*s == ' ')
            s++;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

int tdm_cli_parse_int_list(const char *s, int32_t *out, int cap, int32_t lo, int32_t hi)
{
    const int n = tdm_cli_parse_ids(s, out, cap);
    for (int i = 0; i < n; i++)
        if (out[i] < lo || out[i] > hi)
            return -1;
    return n;
}

bool tdm_cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0)
        return false;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end)
        return false;
    *out = (uint64_t)(v * mul);
    return true;
}

bool tdm_cli_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool tdm_cli_parse_i32(const char *s, long lo, long hi, int32_t *out)
{
    long v;
    if (lo < INT32_MIN || hi > INT32_MAX || !tdm_cli_parse_long(s, lo, hi, &v))
        return false;
    *out = (int32_t)v;
    return true;
}

bool tdm_cli_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

bool tdm_cli_parse_expert_memory(const char *s, tdm_expert_memory *out)
{
    static const char *const names[] = {"auto", "map", "copy"};
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = (tdm_expert_memory)i;
            return true;
        }
    return false;
}

tdm_status tdm_cli_place_experts(tdm_model *m, tdm_expert_memory mem, bool cpu_reads, bool direct, tdm_error *err)
{
    const bool want = cpu_reads && (mem == TDM_EXPERT_MEMORY_COPY || (mem == TDM_EXPERT_MEMORY_AUTO && direct));
    if (!want)
        return TDM_OK;
    size_t bytes = 0;
    tdm_error e = {0};
    const tdm_status st = tdm_model_copy_experts(m, &bytes, &e);
    if (st == TDM_ERR_OOM && mem == TDM_EXPERT_MEMORY_AUTO) {
        fprintf(stderr, "note: experts stay in the file mapping, so the GPU reads no missed expert itself (%s)\n",
                e.msg);
        return TDM_OK;
    }
    if (st)
        return tdm_error_set(err, st, "%s", e.msg);
    fprintf(stderr, "experts: %.2f GiB copied into huge-page memory\n", (double)bytes / (1 << 30));
    return TDM_OK;
}

bool tdm_cli_parse_zero_copy(const char *s, int32_t *out)
{
    if (!strcmp(s, "auto")) {
        *out = -1;
        return true;
    }
    return tdm_cli_parse_i32(s, 0, 4096, out);
}

bool tdm_cli_parse_on_off(const char *s, int32_t *out)
{
    if (!s || (strcmp(s, "on") && strcmp(s, "off")))
        return false;
    *out = !strcmp(s, "on");
    return true;
}

bool tdm_cli_parse_float(const char *s, double lo, double hi, float *out)
{
    double v;
    if (!tdm_cli_parse_double(s, lo, hi, &v))
        return false;
    *out = (float)v;
    return true;
}
