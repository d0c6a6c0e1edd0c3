/* test_membw: the bandwidth probe at a small size: sane numbers (positive,
 * finite, min <= median <= max), the matvec measurement, the probe of an
 * existing region (nothing written), the JSON file, the caller's CPU binding
 * left as it was, and the error paths. No speed is asserted. */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "membw.h"

static void check_stats(const tdm_membw_stats *s)
{
    assert_true(isfinite(s->min_gbs) && isfinite(s->median_gbs) && isfinite(s->max_gbs));
    assert_true(s->min_gbs > 0.0);
    assert_true(s->min_gbs <= s->median_gbs);
    assert_true(s->median_gbs <= s->max_gbs);
}

static void check_json_stats(cJSON *o)
{
    assert_non_null(o);
    const char *keys[3] = {"min", "median", "max"};
    double v[3];
    for (int i = 0; i < 3; i++) {
        cJSON *n = cJSON_GetObjectItem(o, keys[i]);
        assert_true(cJSON_IsNumber(n));
        v[i] = n->valuedouble;
    }
    assert_true(v[0] > 0 && v[0] <= v[1] && v[1] <= v[2]);
}

static void test_probe_and_json(void **state)
{
    int ncores = tdm_membw_physical_cores();
    assert_true(ncores >= 1);
    int nres = ncores >= 2 ? 2 : 1;
    tdm_membw_result res[2];
    for (int i = 0; i < nres; i++) {
        tdm_membw_opts o;
        tdm_membw_opts_default(&o);
        assert_int_equal(o.bytes, (size_t)1 << 30);
        o.bytes = 6u << 20;
        o.threads = i + 1;
        o.repeats = 3;
        tdm_error err;
        assert_int_equal(tdm_membw_run(&o, &res[i], &err), TDM_OK);
        assert_int_equal(res[i].threads, i + 1);
        assert_int_equal(res[i].repeats, 3);
        assert_true(res[i].bytes <= o.bytes && res[i].bytes > o.bytes / 2);
        for (int k = 0; k < TDM_MEMBW_KIND_COUNT; k++) {
            check_stats(&res[i].kind[k]);
            printf("  %d thread(s) %-5s %.2f / %.2f / %.2f GB/s\n", i + 1,
                   tdm_membw_kind_name((tdm_membw_kind)k), res[i].kind[k].min_gbs,
                   res[i].kind[k].median_gbs, res[i].kind[k].max_gbs);
        }
        tdm_membw_matvec_opts mo = {TDM_Q_Q4_K, 64, 512, 2u << 20, i + 1, 3};
        assert_int_equal(tdm_membw_matvec(&mo, &res[i].matvec, &err), TDM_OK);
        check_stats(&res[i].matvec);
        res[i].has_matvec = 1;
        res[i].matvec_type = TDM_Q_Q4_K;
    }
    res[0].has_matvec = 0; /* the JSON must handle both */

    char path[] = "/tmp/test_membw_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    tdm_error err;
    assert_int_equal(tdm_membw_write_json(path, res, nres, &err), TDM_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[16384];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    unlink(path);
    buf[len] = 0;
    cJSON *root = cJSON_Parse(buf);
    assert_non_null(root);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(root, "host")));
    assert_string_equal(cJSON_GetObjectItem(root, "units")->valuestring, "GB/s");
    assert_true(cJSON_GetObjectItem(root, "bytes")->valuedouble == (double)res[0].bytes);
    assert_int_equal(cJSON_GetObjectItem(root, "repeats")->valueint, 3);
    cJSON *arr = cJSON_GetObjectItem(root, "results");
    assert_int_equal(cJSON_GetArraySize(arr), nres);
    for (int i = 0; i < nres; i++) {
        cJSON *r = cJSON_GetArrayItem(arr, i);
        assert_int_equal(cJSON_GetObjectItem(r, "threads")->valueint, i + 1);
        check_json_stats(cJSON_GetObjectItem(r, "read"));
        check_json_stats(cJSON_GetObjectItem(r, "copy"));
        check_json_stats(cJSON_GetObjectItem(r, "triad"));
        cJSON *m = cJSON_GetObjectItem(r, "matvec");
        if (i == 0) {
            assert_null(m);
        } else {
            check_json_stats(m);
            assert_string_equal(cJSON_GetObjectItem(m, "type")->valuestring, "Q4_K");
        }
    }
    cJSON_Delete(root);
    assert_int_equal(tdm_membw_write_json("/nonexistent-dir/x.json", res, nres, &err), TDM_ERR_IO);
}

/* The probe pins its team's master, the caller: afterwards the caller is
 * bound as before (tandem bench probes between grid points, whose main
 * thread feeds the GPU). The caller is first bound to the last CPU it may
 * use, which is not where thread 0 of a probe goes on a machine of two or
 * more CPUs. */
