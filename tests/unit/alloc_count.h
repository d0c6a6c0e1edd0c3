/* alloc_count: counts heap allocations (malloc, calloc, realloc, memalign,
 * aligned_alloc, posix_memalign) while counting is on, for tests that show a
 * path never allocates. Include it in exactly one file of a test binary: it
 * defines them, forwarding to glibc's and counting every thread's calls (a
 * pool's workers, the OpenMP runtime's teams). Sanitizer builds bring their
 * own allocator; there ALLOC_COUNT_WORKS is 0 and alloc_count_or_skip()
 * skips the calling cmocka test (include cmocka.h first). */
#ifndef TDM_TEST_ALLOC_COUNT_H
#define TDM_TEST_ALLOC_COUNT_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_COUNT_WORKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ALLOC_COUNT_WORKS 0
#endif
#endif
#ifndef ALLOC_COUNT_WORKS
#define ALLOC_COUNT_WORKS 1
#endif

static atomic_int alloc_calls;
static atomic_bool alloc_counting;

static inline void alloc_count_one(void)
{
    if (atomic_load_explicit(&alloc_counting, memory_order_relaxed))
        atomic_fetch_add(&alloc_calls, 1);
}

#if ALLOC_COUNT_WORKS
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
void *malloc(size_t n)
{
    alloc_count_one();
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t size)
{
    alloc_count_one();
    return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n)
{
    alloc_count_one();
    return __libc_realloc(p, n);
}
void *memalign(size_t align, size_t n)
{
    alloc_count_one();
    return __libc_memalign(align, n);
}
void *aligned_alloc(size_t align, size_t n)
{
    return memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    if (align % sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    void *p = memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
#endif

/* Skips the current cmocka test where the counter cannot see allocations. */
static inline void alloc_count_or_skip(void)
{
    if (!ALLOC_COUNT_WORKS)
        skip();
}

/* Starts counting from zero. */
static inline void alloc_count_start(void)
{
    atomic_store(&alloc_calls, 0);
    atomic_store(&alloc_counting, true);
}

/* Stops counting; the calls since alloc_count_start. */
static inline int alloc_count_stop(void)
{
    atomic_store(&alloc_counting, false);
    return atomic_load(&alloc_calls);
}

#endif
