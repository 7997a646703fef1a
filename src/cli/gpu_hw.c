/* --gpu NAME: the hardware profile behind the CLI's budgets and times. */
#include <stdio.h>

#include "cli.h"
#include "vramplan/gpu.h"

int cli_gpu_hw(const char *name, vp_hw *out)
{
    vp_error err;
    char path[4096];
    const char *file = cli_gpu_path(name, path, sizeof path);
    if (file == NULL)
        return 1;
    vp_gpu_profile *p = vp_gpu_load(file, &err);
    if (p == NULL) {
        if (err.line)
            fprintf(stderr, "%s:%u:%u: error: %s\n", err.path, err.line,
                    err.col, err.msg);
        else
            fprintf(stderr, "vramplan: error: --gpu %s: %s\n", name,
                    err.msg[0] ? err.msg : vp_strerror(err.code));
        return 1;
    }
    vp_gpu_hw(p, VP_GPU_BF16, out);
    vp_hw_fill_defaults(out);
    vp_gpu_free(p);
    return 0;
}