static void test_caller_binding_kept(void **state)
{
    (void)state;
    cpu_set_t all, last, now;
    /* every CPU the process may use (an earlier probe in this process pinned
     * the caller, so ask for all and read back what the kernel allows) */
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; c++)
        CPU_SET(c, &all);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int hi = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all))
            hi = c;
    assert_true(hi >= 0);
    CPU_ZERO(&last);
    CPU_SET(hi, &last);
    const cpu_set_t *want[2] = {&all, &last};
    for (int w = 0; w < 2; w++) {
        assert_int_equal(sched_setaffinity(0, sizeof *want[w], want[w]), 0);
        tdm_membw_opts o;
        tdm_membw_opts_default(&o);
        o.bytes = 3u << 20;
        o.threads = 1;
        o.repeats = 1;
        tdm_membw_result r;
        tdm_error err;
        assert_int_equal(tdm_membw_run(&o, &r, &err), TDM_OK);
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_true(CPU_EQUAL(&now, want[w]));
        tdm_membw_stats s;
        tdm_membw_matvec_opts mo = {TDM_Q_Q4_K, 64, 512, 1u << 20, 1, 1};
        assert_int_equal(tdm_membw_matvec(&mo, &s, &err), TDM_OK);
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_true(CPU_EQUAL(&now, want[w]));
        static _Alignas(64) uint8_t region[1u << 20];
        assert_int_equal(tdm_membw_read_region(region, sizeof region, 0, 1, 1, &s, &err), TDM_OK);
        assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
        assert_true(CPU_EQUAL(&now, want[w]));
    }
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    printf("  caller kept its binding (%d CPUs, then CPU %d alone)\n", CPU_COUNT(&all), hi);
}

/* The probe over memory that holds data: sane numbers, nothing written,
 * bytes 0 or past the region = all of it, and its refusals. */
static void test_region(void **state)
{
    (void)state;
    const size_t n = 8u << 20;
    uint8_t *buf = aligned_alloc(4096, n), *ref = malloc(n);
    assert_non_null(buf);
    assert_non_null(ref);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13); /* any bits, denormal doubles included */
    memcpy(ref, buf, n);
    const int nt = tdm_membw_physical_cores() >= 2 ? 2 : 1;
    const size_t asks[3] = {0, 2u << 20, 2 * n};
    for (int i = 0; i < 3; i++) {
        tdm_membw_stats s;
        tdm_error err;
        assert_int_equal(tdm_membw_read_region(buf, n, asks[i], nt, 3, &s, &err), TDM_OK);
        check_stats(&s);
        printf("  region of %zu MiB, %zu asked, %d thread(s): %.2f GB/s median\n", n >> 20, asks[i], nt,
               s.median_gbs);
    }
    assert_memory_equal(buf, ref, n);
    tdm_membw_stats s;
    tdm_error err;
    assert_int_equal(tdm_membw_read_region(buf + 8, n - 64, 0, 1, 3, &s, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "aligned"));
    assert_int_equal(tdm_membw_read_region(NULL, n, 0, 1, 3, &s, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_membw_read_region(buf, 64 * 64 - 64, 0, 1, 3, &s, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "too little"));
    assert_int_equal(tdm_membw_read_region(buf, n, 0, 1, 0, &s, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_membw_read_region(buf, n, 0, tdm_membw_physical_cores() + 1, 3, &s, &err),
                     TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "threads"));
    free(buf);
    free(ref);
}

static void test_errors(void **state)
{
    tdm_membw_opts o;
    tdm_membw_opts_default(&o);
    tdm_membw_result r;
    tdm_error err;
    o.bytes = 4u << 20;
    o.threads = tdm_membw_physical_cores() + 1;
    assert_int_equal(tdm_membw_run(&o, &r, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "threads"));
    o.threads = 1;
    o.bytes = 1000;
    assert_int_equal(tdm_membw_run(&o, &r, &err), TDM_ERR_INVALID);
    o.bytes = 4u << 20;
    o.repeats = 0;
    assert_int_equal(tdm_membw_run(&o, &r, &err), TDM_ERR_INVALID);

    tdm_membw_stats s;
    tdm_membw_matvec_opts mo = {TDM_Q_IQ2_XXS, 64, 512, 1u << 20, 1, 2};
    assert_int_equal(tdm_membw_matvec(&mo, &s, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    mo.type = TDM_Q_Q4_K;
    mo.cols = 300;
    assert_int_equal(tdm_membw_matvec(&mo, &s, &err), TDM_ERR_INVALID);
    mo.cols = 512;
    mo.threads = tdm_membw_physical_cores() + 1;
    assert_int_equal(tdm_membw_matvec(&mo, &s, &err), TDM_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_and_json),
        cmocka_unit_test(test_caller_binding_kept),
        cmocka_unit_test(test_region),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
