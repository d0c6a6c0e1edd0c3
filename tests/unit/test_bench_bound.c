/* test_bench_bound: the DESIGN.md §5 bound arithmetic of `tandem bench`
 * (which side binds, missing inputs, an empty side), the GPU byte accounting
 * against the projection's, and the per-thread-count host probe (sane value,
 * refusal beyond the physical cores). No speed is asserted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "bench_bound.h"
#include "membw.h"

static void test_bound_sides(void **state)
{
    (void)state;
    tdm_bench_bound b;
    /* 1 GB at 50 GB/s = 20 ms vs 2 GB at 400 GB/s = 5 ms: the CPU binds */
    tdm_bench_bound_compute(1e9, 50, 2e9, 400, &b);
    assert_true(b.cpu_bound);
    assert_true(fabs(b.t_cpu_s - 0.02) < 1e-12 && fabs(b.t_gpu_s - 0.005) < 1e-12);
    assert_true(fabs(b.tok_s - 50) < 1e-9);
    tdm_bench_bound_compute(1e8, 50, 4e9, 400, &b); /* 2 ms vs 10 ms */
    assert_false(b.cpu_bound);
    assert_true(fabs(b.tok_s - 100) < 1e-9);
    tdm_bench_bound_compute(0, 0, 4e9, 400, &b); /* every expert hit: no CPU side, no B_dram needed */
    assert_false(b.cpu_bound);
    assert_true(b.t_cpu_s == 0 && fabs(b.tok_s - 100) < 1e-9);
    tdm_bench_bound_compute(1e9, 20, 0, 0, &b); /* the CPU path: no GPU side */
    assert_true(b.cpu_bound && fabs(b.tok_s - 20) < 1e-9);
}

static void test_bound_missing(void **state)
{
    (void)state;
    tdm_bench_bound b;
    tdm_bench_bound_compute(1e9, 0, 2e9, 400, &b); /* no B_dram where the CPU reads */
    assert_true(b.tok_s == 0);
    tdm_bench_bound_compute(1e9, 50, 2e9, -1, &b);
    assert_true(b.tok_s == 0);
    tdm_bench_bound_compute(0, 0, 0, 0, &b);
    assert_true(b.tok_s == 0);
}

/* The GPU side of tdm_proj_predict with every hit on the GPU. */
static void test_gpu_bytes_matches_projection(void **state)
{
    (void)state;
    tdm_proj_model m;
    tdm_error err = {0};
    assert_int_equal(tdm_proj_model_preset("qwen35-35b-a3b", &m, &err), TDM_OK);
    tdm_proj_hitcurve h;
    assert_int_equal(tdm_proj_hitcurve_zipf(0, m.n_expert, &h, &err), TDM_OK);
    tdm_proj_machine mc;
    tdm_proj_machine_default(&m, &mc);
    mc.dram_gbps = 10; /* CPU-bound: g = h, no balanced split */
    mc.vram_bytes = 12ull << 30;
    mc.decode_ctx = 600;
    tdm_proj_point p;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_true(p.gpu_share == p.hit_rate);
    const double mine = tdm_bench_gpu_bytes(&m, p.hit_rate, 600);
    assert_true(fabs(mine - p.gpu_bytes) <= 1e-9 * p.gpu_bytes);
    assert_true(tdm_bench_gpu_bytes(&m, 1, 0) - tdm_bench_gpu_bytes(&m, 0, 0) == (double)m.active_expert_bytes);
}

static void test_dram_probe(void **state)
{
    (void)state;
    tdm_error err = {0};
    double gbps = 0;
    assert_int_equal(tdm_bench_dram_gbps(1, 4u << 20, &gbps, &err), TDM_OK);
    assert_true(isfinite(gbps) && gbps > 0);
    assert_int_equal(tdm_bench_dram_gbps(tdm_membw_physical_cores() + 1, 4u << 20, &gbps, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "physical cores"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_sides),
        cmocka_unit_test(test_bound_missing),
        cmocka_unit_test(test_gpu_bytes_matches_projection),
        cmocka_unit_test(test_dram_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
