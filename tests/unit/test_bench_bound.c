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
    tdm_bench_bound_compute(1e9, 50, 2e9, 400, 0, &b);
    assert_true(b.cpu_bound);
    assert_true(fabs(b.t_cpu_s - 0.02) < 1e-12 && fabs(b.t_gpu_s - 0.005) < 1e-12);
    assert_true(fabs(b.tok_s - 50) < 1e-9);
    tdm_bench_bound_compute(1e8, 50, 4e9, 400, 0, &b); /* 2 ms vs 10 ms */
    assert_false(b.cpu_bound);
    assert_true(fabs(b.tok_s - 100) < 1e-9);
    tdm_bench_bound_compute(0, 0, 4e9, 400, 0, &b); /* every expert hit: no CPU side, no B_dram needed */
    assert_false(b.cpu_bound);
    assert_true(b.t_cpu_s == 0 && fabs(b.tok_s - 100) < 1e-9);
    tdm_bench_bound_compute(1e9, 20, 0, 0, 0, &b); /* the CPU path: no GPU side */
    assert_true(b.cpu_bound && fabs(b.tok_s - 20) < 1e-9);
}

/* §5's latency term adds to the GPU side only, and only where it reads. */
static void test_bound_latency(void **state)
{
    (void)state;
    tdm_bench_bound b;
    /* 2 ms of DRAM against 1 ms of VRAM + 0.5 ms: the CPU still binds, both bounds 500 */
    tdm_bench_bound_compute(1e8, 50, 4e8, 400, 5e-4, &b);
    assert_true(b.cpu_bound && b.cpu_bound_latency);
    assert_true(fabs(b.tok_s - 500) < 1e-9 && fabs(b.tok_s_latency - 500) < 1e-9);
    /* + 1.5 ms: the GPU side (2.5 ms) binds only in the latency form */
    tdm_bench_bound_compute(1e8, 50, 4e8, 400, 1.5e-3, &b);
    assert_true(b.cpu_bound && !b.cpu_bound_latency);
    assert_true(fabs(b.t_latency_s - 1.5e-3) < 1e-15 && fabs(b.tok_s_latency - 400) < 1e-9);
    assert_true(fabs(b.tok_s - 500) < 1e-9);
    /* every expert resident: bytes + latency */
    tdm_bench_bound_compute(0, 0, 4e8, 400, 1e-3, &b);
    assert_true(fabs(b.tok_s - 1000) < 1e-9 && fabs(b.tok_s_latency - 500) < 1e-9);
    /* the CPU path: no GPU side, so no latency and no latency bound beyond the CPU's */
    tdm_bench_bound_compute(1e9, 20, 0, 0, 1e-3, &b);
    assert_true(b.t_latency_s == 0 && fabs(b.tok_s_latency - 20) < 1e-9);
    /* not measured (0, negative, NaN): no latency bound */
    const double none[3] = {0, -1, NAN};
    for (int i = 0; i < 3; i++) {
        tdm_bench_bound_compute(1e8, 50, 4e8, 400, none[i], &b);
        assert_true(b.tok_s_latency == 0 && b.t_latency_s == 0 && fabs(b.tok_s - 500) < 1e-9);
    }
}

/* Five products per MoE layer, four per dense layer, one for the head. */
static void test_token_stages(void **state)
{
    (void)state;
    tdm_proj_model m;
    tdm_error err = {0};
    assert_int_equal(tdm_proj_model_preset("qwen35-35b-a3b", &m, &err), TDM_OK);
    assert_int_equal(m.n_layer, 40);
    assert_int_equal(tdm_bench_token_stages(&m), 201);
    m.n_moe_layer = 38; /* two dense layers */
    assert_int_equal(tdm_bench_token_stages(&m), 199);
}

static void test_bound_missing(void **state)
{
    (void)state;
    tdm_bench_bound b;
    tdm_bench_bound_compute(1e9, 0, 2e9, 400, 0, &b); /* no B_dram where the CPU reads */
    assert_true(b.tok_s == 0);
    tdm_bench_bound_compute(1e9, 50, 2e9, -1, 0, &b);
    assert_true(b.tok_s == 0);
    tdm_bench_bound_compute(0, 0, 0, 0, 0, &b);
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
    assert_int_equal(tdm_bench_dram_gbps(1, 4u << 20, NULL, 0, &gbps, &err), TDM_OK);
    assert_true(isfinite(gbps) && gbps > 0);
    assert_int_equal(tdm_bench_dram_gbps(tdm_membw_physical_cores() + 1, 4u << 20, NULL, 0, &gbps, &err),
                     TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "physical cores"));
    /* over memory the caller owns (the bench passes the model's expert copy) */
    static _Alignas(64) uint8_t region[4u << 20];
    gbps = 0;
    assert_int_equal(tdm_bench_dram_gbps(1, 0, region, sizeof region, &gbps, &err), TDM_OK);
    assert_true(isfinite(gbps) && gbps > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_sides),
        cmocka_unit_test(test_bound_latency),
        cmocka_unit_test(test_token_stages),
        cmocka_unit_test(test_bound_missing),
        cmocka_unit_test(test_gpu_bytes_matches_projection),
        cmocka_unit_test(test_dram_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
