/* Tests of the MIG slice profiles (gpus/FAMILY-mig-PROFILE.yaml, the gpu.h `mig:`
 * section) and of the smallest slice that fits (mig.h), with the CLI's
 * maxbatch / plan / serve --gpu-family (golden files). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <string.h>

#include "cli_golden.h"
#include "vramplan/vramplan.h"

/* every slice of the four families loads, names its family and profile,
 * and its memory and SMs grow from the first to the last (the whole GPU) */
Test(mig, slices_load_and_order)
{
    const char *fam[] = {"a100-40g", "a100-80g", "h100-80g", "h200"};
    const uint32_t full_sms[] = {98, 98, 132, 132};
    for (size_t f = 0; f < 4; f++) {
        const char *names[VP_MIG_MAX_SLICES];
        size_t n;
        vp_error err;
        uint64_t last_mem = 0;
        cr_assert_eq(vp_mig_slices(fam[f], names, VP_MIG_MAX_SLICES, &n,
                                   &err),
                     VP_OK, "%s", err.msg);
        cr_assert_eq(n, 6);
        for (size_t i = 0; i < n; i++) {
            vp_gpu_profile *p = vp_gpu_load(names[i], &err);
            cr_assert_not_null(p, "%s: %s", names[i], err.msg);
            const vp_gpu_mig *m = vp_gpu_mig_get(p);
            cr_assert_not_null(m);
            cr_assert_str_eq(m->of, fam[f]);
            cr_assert_geq(vp_gpu_memory_bytes(p), last_mem);
            last_mem = vp_gpu_memory_bytes(p);
            if (i == n - 1) {
                cr_assert_eq(vp_gpu_sm_count(p), full_sms[f]);
                cr_assert_eq(m->compute_slices, 7);
                cr_assert_eq(m->memory_slices, 8);
            }
            vp_gpu_free(p);
        }
    }
}

/* H100 SXM5 1g.10gb: 9.75 GiB, 16 SMs, 7 instances (nvidia-smi mig -lgip) */
Test(mig, h100_1g_figures)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h100-80g-mig-1g.10gb", &err);
    cr_assert_not_null(p, "%s", err.msg);
    const vp_gpu_mig *m = vp_gpu_mig_get(p);
    cr_assert_eq(vp_gpu_memory_bytes(p), 9984ull * VP_MiB);
    cr_assert_eq(vp_gpu_sm_count(p), 16);
    cr_assert_eq(m->instances, 7);
    cr_assert_str_eq(m->profile, "1g.10gb");
    cr_assert_float_eq(vp_gpu_peak_tflops(p, VP_GPU_BF16),
                       989.4 * 16 / 132, 1e-3);
    cr_assert_float_eq(vp_gpu_memory_gbps(p), 3350.0 / 8, 1e-9);
    cr_assert_float_eq(vp_gpu_link_gbps(p), 0.0, 0.0);
    vp_gpu_free(p);
}

/* A whole GPU has no mig: section; its sm_count is the whole GPU's (the
 * H200's 132, as its 7g slice). */
Test(mig, whole_gpu_is_not_a_slice)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("h200", &err);
    cr_assert_null(vp_gpu_mig_get(p));
    cr_assert_eq(vp_gpu_sm_count(p), 132);
    vp_gpu_free(p);
}

static const char *SLICE_HEAD =
    "name: x\nproduct: x\ndevice_names: [x]\nvendor: nvidia\narch: hopper\n"
    "compute_capability: \"9.0\"\nmemory_bytes: 10737418240\n"
    "memory_gbps: 400\npeak_tflops: {fp32: 8}\n"
    "host_link: {kind: pcie, gen: 5, lanes: 16, gbps: 63}\n"
    "context_bytes: 0\ncontext_estimated: true\n"
    "cublas_workspace_bytes: 0\nsources: [x]\n";

static vp_status parse_slice(const char *tail, vp_error *err)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "%s%s", SLICE_HEAD, tail);
    vp_gpu_profile *p = vp_gpu_parse_buf(buf, strlen(buf), "s.yaml", err);
    vp_gpu_free(p);
    return p ? VP_OK : err->code;
}

