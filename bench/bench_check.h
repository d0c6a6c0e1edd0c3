/* CHECK(call): benchmark programs stop at the first failed tdm_* call,
 * printing the call and the message of the file-scope `tdm_error err`. */
#ifndef TDM_BENCH_CHECK_H
#define TDM_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "status.h"

#define CHECK(call)                                                                 \
    do {                                                                            \
        tdm_status s_ = (call);                                                     \
        if (s_ != TDM_OK) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg); \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

#endif
