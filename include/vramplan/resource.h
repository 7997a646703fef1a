/* vramplan: where shipped data is found (GPU profiles, model files).
 *
 * A GPU profile or a model can be named instead of given as a path:
 * `--gpu h100-80g` reads h100-80g.yaml, `estimate llama-3-8b` reads
 * llama-3-8b.yaml. The directories searched, in order:
 *
 *   1. the directory given by the caller (the CLI's --gpu-dir), if any;
 *   2. each directory of $VRAMPLAN_GPU_DIR (GPU profiles) or
 *      $VRAMPLAN_MODEL_DIR (models), a colon-separated list;
 *   3. PREFIX/share/vramplan/gpus (or models), where PREFIX is the
 *      directory above the one that holds the running library or program,
 *      so an installed copy finds its data wherever it was installed;
 *   4. the same under the PREFIX the library was built for;
 *   5. gpus/ (or models/) of the source tree the library was built in.
 *
 * A name is letters, digits, '-', '_' and '.', at most 64 characters, not
 * starting with '.'. */
#ifndef VRAMPLAN_RESOURCE_H
#define VRAMPLAN_RESOURCE_H

#include <stdbool.h>
#include <stddef.h>

#include "vramplan/error.h"

/* Read an input file whole: a regular file only (a FIFO would block, a
 * device such as /dev/zero never ends, a directory says so: VP_EIO with
 * the reason), at most max + 1 bytes of it into *buf (malloc'ed, NUL-
 * terminated; free it) and their number into *len, so that a caller
 * refuses *len > max. VP_ENOMEM. */
vp_status vp_file_read(const char *path, size_t max, char **buf,
                       size_t *len, vp_error *err);

typedef enum {
    VP_RES_GPU,   /* GPU profiles: NAME.yaml under gpus/   */
    VP_RES_MODEL, /* model files:  NAME.yaml under models/ */
    VP_RES__COUNT
} vp_resource_kind;

/* Whether `text` names a resource rather than a file: a valid name that
 * holds no '/' and does not end in .yaml, .yml or .json. */
bool vp_resource_is_name(const char *text);

/* Find the file of the resource `name` of `kind`, searching `dir` first
 * when it is not NULL (then the path above). Writes the file's path to
 * path (size bytes). Returns VP_OK; VP_EARG for an invalid name; VP_EIO
 * when no directory holds it, with a message that names the directories
 * searched and suggests a close name found in them; VP_ERANGE when the
 * path does not fit in size. */
vp_status vp_resource_find(vp_resource_kind kind, const char *name,
                           const char *dir, char *path, size_t size,
                           vp_error *err);

/* Call fn for each directory of the search path that exists, in order
 * (`dir` first when not NULL). Returns the number of directories. */
size_t vp_resource_dirs(vp_resource_kind kind, const char *dir,
                        void (*fn)(const char *dir, void *ud), void *ud);

#endif
