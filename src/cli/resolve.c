/* Named GPU profiles and models on the command line: the search path of
 * resource.h, with --gpu-dir first. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "vramplan/resource.h"

static const char *gpu_dir; /* --gpu-dir, NULL when not given */

void cli_set_gpu_dir(const char *dir)
{
    gpu_dir = dir && *dir ? dir : NULL;
}

const char *cli_gpu_dir(void)
{
    return gpu_dir;
}

const char *cli_model_path(const char *arg, char *buf, size_t size)
{
    vp_error err;

    /* a file that exists, or anything that is not a name, stays a path
     * (a missing file is reported when it is read) */
    if (arg == NULL || access(arg, F_OK) == 0 || !vp_resource_is_name(arg))
        return arg;
    if (vp_resource_find(VP_RES_MODEL, arg, NULL, buf, size, &err) !=
        VP_OK) {
        fprintf(stderr, "vramplan: error: %s\n",
                err.msg[0] ? err.msg : vp_strerror(err.code));
        return NULL;
    }
    return buf;
}

const char *cli_gpu_path(const char *arg, char *buf, size_t size)
{
    vp_error err;

    if (arg == NULL || !vp_resource_is_name(arg))
        return arg;
    if (vp_resource_find(VP_RES_GPU, arg, gpu_dir, buf, size, &err) !=
        VP_OK) {
        fprintf(stderr, "vramplan: error: --gpu %s: %s\n", arg,
                err.msg[0] ? err.msg : vp_strerror(err.code));
        return NULL;
    }
    return buf;
}
