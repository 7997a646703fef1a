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

const char *cli_model_path(const char *arg, char *buf, size_t size, int *rc)
{
    vp_error err;

    /* a file that exists, or anything that is not a name, stays a path
     * (a missing file is reported when it is read) */
    if (arg == NULL || access(arg, F_OK) == 0 || !vp_resource_is_name(arg))
        return arg;
    vp_error_clear(&err);
    if (vp_resource_find(VP_RES_MODEL, arg, NULL, buf, size, &err) !=
        VP_OK) {
        *rc = cli_report(&err, NULL);
        return NULL;
    }
    return buf;
}

const char *cli_gpu_path(const char *arg, char *buf, size_t size, int *rc)
{
    vp_error err;

    if (arg == NULL || !vp_resource_is_name(arg))
        return arg;
    vp_error_clear(&err);
    if (vp_resource_find(VP_RES_GPU, arg, gpu_dir, buf, size, &err) !=
        VP_OK) {
        char prefix[160];
        snprintf(prefix, sizeof prefix, "--gpu %.128s: ", arg);
        *rc = cli_report(&err, prefix);
        return NULL;
    }
    return buf;
}

vp_model *cli_model_load(const char *arg, int *rc)
{
    char buf[CLI_PATH_MAX];
    const char *path = cli_model_path(arg, buf, sizeof buf, rc);
    vp_model *m = NULL;
    vp_error err;

    vp_error_clear(&err);
    if (path != NULL && (m = vp_model_load(path, &err)) == NULL)
        *rc = cli_report(&err, NULL);
    return m;
}
