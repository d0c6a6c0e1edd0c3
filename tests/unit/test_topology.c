#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <omp.h>
#include <sched.h>

#include "topology.h"

static void test_counts(void **state)
{
    (void)state;
    tdm_topology *t = NULL;
    tdm_error err;
    assert_int_equal(tdm_topology_load(&t, &err), TDM_OK);
    int cores = tdm_topology_physical_cores(t);
    assert_true(cores >= 1);
    assert_true(tdm_topology_numa_nodes(t) >= 1);
    assert_int_equal(tdm_topology_default_threads(t), cores > 1 ? cores - 1 : 1);
    tdm_topology_free(t);
}

/* Pinning must leave each thread on exactly one CPU, distinct per thread. */
static void test_bind_team(void **state)
{
    (void)state;
    tdm_topology *t = NULL;
    tdm_error err;
    assert_int_equal(tdm_topology_load(&t, &err), TDM_OK);
    int n = tdm_topology_physical_cores(t);
    if (n > 64)
        n = 64;
    assert_int_equal(tdm_topology_bind_omp_team(t, n, &err), TDM_OK);
    int cpu_of[64];
    int single = 1;
#pragma omp parallel num_threads(n)
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        sched_getaffinity(0, sizeof set, &set);
        if (CPU_COUNT(&set) != 1)
#pragma omp atomic write
            single = 0;
        cpu_of[omp_get_thread_num()] = sched_getcpu();
    }
    assert_true(single);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            assert_int_not_equal(cpu_of[i], cpu_of[j]);
    tdm_topology_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_bind_team),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
