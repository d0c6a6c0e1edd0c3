/* topology: the machine's physical cores and NUMA nodes (hwloc), and thread
 * pinning for the CPU expert pool and the bandwidth probe: one thread per
 * physical core, never two on the hyper-threads of one core.
 *
 * Ownership: tdm_topology owns the hwloc topology; it is read-only after
 * tdm_topology_load() and may be shared by threads (binding is per thread).
 */
#ifndef TDM_TOPOLOGY_H
#define TDM_TOPOLOGY_H

#include "status.h"

typedef struct tdm_topology tdm_topology;

tdm_status tdm_topology_load(tdm_topology **out, tdm_error *err);
void tdm_topology_free(tdm_topology *t);

int tdm_topology_physical_cores(const tdm_topology *t);
int tdm_topology_numa_nodes(const tdm_topology *t);
/* Physical cores minus one (the GPU-feeding main thread keeps a core), at least 1. */
int tdm_topology_default_threads(const tdm_topology *t);

/* Binds the calling thread to the processing units of physical core
 * (index mod the core count). TDM_ERR_UNSUPPORTED where the OS refuses. */
tdm_status tdm_topology_bind_thread(const tdm_topology *t, int core, tdm_error *err);

/* The calling thread's binding as it is now, for a caller that pins the
 * thread for a while (the bandwidth probe pins its team's master, which is
 * the caller) and must leave it as it found it. NULL when the OS does not
 * say; the caller owns the result and hands it to
 * tdm_topology_restore_thread, which binds the calling thread to it again
 * (best effort) and frees it (NULL: nothing to do). */
typedef struct tdm_thread_binding tdm_thread_binding;
tdm_thread_binding *tdm_topology_save_thread(const tdm_topology *t);
void tdm_topology_restore_thread(const tdm_topology *t, tdm_thread_binding *b);

/* Binds every thread of the next OpenMP parallel team of n threads to its own
 * physical core (thread i -> core i). Call outside a parallel region. */
tdm_status tdm_topology_bind_omp_team(const tdm_topology *t, int n, tdm_error *err);

/* Spin-wait hint for a thread that polls (x86 pause: the core's other
 * hyper-thread runs meanwhile): the expert team's and the pool's waits, the
 * GPU context's wait for its stream. */
static inline void tdm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#endif
