/* --gpu NAME: the GPU profile behind the CLI's budgets, times and
 * constants. A name is looked up in --gpu-dir and the search path
 * (resolve.c). Errors in a profile file point at the spot, with a caret,
 * and exit 3 as a model's do. */
#include <stdio.h>

#include "cli.h"

vp_gpu_profile *cli_gpu_load(const char *name, int *rc)
{
    char path[CLI_PATH_MAX];
    const char *file = cli_gpu_path(name, path, sizeof path, rc);
    vp_error err;

    if (file == NULL)
        return NULL;
    vp_gpu_profile *p = vp_gpu_load(file, &err);
    if (p == NULL) {
        char prefix[160];
        snprintf(prefix, sizeof prefix, "--gpu %.128s: ", name);
        *rc = cli_report(&err, err.path[0] != '\0' ? NULL : prefix);
    }
    return p;
}

int cli_gpu_hw(const char *name, vp_hw *out)
{
    int rc = -1;
    vp_gpu_profile *p = cli_gpu_load(name, &rc);

    if (p == NULL)
        return rc;
    vp_gpu_hw(p, VP_GPU_BF16, out);
    vp_hw_fill_defaults(out);
    vp_gpu_free(p);
    return -1;
}
