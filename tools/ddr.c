/* ddr: the DDR4 / DDR5 decode-throughput projection without the tandem binary.
 * Same options, table and JSON as `tandem bench --project`; --preset works
 * without any model file (published shapes, Q4_K_M type mix). */
#include <stdio.h>

#include "projection.h"

int main(int argc, char **argv)
{
    return tdm_proj_cli_run(argc, argv, "ddr", NULL, false);
}