Test(mig, schema_needs_sm_count)
{
    vp_error err;
    cr_assert_eq(parse_slice("mig: {of: h100-80g, profile: 1g.10gb, "
                             "compute_slices: 1, memory_slices: 1, "
                             "instances: 7, copy_engines: 1, decoders: 1, "
                             "jpeg: 1, ofa: 0}\n",
                             &err),
                 VP_ESCHEMA);
    cr_assert(strstr(err.msg, "sm_count"), "%s", err.msg);
}

Test(mig, schema_unknown_key)
{
    vp_error err;
    cr_assert_eq(parse_slice("sm_count: 16\nmig: {of: h100-80g, profile: "
                             "1g.10gb, compute_slices: 1, memory_slices: 1, "
                             "instances: 7, copy_engines: 1, decoders: 1, "
                             "jpeg: 1, ofa: 0, nvenc: 2}\n",
                             &err),
                 VP_ESCHEMA);
    cr_assert(strstr(err.msg, "nvenc"), "%s", err.msg);
    cr_assert_eq(err.line, 16);
}

/* the profile round-trips through vp_gpu_write */
Test(mig, write_reads_back)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_load("a100-40g-mig-3g.20gb", &err), *q;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(vp_gpu_write(p, f, &err), VP_OK);
    fclose(f);
    q = vp_gpu_parse_buf(text, len, "w.yaml", &err);
    cr_assert_not_null(q, "%s", err.msg);
    cr_assert_eq(vp_gpu_sm_count(q), 42);
    cr_assert_str_eq(vp_gpu_mig_get(q)->profile, "3g.20gb");
    cr_assert_eq(vp_gpu_mig_get(q)->memory_slices, 4);
    free(text);
    vp_gpu_free(q);
    vp_gpu_free(p);
}

/* a test on memory alone: the first slice with at least `need` bytes */
static vp_status mem_fits(const vp_gpu_profile *g, void *ud, bool *fits,
                          char *note, size_t n, vp_error *err)
{
    (void)err;
    *fits = vp_gpu_memory_bytes(g) >= *(const uint64_t *)ud;
    snprintf(note, n, "-");
    return VP_OK;
}

Test(mig, smallest_by_memory)
{
    vp_mig_result r;
    vp_error err;
    uint64_t need = 30 * VP_GiB;
    cr_assert_eq(vp_mig_smallest("h200", mem_fits, &need, &r, &err), VP_OK);
    cr_assert_eq(r.smallest, 1);
    cr_assert_str_eq(r.trial[1].profile, "1g.35gb");
    cr_assert_eq(r.n, 2); /* stops at the first that fits */
    need = 200 * VP_GiB;
    cr_assert_eq(vp_mig_smallest("h200", mem_fits, &need, &r, &err), VP_OK);
    cr_assert_eq(r.smallest, -1);
    cr_assert_eq(r.n, 6);
}

Test(mig, unknown_family)
{
    vp_mig_result r;
    vp_error err;
    uint64_t need = 1;
    cr_assert_eq(vp_mig_smallest("v100-16g", mem_fits, &need, &r, &err),
                 VP_EARG);
    cr_assert(strstr(err.msg, "h100-80g"), "%s", err.msg);
}

/* ---- CLI --------------------------------------------------------------------- */

Test(cli_mig, maxbatch_family)
{
    GOLDEN("mig_maxbatch_gpt2_h100", 0, "maxbatch", "models/gpt2-small.yaml",
           "--gpu-family", "h100-80g", "--batch", "16", "--precision",
           "amp-bf16", "--seq", "512");
}
Test(cli_mig, maxbatch_none_fits)
{
    GOLDEN("mig_maxbatch_none_fits", 1, "maxbatch", "models/gpt2-small.yaml",
           "--gpu-family", "a100-40g", "--batch", "4000", "--seq", "1024");
}
Test(cli_mig, plan_family)
{
    GOLDEN("mig_plan_gpt2_a100", 0, "plan", "models/gpt2-small.yaml",
           "--gpu-family", "a100-40g", "--global-batch", "64", "--seq",
           "512");
}
Test(cli_mig, serve_family)
{
    GOLDEN("mig_serve_llama3_h100", 0, "serve", "models/llama-3-8b.yaml",
           "--gpu-family", "h100-80g", "--prompt", "3000", "--output",
           "1000", "--concurrency", "8");
}
Test(cli_mig, unknown_family)
{
    GOLDEN("mig_unknown_family", 2, "maxbatch", "models/gpt2-small.yaml",
           "--gpu-family", "v100-16g");
}
