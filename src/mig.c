/* The smallest MIG slice that fits a job (mig.h). The slice profiles are
 * data in gpus/ (NVIDIA's MIG user guide, cited per file); this file only
 * names them per family and orders them. */
#include <stdio.h>
#include <string.h>

#include "vramplan/mig.h"

/* NVIDIA MIG user guide, "Supported MIG Profiles": the GPU instance
 * profiles of each GPU (the +me media variants have the same memory and
 * SMs, so they are left out). */
static const struct family {
    const char *name;
    const char *slices[8];
} FAMILIES[] = {
    {"a100-40g", {"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                  "7g.40gb"}},
    {"a100-80g", {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                  "7g.80gb"}},
    {"h100-80g", {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                  "7g.80gb"}},
    {"h200", {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
              "7g.141gb"}},
};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

typedef struct slice {
    char name[64];
    uint64_t memory;
    uint32_t sms;
} slice;

/* Load every slice of f, check it, order by memory then SMs. */
static vp_status load_slices(const struct family *f, slice *s, size_t *n,
                             vp_error *err)
{
    *n = 0;
    for (size_t i = 0; i < 8 && f->slices[i]; i++) {
        slice x;
        snprintf(x.name, sizeof x.name, "%s-mig-%s", f->name, f->slices[i]);
        vp_gpu_profile *p = vp_gpu_load(x.name, err);
        if (!p)
            return err->code;
        const vp_gpu_mig *m = vp_gpu_mig_get(p);
        bool ok = m && strcmp(m->of, f->name) == 0 &&
                  strcmp(m->profile, f->slices[i]) == 0;
        x.memory = vp_gpu_usable_bytes(p);
        x.sms = vp_gpu_sm_count(p);
        vp_gpu_free(p);
        if (!ok)
            return vp_error_set(err, VP_ESCHEMA,
                                "profile '%s' is not the MIG slice %s of %s",
                                x.name, f->slices[i], f->name);
        size_t k = (*n)++;
        while (k > 0 && (s[k - 1].memory > x.memory ||
                         (s[k - 1].memory == x.memory && s[k - 1].sms > x.sms))) {
            s[k] = s[k - 1];
            k--;
        }
        s[k] = x;
    }
    return VP_OK;
}

static const struct family *find_family(const char *family, vp_error *err)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(FAMILIES[i].name, family) == 0)
            return &FAMILIES[i];
    vp_error_set(err, VP_EARG,
                 "no MIG slices for '%.64s' (a100-40g, a100-80g, h100-80g, "
                 "h200)",
                 family);
    return NULL;
}

vp_status vp_mig_slices(const char *family, const char **names, size_t max,
                        size_t *n, vp_error *err)
{
    static char keep[N_FAMILIES][8][64];
    slice s[8];
    const struct family *f = find_family(family, err);
    vp_status st;

    if (!f)
        return VP_EARG;
    if ((st = load_slices(f, s, n, err)) != VP_OK)
        return st;
    for (size_t i = 0; i < *n && i < max; i++) {
        char *k = keep[f - FAMILIES][i];
        snprintf(k, 64, "%.63s", s[i].name);
        names[i] = k;
    }
    if (*n > max)
        *n = max;
    return VP_OK;
}

vp_status vp_mig_smallest(const char *family, vp_mig_fit_fn fits, void *ud,
                          vp_mig_result *out, vp_error *err)
{
    slice s[8];
    size_t n;
    const struct family *f = find_family(family, err);
    vp_status st;

    memset(out, 0, sizeof *out);
    out->smallest = -1;
    if (!f)
        return VP_EARG;
    if ((st = load_slices(f, s, &n, err)) != VP_OK)
        return st;
    for (size_t i = 0; i < n && out->smallest < 0; i++) {
        vp_mig_trial *t = &out->trial[out->n];
        vp_gpu_profile *p = vp_gpu_load(s[i].name, err);
        if (!p)
            return err->code;
        snprintf(t->name, sizeof t->name, "%.63s", s[i].name);
        snprintf(t->profile, sizeof t->profile, "%s",
                 vp_gpu_mig_get(p)->profile);
        t->memory_bytes = s[i].memory;
        t->sm_count = s[i].sms;
        st = fits(p, ud, &t->fits, t->note, sizeof t->note, err);
        vp_gpu_free(p);
        if (st != VP_OK)
            return st;
        out->n++;
        if (t->fits)
            out->smallest = (int)i;
    }
    return VP_OK;
}
