/* vramplan: the smallest MIG slice that fits a job.
 *
 * A GPU family (h100-80g, h200, a100-40g, a100-80g) has MIG slice profiles
 * in gpus/ (FAMILY-mig-PROFILE.yaml, with a `mig:` section naming the
 * family). vp_mig_smallest tries them from the smallest (least memory, then
 * fewest SMs) up with a caller's test, and stops at the first that fits. */
#ifndef VRAMPLAN_MIG_H
#define VRAMPLAN_MIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/gpu.h"

#define VP_MIG_MAX_SLICES 16

/* Does the job fit on this slice? Sets *fits and a one-line note for
 * reports (the largest batch, the concurrency...). A status other than
 * VP_OK stops the search and is returned. */
typedef vp_status (*vp_mig_fit_fn)(const vp_gpu_profile *slice, void *ud,
                                   bool *fits, char *note, size_t note_len,
                                   vp_error *err);

typedef struct vp_mig_trial {
    char name[64];         /* profile name, "h100-80g-mig-1g.10gb"        */
    char profile[32];      /* NVIDIA's name, "1g.10gb"                    */
    uint64_t memory_bytes;
    uint32_t sm_count;
    bool fits;
    char note[160];
} vp_mig_trial;

typedef struct vp_mig_result {
    size_t n;              /* slices tried, smallest first                */
    vp_mig_trial trial[VP_MIG_MAX_SLICES];
    int smallest;          /* index of the first that fits, -1 if none    */
} vp_mig_result;

/* The slice profiles of a family, smallest first: names[] gets up to max
 * names (static strings), *n their count. VP_EARG for an unknown family
 * (the message lists the known ones); VP_EIO / VP_ESCHEMA when a profile
 * cannot be loaded or is not a slice of the family. */
vp_status vp_mig_slices(const char *family, const char **names, size_t max,
                        size_t *n, vp_error *err);

/* Try the slices of `family` with fits(), smallest first, until one fits.
 * *out lists the slices tried. VP_OK whether or not one fits. */
vp_status vp_mig_smallest(const char *family, vp_mig_fit_fn fits, void *ud,
                          vp_mig_result *out, vp_error *err);

#endif
