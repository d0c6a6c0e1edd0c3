#include "topology.h"

#include <hwloc.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct tdm_topology {
    hwloc_topology_t topo;
    int n_cores; /* physical cores (hwloc CORE objects) */
    int n_numa;
};

tdm_status tdm_topology_load(tdm_topology **out, tdm_error *err)
{
    *out = NULL;
    tdm_topology *t = calloc(1, sizeof *t);
    if (!t)
        return tdm_error_set(err, TDM_ERR_OOM, "topology: out of memory");
    if (hwloc_topology_init(&t->topo) != 0) {
        free(t);
        return tdm_error_set(err, TDM_ERR_IO, "topology: hwloc_topology_init failed");
    }
    if (hwloc_topology_load(t->topo) != 0) {
        hwloc_topology_destroy(t->topo);
        free(t);
        return tdm_error_set(err, TDM_ERR_IO, "topology: hwloc_topology_load failed");
    }
    t->n_cores = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE);
    if (t->n_cores <= 0) /* some VMs expose no core level: count PUs instead */
        t->n_cores = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_PU);
    if (t->n_cores <= 0)
        t->n_cores = 1;
    t->n_numa = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_NUMANODE);
    if (t->n_numa <= 0)
        t->n_numa = 1;
    *out = t;
    return TDM_OK;
}

void tdm_topology_free(tdm_topology *t)
{
    if (!t)
        return;
    hwloc_topology_destroy(t->topo);
    free(t);
}

int tdm_topology_physical_cores(const tdm_topology *t) { return t->n_cores; }
int tdm_topology_numa_nodes(const tdm_topology *t) { return t->n_numa; }

int tdm_topology_default_threads(const tdm_topology *t)
{
    return t->n_cores > 1 ? t->n_cores - 1 : 1;
}

tdm_status tdm_topology_bind_thread(const tdm_topology *t, int core, tdm_error *err)
{
    hwloc_obj_type_t type = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE
                                                                                 : HWLOC_OBJ_PU;
    hwloc_obj_t obj = hwloc_get_obj_by_type(t->topo, type, (unsigned)(core % t->n_cores));
    if (!obj || !obj->cpuset)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "topology: no core %d", core);
    /* One PU of the core: keeps the thread off the sibling hyper-thread's caches. */
    hwloc_cpuset_t set = hwloc_bitmap_dup(obj->cpuset);
    if (!set)
        return tdm_error_set(err, TDM_ERR_OOM, "topology: out of memory");
    hwloc_bitmap_singlify(set);
    int rc = hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(set);
    if (rc != 0)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "topology: binding to core %d refused", core);
    return TDM_OK;
}

struct tdm_thread_binding {
    hwloc_cpuset_t set;
};

tdm_thread_binding *tdm_topology_save_thread(const tdm_topology *t)
{
    tdm_thread_binding *b = malloc(sizeof *b);
    if (b && (b->set = hwloc_bitmap_alloc()) && hwloc_get_cpubind(t->topo, b->set, HWLOC_CPUBIND_THREAD) == 0)
        return b;
    if (b)
        hwloc_bitmap_free(b->set);
    free(b);
    return NULL;
}

void tdm_topology_restore_thread(const tdm_topology *t, tdm_thread_binding *b)
{
    if (!b)
        return;
    hwloc_set_cpubind(t->topo, b->set, HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(b->set);
    free(b);
}

tdm_status tdm_topology_bind_omp_team(const tdm_topology *t, int n, tdm_error *err)
{
    int failed = 0;
#pragma omp parallel num_threads(n) reduction(+ : failed)
    {
        if (tdm_topology_bind_thread(t, omp_get_thread_num(), NULL) != TDM_OK)
            failed++;
    }
    if (failed)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "topology: %d of %d threads could not be pinned", failed, n);
    return TDM_OK;
}
