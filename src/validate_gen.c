/* Validation of generate() cases (validate_impl.h): the schema of a line
 * with "generate" (groundtruth/README.md: generate {prompt, new_tokens,
 * sample, pad}, cache, load, hf_config, runs, kv_cache_bytes), as
 * groundtruth/collect_more.py's run_generate measures it, and the
 * simulation of its calls. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "validate_impl.h"
#include "vramplan/defaults.h"

#define BIG UINT64_MAX
#define N(rows) (sizeof rows / sizeof rows[0])

/* collect_more.py run_generate: top_k=50, top_p=0.9 when sampling;
 * min_new_tokens = max_new_tokens */
#define CASE_TOP_K 50u

static const char *const CACHES[] = {
#define VP__CACHE(name, str) str,
    VP_CACHE_MAP(VP__CACHE)
#undef VP__CACHE
    NULL};

/* ---- the schema ------------------------------------------------------------ */

static vp_status gen_fields(void *ctx, const vp_jval *v, vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_U64("prompt", true, 1, VP_MAX_DIM, vp_gen_in, prompt),
        VP_JROW_U64("new_tokens", true, 1, VP_MAX_DIM, vp_gen_in,
                    new_tokens),
        VP_JROW_BOOL("sample", false, vp_gen_in, sample),
        VP_JROW_BOOL("pad", false, vp_gen_in, pad),
    };
    vp_case_in *in = ctx;
    return vp__jschema_check(v->doc, v->node, rows, N(rows),
                             "a case's generate", &in->gen, err);
}

static vp_status read_runs(void *ctx, const vp_jval *v, vp_error *err)
{
    static const vp_jfield rows[] = {
        VP_JROW_U64("start", true, 0, BIG, vp_run_in, start),
        VP_JROW_U64("peak", true, 1, BIG, vp_run_in, peak),
        VP_JROW_U64("end", true, 0, BIG, vp_run_in, end),
        VP_JROW_U64("reserved", false, 0, BIG, vp_run_in, reserved),
        VP_JROW_INFO("ms", VP_JT_NUMBER),
        VP_JROW_INFO("generated", VP_JT_U64),
    };
    vp_case_in *in = ctx;
    const vp_jdoc *d = v->doc;

    if (json_array_size(v->json) == 0 ||
        json_array_size(v->json) > VP_MAX_STEPS)
        return vp__jerr(d, v->node, false, VP_ELIMIT, err,
                        "'runs' must hold 1 to %d generate() calls, not %zu",
                        VP_MAX_STEPS, json_array_size(v->json));
    in->gen.n_runs = 0;
    for (int c = d->nodes[v->node].first_child; c >= 0;
         c = d->nodes[c].next) {
        vp_run_in *r = &in->gen.run[in->gen.n_runs++];
        memset(r, 0, sizeof *r);
        vp_status st = vp__jschema_check(d, c, rows, N(rows), "a run", r,
                                         err);
        if (st != VP_OK)
            return st;
        if (r->peak < r->start || r->peak < r->end)
            return vp__jerr(d, c, false, VP_ERANGE, err,
                            "a run's peak is below its start or its end");
    }
    return VP_OK;
}

#define ROW_U64(n, lo, m) VP_JROW_U64(n, false, lo, BIG, vp_case_in, m)

const vp_jfield vp__gen_rows[] = {
    VP_JROW_U64("batch", true, 1, VP_MAX_DIM, vp_case_in, batch),
    VP_JROW_ENUM("prec", false, vp__case_precs, vp_case_in, prec),
    VP_JROW_ENUM("attn", false, vp__case_attns, vp_case_in, attn),
    VP_JROW_BOOL("infer", false, vp_case_in, infer),
    {.name = "generate", .type = VP_JT_OBJECT, .required = true,
     .apply = gen_fields},
    VP_JROW_ENUM("cache", false, CACHES, vp_case_in, gen.cache),
    VP_JROW_ENUM("load", false, vp__case_loads, vp_case_in, ft.load),
    {.name = "runs", .type = VP_JT_ARRAY, .apply = read_runs},
    ROW_U64("kv_cache_bytes", 1, gen.kv_cache_bytes),
    ROW_U64("after_model", 1, after_model),
    ROW_U64("peak_alloc", 1, peak_alloc),
    ROW_U64("peak_reserved", 1, peak_reserved),
    ROW_U64("device_used", 1, device_used),
    {.name = "num_alloc_retries", .type = VP_JT_U64, .max = BIG,
     .apply = vp__jset_node, .offset = offsetof(vp_case_in, retries_node)},
    VP_JROW_INFO("params", VP_JT_U64),
    VP_JROW_INFO("ms_per_token", VP_JT_NUMBER),
    /* fields of fine-tuning setups, not modelled with generate() */
    VP_JROW_LATER("lora"),
    VP_JROW_LATER("quant"),
    VP_JROW_LATER("base_dtype"),
    VP_JROW_LATER("freeze"),
};
const size_t vp__n_gen_rows = N(vp__gen_rows);

/* The measured figures agree as run_generate records them: peak_alloc is
 * the largest run peak, peak_reserved at least every run's reserved bytes
 * (the largest when no allocation was retried). */
