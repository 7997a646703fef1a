/* --gpu NAME: the hardware profile behind the CLI's step times. */
#include <stdio.h>

#include "cli.h"

int cli_gpu_hw(const char *name, vp_hw *out)
{
    (void)out;
    fprintf(stderr, "vramplan: error: unknown GPU profile '%s'\n", name);
    return 1;
}

int cli_plan_cluster(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_usage_error("cluster planning (--gpus) is not available in "
                           "this build");
}