static vp_status check_runs(const vp_case_in *in, vp_error *err)
{
    const vp_gen_in *g = &in->gen;
    const vp_jdoc *d = in->doc;
    uint64_t peak = 0, res = 0;

    for (uint32_t k = 0; k < g->n_runs; k++) {
        peak = g->run[k].peak > peak ? g->run[k].peak : peak;
        res = g->run[k].reserved > res ? g->run[k].reserved : res;
    }
    if (g->n_runs && in->peak_alloc && in->peak_alloc != peak)
        return vp__jerr(d, vp__jdoc_member(d, 0, "peak_alloc"), false,
                        VP_ERANGE, err, "peak_alloc %" PRIu64 " is not the "
                        "largest run peak (%" PRIu64 ")", in->peak_alloc,
                        peak);
    bool no_retry = in->retries_node >= 0 &&
                    json_integer_value(d->nodes[in->retries_node].value) == 0;
    if (in->peak_reserved && res &&
        (in->peak_reserved < res || (no_retry && in->peak_reserved != res)))
        return vp__jerr(d, vp__jdoc_member(d, 0, "peak_reserved"), false,
                        VP_ERANGE, err, "peak_reserved %" PRIu64 " is not "
                        "the largest reserved bytes of the runs (%" PRIu64
                        ")", in->peak_reserved, res);
    return VP_OK;
}

/* ---- running a case -------------------------------------------------------- */

/* The setup run_generate measured: bf16 weights built in their dtype,
 * no_grad, after collect_more.py's warm-up (the workspaces exist). */
static vp_status case_setup(const vp_case_in *in, const vp_validate_opts *o,
                            vp_setup *s, vp_error *err)
{
    const vp_jdoc *d = in->doc;
    const vp_gen_in *g = &in->gen;

    if (in->infer == false && vp__jdoc_member(d, 0, "infer") >= 0)
        return vp__jerr(d, vp__jdoc_member(d, 0, "infer"), false, VP_ERANGE,
                        err, "generate() runs under no_grad: 'infer' must "
                        "be true");
    if (in->ft.load >= 0 && vp__case_load_map[in->ft.load] != VP_LOAD_DTYPE)
        return vp__jerr(d, vp__jdoc_member(d, 0, "load"), false,
                        VP_EUNSUPPORTED, err, "generate() after loading the "
                        "weights as \"%s\" is not modelled (load \"dtype\" "
                        "is)", vp__case_loads[in->ft.load]);
    if (o->base != NULL)
        *s = *o->base;
    else
        vp_setup_init(s);
    s->fresh_process = false;
    s->ft.load = VP_LOAD_DTYPE;
    s->precision = in->prec >= 0 ? vp__case_prec_map[in->prec] : VP_PREC_BF16;
    if (in->attn >= 0) {
        s->attn = (vp_attn_impl)in->attn;
        s->attn_set = true;
    }
    s->batch = in->batch;
    s->seq = g->prompt;
    s->steps = g->n_runs ? g->n_runs : 1;
    s->generate.prompt = g->prompt;
    s->generate.new_tokens = g->new_tokens;
    s->generate.min_new = g->new_tokens;
    s->generate.cache = g->cache >= 0 ? (vp_cache_impl)g->cache
                                      : VP_CACHE_DYNAMIC;
    s->generate.sample = g->sample;
    s->generate.top_k = g->sample ? CASE_TOP_K : 0;
    s->generate.top_p = g->sample;
    s->generate.padded = g->pad;
    return VP_OK;
}

static void gen_metrics(const vp_case_in *in, const vp_estimate *e,
                        vp_case_result *out)
{
    const uint64_t pred[] = {e->peak_alloc, e->peak_reserved, e->after_model,
                             e->device_used, e->gen.kv_cache_bytes};
    const uint64_t meas[] = {in->peak_alloc, in->peak_reserved,
                             in->after_model, in->device_used,
                             in->gen.kv_cache_bytes};
    static const char *const names[] = {"peak_alloc", "peak_reserved",
                                        "after_model", "device_used",
                                        "kv_cache_bytes"};

    for (size_t i = 0; i < N(names); i++)
        if (meas[i] > 0)
            vp__case_metric(out, names[i], pred[i], meas[i]);
    for (uint32_t k = 0; k < in->gen.n_runs && k < e->steps; k++) {
        char name[32];
        snprintf(name, sizeof name, "run%" PRIu32 ".peak", k + 1);
        vp__case_metric(out, name, e->step[k].peak[VP_PHASE_FORWARD],
                        in->gen.run[k].peak);
    }
}

vp_status vp__validate_generate(const vp_case_in *in,
                                const vp_validate_opts *o,
                                vp_case_result *out, vp_error *err)
{
    vp_setup s;
    vp_estimate e;
    vp_status st = check_runs(in, err);

    if (st == VP_OK)
        st = case_setup(in, o, &s, err);
    if (st != VP_OK)
        return st;
    vp_model *m = vp__case_find_model(in, o->dirs, o->n_dirs, o->path, err);
    if (m == NULL)
        return err != NULL ? err->code : VP_EIO;
    vp_graph *g = vp_graph_build(m, s.batch, s.seq, err);
    if (g == NULL)
        st = err != NULL ? err->code : VP_ESCHEMA;
    else
        st = vp_simulate(g, &s, &e, NULL, NULL, err);
    if (st == VP_OK)
        gen_metrics(in, &e, out);
    vp_graph_free(g);
    vp_model_free(m);
    return st;
}
