/* The JSON entry point for bindings (api.h), on jansson. */
#define _POSIX_C_SOURCE 200809L
#include "vramplan/api.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist_ds.h"
#include "internal.h"

typedef enum { CMD_ESTIMATE, CMD_MAXBATCH, CMD_PLAN } command;

typedef struct request {
    command cmd;
    const char *model, *gpu, *gpu_dir, *checkpoint, *selective;
    const char *generate, *cache; /* the generate spec and cache name */
    json_t *budget;             /* as given (integer, size, fraction)  */
    uint64_t global_batch;
    vp_setup setup;
    bool precision_set, optimizer_set;
    vp_dist dist;               /* estimate's data-parallel run        */
    bool dist_set;              /* any of DIST_KEYS given              */
    vp_tp_layout tp;            /* fsdp2's tp, pp, stage (1, 1, worst) */
} request;

/* Every key a request may hold (plan also takes global_batch). */
static const char *const KEYS[] = {
    "command", "model", "batch", "seq", "target", "precision", "optimizer",
    "checkpoint", "selective", "accum", "steps", "attention", "keep_grads",
    "inference", "expandable_segments", "offload_optimizer",
    "offload_activations", "compress_activations", "int8_weights",
    "context", "cublas_workspace", "budget", "gpu", "gpu_dir",
    "global_batch", "strategy", "world", "shard", "param_dtype",
    "reduce_dtype", "reshard_after_forward", "bucket_cap", "rebuild_freed",
    "cpu_offload", "ds_config", "tp", "pp", "stage", "schedule",
    "disable_loss_parallel", "lora", "freeze", "quant", "double_quant", "load",
    "base_dtype", "generate", "cache", NULL};

static vp_status bad(vp_error *err, const char *key, const char *want)
{
    return vp_error_set(err, VP_EARG, "'%s' must be %s", key, want);
}

static vp_status get_count(json_t *v, const char *key, uint64_t min,
                           uint64_t max, uint64_t *out, vp_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) < min ||
        (uint64_t)json_integer_value(v) > max) {
        char want[96];
        snprintf(want, sizeof want, "an integer from %llu to %llu",
                 (unsigned long long)min, (unsigned long long)max);
        return bad(err, key, want);
    }
    *out = (uint64_t)json_integer_value(v);
    return VP_OK;
}

/* A size: an integer of bytes or a string with a unit ("24GiB"). */
static vp_status get_size(json_t *v, const char *key, uint64_t *out,
                          vp_error *err)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return VP_OK;
    }
    if (json_is_string(v)) {
        vp_error e;
        if (vp_size_parse(json_string_value(v), out, &e) == VP_OK)
            return VP_OK;
        return vp_error_set(err, VP_EARG, "'%s': %s", key, e.msg);
    }
    return bad(err, key, "a number of bytes or a size such as \"24GiB\"");
}

static vp_status get_flag(json_t *v, const char *key, bool *out,
                          vp_error *err)
{
    if (!json_is_boolean(v))
        return bad(err, key, "true or false");
    *out = json_is_true(v);
    return VP_OK;
}

static vp_status get_str(json_t *v, const char *key, const char **out,
                         vp_error *err)
{
    if (!json_is_string(v) || !*json_string_value(v))
        return bad(err, key, "a non-empty string");
    *out = json_string_value(v);
    return VP_OK;
}

/* The enumerated fields: precision, optimizer, attention. */
static vp_status get_name(json_t *v, const char *key, request *r,
                          vp_error *err)
{
    const char *s;
    if (get_str(v, key, &s, err) != VP_OK)
        return VP_EARG;
    vp_status st;
    if (strcmp(key, "precision") == 0) {
        st = vp_precision_parse(s, &r->setup.precision);
        r->precision_set = true;
    } else if (strcmp(key, "optimizer") == 0) {
        st = vp_optimizer_parse(s, &r->setup.optimizer);
        r->optimizer_set = true;
    } else {
        st = vp_attn_impl_parse(s, &r->setup.attn);
        r->setup.attn_set = true;
    }
    if (st != VP_OK)
        return vp_error_set(err, VP_EARG, "unknown %s '%s'", key, s);
    return VP_OK;
}

/* estimate's data-parallel run (as the CLI's --strategy and its
 * options): one key into r->dist. */
static vp_status dist_field(request *r, const char *key, json_t *v,
                            vp_error *err)
{
    vp_dist *d = &r->dist;
    uint64_t n;
    const char *s;
    vp_status st = VP_OK;

    if (!r->dist_set)
        vp_dist_init(d);
    r->dist_set = true;
    if (strcmp(key, "ds_config") == 0)
        return vp_ds_config_json(&d->ds, v, err);
    if (strcmp(key, "tp") == 0 || strcmp(key, "pp") == 0 ||
        strcmp(key, "stage") == 0) {
        if (get_count(v, key, key[0] == 's' ? 0 : 1, 1024, &n, err) != VP_OK)
            return VP_EARG;
        *(key[0] == 't' ? &r->tp.tp : key[0] == 'p' ? &r->tp.pp
                                                    : &r->tp.stage) =
            (uint32_t)n;
        return VP_OK;
    }
    if (strcmp(key, "disable_loss_parallel") == 0)
        return get_flag(v, key, &r->tp.disable_loss_parallel, err) == VP_OK
                   ? VP_OK
                   : VP_EARG;
    if (strcmp(key, "schedule") == 0) {
        if (get_str(v, key, &s, err) != VP_OK)
            return VP_EARG;
        if (strcmp(s, "1f1b") != 0)
            return vp_error_set(err, VP_EARG,
                                "'schedule' '%s' with fsdp2 is not "
                                "modelled (1f1b is)",
                                s);
        return VP_OK;
    }
    if (strcmp(key, "world") == 0 || strcmp(key, "shard") == 0) {
        if (get_count(v, key, 1, VP_DIST_MAX_WORLD, &n, err) != VP_OK)
            return VP_EARG;
        *(key[0] == 'w' ? &d->world : &d->shard) = (uint32_t)n;
    } else if (strcmp(key, "bucket_cap") == 0) {
        if (get_size(v, key, &d->bucket_cap, err) != VP_OK)
            return VP_EARG;
        if (d->bucket_cap == 0)
            return bad(err, key, "more than 0 bytes");
    } else if (strcmp(key, "rebuild_freed") == 0 ||
               strcmp(key, "cpu_offload") == 0) {
        if (!json_is_boolean(v))
            return bad(err, key, "true or false");
        if (key[0] == 'r')
            d->rebuild_held = !json_is_true(v);
        else
            d->cpu_offload = json_is_true(v);
    } else if (strcmp(key, "reshard_after_forward") == 0) {
        if (json_is_boolean(v))
            d->reshard_after_forward = json_is_true(v);
        else if (get_count(v, key, 2, VP_DIST_MAX_WORLD, &n, err) == VP_OK)
            d->reshard_after_forward = (int32_t)n;
        else
            return bad(err, key, "true, false or a number of ranks >= 2");
    } else {
        if (get_str(v, key, &s, err) != VP_OK)
            return VP_EARG;
        if (strcmp(key, "strategy") == 0)
            st = vp_dist_strategy_parse(s, &d->strategy);
        else
            st = vp_mp_dtype_parse(s, key[0] == 'p' ? &d->param_dtype
                                                    : &d->reduce_dtype);
        if (st != VP_OK || (key[0] != 's' && strcmp(s, "none") == 0))
            return vp_error_set(err, VP_EARG, "unknown %s '%s'", key, s);
    }
    return VP_OK;
}

/* The fine-tuning keys, named and spelled as the CLI's options. */
static vp_status ft_field(vp_setup *s, const char *key, json_t *v,
                          vp_error *err)
{
    const char *t = NULL;
    vp_status st;

    if (strcmp(key, "double_quant") == 0)
        return get_flag(v, key, &s->ft.double_quant, err);
    if ((st = get_str(v, key, &t, err)) != VP_OK)
        return st;
    if (strcmp(key, "lora") == 0)
        return vp_lora_parse(t, &s->ft.lora, err);
    if (strcmp(key, "freeze") == 0)
        return vp_freeze_parse(t, &s->ft, err);
    if (strcmp(key, "quant") == 0)
        st = vp_quant_parse(t, &s->ft.quant);
    else if (strcmp(key, "load") == 0)
        st = vp_load_parse(t, &s->ft.load);
    else
        st = vp_base_dtype_parse(t, &s->ft.base_dtype);
    if (st != VP_OK)
        return vp_error_set(err, VP_EARG, "unknown %s '%s'", key, t);
    return VP_OK;
}

/* One key of the request into r. */
static vp_status field(request *r, const char *key, json_t *v, vp_error *err)
{
    vp_setup *s = &r->setup;
    uint64_t n;
    vp_status st = VP_OK;
    if (strcmp(key, "command") == 0) {
        /* read first by parse() */
    } else if (strcmp(key, "model") == 0) {
        st = get_str(v, key, &r->model, err);
    } else if (strcmp(key, "batch") == 0) {
        st = get_count(v, key, 1, UINT32_MAX, &s->batch, err);
    } else if (strcmp(key, "seq") == 0) {
        st = get_count(v, key, 1, UINT32_MAX, &s->seq, err);
    } else if (strcmp(key, "target") == 0) {
        st = get_count(v, key, 1, UINT32_MAX, &s->target, err);
    } else if (strcmp(key, "accum") == 0 || strcmp(key, "steps") == 0) {
        bool acc = key[0] == 'a';
        st = get_count(v, key, 1, acc ? UINT32_MAX : VP_MAX_STEPS, &n, err);
        *(acc ? &s->accum : &s->steps) = (uint32_t)n;
    } else if (strcmp(key, "precision") == 0 ||
               strcmp(key, "optimizer") == 0 ||
               strcmp(key, "attention") == 0) {
        st = get_name(v, key, r, err);
    } else if (strcmp(key, "checkpoint") == 0) {
        st = get_str(v, key, &r->checkpoint, err);
    } else if (strcmp(key, "selective") == 0) {
        st = get_str(v, key, &r->selective, err);
    } else if (strcmp(key, "keep_grads") == 0) {
        bool keep = false;
        st = get_flag(v, key, &keep, err);
        s->set_to_none = !keep;
    } else if (strcmp(key, "inference") == 0) {
        st = get_flag(v, key, &s->inference, err);
    } else if (strcmp(key, "expandable_segments") == 0) {
        st = get_flag(v, key, &s->alloc.expandable_segments, err);
    } else if (strcmp(key, "offload_optimizer") == 0) {
        st = get_flag(v, key, &s->offload_optimizer, err);
    } else if (strcmp(key, "offload_activations") == 0) {
        st = get_flag(v, key, &s->offload_activations, err);
    } else if (strcmp(key, "int8_weights") == 0) {
        bool on = false;
        st = get_flag(v, key, &on, err);
        s->weight_bits = on ? 8 : 0;
    } else if (strcmp(key, "compress_activations") == 0) {
        st = get_count(v, key, 2, 8, &n, err);
        if (st == VP_OK && n != 2 && n != 4 && n != 8)
            st = bad(err, key, "2, 4 or 8");
        s->act_bits = (uint32_t)n;
    } else if (strcmp(key, "context") == 0) {
        st = get_size(v, key, &s->context_bytes, err);
    } else if (strcmp(key, "cublas_workspace") == 0) {
        st = get_size(v, key, &s->cublas_workspace, err);
    } else if (strcmp(key, "budget") == 0) {
        r->budget = v;
    } else if (strcmp(key, "gpu") == 0) {
        st = get_str(v, key, &r->gpu, err);
    } else if (strcmp(key, "gpu_dir") == 0) {
        st = get_str(v, key, &r->gpu_dir, err);
    } else if (strcmp(key, "strategy") == 0 || strcmp(key, "world") == 0 ||
               strcmp(key, "shard") == 0 || strcmp(key, "param_dtype") == 0 ||
               strcmp(key, "reduce_dtype") == 0 ||
               strcmp(key, "reshard_after_forward") == 0 ||
               strcmp(key, "bucket_cap") == 0 ||
               strcmp(key, "rebuild_freed") == 0 ||
               strcmp(key, "cpu_offload") == 0 ||
               strcmp(key, "ds_config") == 0 || strcmp(key, "tp") == 0 ||
               strcmp(key, "pp") == 0 || strcmp(key, "stage") == 0 ||
               strcmp(key, "schedule") == 0 ||
               strcmp(key, "disable_loss_parallel") == 0) {
        st = dist_field(r, key, v, err);
    } else if (strcmp(key, "generate") == 0) {
        st = get_str(v, key, &r->generate, err);
    } else if (strcmp(key, "cache") == 0) {
        st = get_str(v, key, &r->cache, err);
    } else if (strcmp(key, "global_batch") == 0) {
        st = r->cmd != CMD_PLAN
                 ? vp_error_set(err, VP_EARG,
                                "'global_batch' is for the plan command")
                 : get_count(v, key, 1, UINT32_MAX, &r->global_batch, err);
    } else {
        st = ft_field(s, key, v, err);
    }
    return st;
}

/* 'generate' (the CLI's --generate SPEC) and 'cache', as the CLI takes
 * them: seq is the prompt's, and plan does not take them. */
static vp_status apply_generate(request *r, json_t *root, vp_error *err)
{
    vp_setup *s = &r->setup;
    if (!r->generate)
        return r->cache ? vp_error_set(err, VP_EARG,
                                       "'cache' needs 'generate'")
                        : VP_OK;
    if (r->cmd == CMD_PLAN)
        return vp_error_set(err, VP_EARG, "plan chooses a training setup; "
                            "'generate' is for estimate and maxbatch");
    if (json_object_get(root, "seq"))
        return vp_error_set(err, VP_EARG, "'seq' does not apply to "
                            "'generate' (the prompt's length is its "
                            "prompt=N)");
    if (vp_generate_parse(r->generate, &s->generate, err) != VP_OK)
        return VP_EARG;
    if (r->cache && vp_cache_impl_parse(r->cache, &s->generate.cache) !=
                        VP_OK)
        return vp_error_set(err, VP_EARG, "unknown cache '%s' (dynamic or "
                            "static)", r->cache);
    s->seq = s->generate.prompt;
    return VP_OK;
}

static vp_status parse(json_t *root, request *r, vp_error *err)
{
    memset(r, 0, sizeof *r);
    vp_setup_init(&r->setup);
    r->tp = (vp_tp_layout){1, 1, VP_TP_WORST, false, false};
    if (!json_is_object(root))
        return vp_error_set(err, VP_EARG, "the request must be an object");
    const char *cmd;
    json_t *c = json_object_get(root, "command");
    if (!c)
        return vp_error_set(err, VP_EARG, "the request has no 'command'");
    if (get_str(c, "command", &cmd, err) != VP_OK)
        return VP_EARG;
    if (strcmp(cmd, "estimate") == 0)
        r->cmd = CMD_ESTIMATE;
    else if (strcmp(cmd, "maxbatch") == 0)
        r->cmd = CMD_MAXBATCH;
    else if (strcmp(cmd, "plan") == 0)
        r->cmd = CMD_PLAN;
    else
        return vp_error_set(err, VP_EARG,
                            "unknown command '%s' (estimate, maxbatch or "
                            "plan)",
                            cmd);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        size_t k = 0;
        while (KEYS[k] && strcmp(KEYS[k], key) != 0)
            k++;
        if (!KEYS[k]) {
            const char *hint = vp__suggest(key, KEYS);
            if (hint)
                return vp_error_set(err, VP_EARG,
                                    "unknown field '%s' (did you mean "
                                    "'%s'?)",
                                    key, hint);
            return vp_error_set(err, VP_EARG, "unknown field '%s'", key);
        }
        if (field(r, key, v, err) != VP_OK)
            return VP_EARG;
    }
    if (!r->model)
        return vp_error_set(err, VP_EARG, "the request has no 'model'");
    if (r->dist_set && (r->cmd != CMD_ESTIMATE ||
                        r->dist.strategy == VP_DIST_NONE))
        return vp_error_set(err, VP_EARG,
                            r->cmd != CMD_ESTIMATE
                                ? "a data-parallel run ('strategy' and its "
                                  "fields) is estimate's only"
                                : "the data-parallel fields need a "
                                  "'strategy'");
    bool layout = r->tp.tp > 1 || r->tp.pp > 1;
    if (r->dist_set && (layout || r->tp.stage != VP_TP_WORST) &&
        r->dist.strategy != VP_DIST_FSDP2)
        return vp_error_set(err, VP_EARG,
                            "'tp', 'pp', 'stage' and 'schedule' compose with "
                            "the 'fsdp2' strategy (torchtitan)");
    if (r->tp.stage != VP_TP_WORST && r->tp.stage >= r->tp.pp)
        return vp_error_set(err, VP_EARG, "'stage' %u is not one of the %u "
                            "stages", r->tp.stage, r->tp.pp);
    if (r->tp.disable_loss_parallel && r->tp.tp == 1)
        return vp_error_set(err, VP_EARG, "'disable_loss_parallel' needs "
                            "'tp' > 1");
    return apply_generate(r, root, err);
}

/* ---- setup -------------------------------------------------------------- */

static vp_model *load_model(const char *model, char *path, size_t size,
                            vp_error *err)
{
    if (access(model, F_OK) != 0 && vp_resource_is_name(model)) {
        if (vp_resource_find(VP_RES_MODEL, model, NULL, path, size, err) !=
            VP_OK)
            return NULL;
        model = path;
    } else {
        snprintf(path, size, "%s", model);
    }
    return vp_model_load(model, err);
}

/* The GPU (when given) and the budget, as the CLI's --gpu and --budget. */
static vp_status apply_budget(request *r, vp_hw *hw, bool *have_hw,
                              vp_error *err)
{
    *have_hw = false;
    if (r->gpu) {
        char path[PATH_MAX];
        const char *file = r->gpu;
        if (vp_resource_is_name(r->gpu)) {
            if (vp_resource_find(VP_RES_GPU, r->gpu, r->gpu_dir, path,
                                 sizeof path, err) != VP_OK)
                return err ? err->code : VP_EIO;
            file = path;
        }
        vp_gpu_profile *p = vp_gpu_load(file, err);
        if (!p)
            return err ? err->code : VP_EIO;
        vp_gpu_hw(p, VP_GPU_BF16, hw);
        vp_hw_fill_defaults(hw);
        vp_gpu_free(p);
        *have_hw = true;
        r->setup.context_bytes = hw->context;
        r->setup.alloc.device_total = hw->memory;
        r->setup.alloc.limit =
            hw->memory > hw->context ? hw->memory - hw->context : 0;
    }
    json_t *b = r->budget;
    if (!b)
        return VP_OK;
    if (json_is_real(b)) {
        double f = json_real_value(b);
        if (!*have_hw)
            return vp_error_set(err, VP_EARG,
                                "a fractional 'budget' needs a 'gpu'");
        if (!(f > 0.0 && f <= 1.0))
            return bad(err, "budget", "a fraction from 0 to 1");
        r->setup.alloc.limit = (uint64_t)(f * (double)hw->memory);
        return VP_OK;
    }
    if (get_size(b, "budget", &r->setup.alloc.limit, err) != VP_OK)
        return VP_EARG;
    if (r->setup.alloc.limit == 0)
        return bad(err, "budget", "more than 0 bytes");
    return VP_OK;
}

/* ---- responses ---------------------------------------------------------- */

static const char *const CAT_KEYS[VP_CAT__COUNT] = {
    [VP_CAT_PARAM] = "params",          [VP_CAT_GRAD] = "grads",
    [VP_CAT_OPTIM] = "optimizer",       [VP_CAT_ACT] = "activations",
    [VP_CAT_TEMP] = "temporaries",      [VP_CAT_CAST] = "autocast_cache",
    [VP_CAT_INPUT] = "input",           [VP_CAT_WORKSPACE] = "workspace"};

/* An integer of bytes: jansson's integers are signed 64-bit. */
static json_t *num(uint64_t v)
{
    return json_integer(v > (uint64_t)LLONG_MAX ? LLONG_MAX : (json_int_t)v);
}

static void put(json_t *o, const char *key, json_t *v)
{
    json_object_set_new(o, key, v);
}

/* The three peaks every answer gives, in this order. */
static void put_peaks(json_t *o, uint64_t alloc, uint64_t reserved,
                      uint64_t device_used)
{
    put(o, "peak_alloc", num(alloc));
    put(o, "peak_reserved", num(reserved));
    put(o, "device_used", num(device_used));
}

static json_t *generate_json(const vp_gen_estimate *g)
{
    json_t *o = json_object();
    put(o, "weights", num(g->weights));
    put(o, "kv_cache_bytes", num(g->kv_cache_bytes));
    put(o, "kv_at_peak", num(g->kv_at_peak));
    put(o, "prefill_peak", num(g->prefill_peak));
    put(o, "decode_peak", num(g->decode_peak));
    put(o, "peak_token", num(g->peak_token));
    return o;
}

static json_t *estimate_json(const vp_estimate *e, bool generate)
{
    json_t *o = json_object(), *cat = json_object(), *top = json_array(),
           *steps = json_array();
    put(o, "params", num(e->params));
    put(o, "total_params", num(e->total_params));
    put(o, "setup_peak", num(e->setup_peak));
    put_peaks(o, e->peak_alloc, e->peak_reserved, e->device_used);
    put(o, "peak_step", num(e->peak_step));
    put(o, "peak_phase", json_string(vp_phase_name(e->peak_phase)));
    put(o, "peak_op", json_string(e->peak_op));
    for (int k = 0; k < VP_CAT__COUNT; k++)
        put(cat, CAT_KEYS[k], num(e->by_category[k]));
    put(o, "by_category", cat);
    for (uint32_t i = 0; i < e->n_top_layers && i < VP_TOP_LAYERS; i++) {
        json_t *l = json_object();
        put(l, "name", json_string(e->top_layers[i].name));
        put(l, "bytes", num(e->top_layers[i].bytes));
        json_array_append_new(top, l);
    }
    put(o, "top_layers", top);
    if (generate)
        put(o, "generate", generate_json(&e->gen));
    for (uint32_t i = 0; i < e->steps && i < VP_MAX_STEPS; i++) {
        const vp_phase_peaks *p = &e->step[i];
        json_t *s = json_object();
        put(s, "start", num(p->start));
        put(s, "fwd_peak", num(p->peak[VP_PHASE_FORWARD]));
        put(s, "after_fwd", num(p->after_fwd));
        put(s, "bwd_peak", num(p->peak[VP_PHASE_BACKWARD]));
        put(s, "after_bwd", num(p->after_bwd));
        put(s, "opt_peak", num(p->peak[VP_PHASE_OPTIMIZER]));
        put(s, "end", num(p->end));
        put(s, "reserved", num(p->reserved));
        json_array_append_new(steps, s);
    }
    put(o, "steps", steps);
    return o;
}

/* A segment selection (--checkpoint / --selective) for the graph. */
static vp_status select_spec(const vp_graph *g, const char *spec, bool **out,
                             vp_error *err)
{
    size_t n = vp_graph_segment_count(g);
    *out = calloc(n ? n : 1, sizeof **out);
    if (!*out)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    return vp_graph_checkpoint_select(g, spec, *out, err);
}

/* A data-parallel run: every role simulated (vp_simulate_ranks, or with
 * tp or pp > 1 vp_tp_simulate, which builds its own graph: g unused);
 * *e is the most loaded rank's, and res gets "dist" with the roles. */
static vp_status run_roles(request *r, const vp_model *m, const vp_graph *g,
                           json_t *res, vp_estimate *e, vp_error *err)
{
    vp_rank_estimate *roles = NULL;
    size_t n = 0, worst = 0;
    bool layout = r->tp.tp > 1 || r->tp.pp > 1;

    r->setup.dist = &r->dist;
    vp_status st =
        layout ? vp_tp_simulate(m, &r->tp, &r->setup, &roles, &n, &worst, err)
               : vp_simulate_ranks(g, &r->setup, &roles, &n, &worst, err);
    if (st != VP_OK)
        return st;
    json_t *o = json_object(), *a = json_array();
    if (layout) {
        put(o, "tp", num(r->tp.tp));
        put(o, "pp", num(r->tp.pp));
        put(o, "stage", num(r->tp.stage));
    }
    put(o, "strategy", json_string(vp_dist_strategy_name(r->dist.strategy)));
    put(o, "world", num(r->dist.world));
    for (size_t k = 0; k < n; k++) {
        json_t *x = json_object();
        put(x, "rank", num(roles[k].rank));
        put(x, "ranks", num(roles[k].n_ranks));
        const vp_estimate *re = &roles[k].est;
        put_peaks(x, re->peak_alloc, re->peak_reserved, re->device_used);
        json_array_append_new(a, x);
    }
    put(o, "roles", a);
    put(o, "most_loaded_rank", num(roles[worst].rank));
    put(res, "dist", o);
    *e = roles[worst].est;
    free(roles);
    return VP_OK;
}

/* fsdp2 with tp or pp > 1: torchtitan's full activation checkpointing
 * ('checkpoint' "all") or none; the layout's own graphs. */
static vp_status tp_checkpoint(request *r, vp_error *err)
{
    const char *c = r->checkpoint;
    r->tp.ac_full = c && strcmp(c, "all") == 0;
    if ((c && !r->tp.ac_full && strcmp(c, "none") != 0) || r->selective)
        return vp_error_set(err, VP_EARG,
                            "with 'tp' or 'pp': 'checkpoint' all or none "
                            "(torchtitan's activation_checkpoint.mode), no "
                            "'selective'");
    r->checkpoint = NULL;
    return VP_OK;
}

static vp_status run_estimate(request *r, const vp_model *m, json_t *res,
                              vp_error *err)
{
    vp_graph *g = vp_graph_build_target(m, r->setup.batch, r->setup.seq,
                                        r->setup.target, err);
    if (!g)
        return err ? err->code : VP_ENOMEM;
    bool *ck = NULL, *sel = NULL;
    vp_status st = VP_OK;
    if (r->dist_set && (r->tp.tp > 1 || r->tp.pp > 1))
        st = tp_checkpoint(r, err);
    if (st == VP_OK && r->checkpoint &&
        (st = select_spec(g, r->checkpoint, &ck, err)) == VP_OK) {
        r->setup.checkpoint = ck;
        r->setup.n_checkpoint = vp_graph_segment_count(g);
    }
    if (st == VP_OK && r->selective &&
        (st = select_spec(g, r->selective, &sel, err)) == VP_OK) {
        r->setup.selective = sel;
        r->setup.n_selective = vp_graph_segment_count(g);
    }
    vp_estimate e;
    memset(&e, 0, sizeof e);
    if (st == VP_OK && r->dist_set)
        st = run_roles(r, m, g, res, &e, err);
    else if (st == VP_OK)
        st = vp_simulate(g, &r->setup, &e, NULL, NULL, err);
    if (st == VP_OK || st == VP_EOOM) {
        json_t *est = estimate_json(&e, r->generate != NULL);
        json_object_update(res, est);
        json_decref(est);
        put(res, "fits", json_boolean(st == VP_OK));
        if (st == VP_EOOM)
            put(res, "error", json_string(err ? err->msg : ""));
    }
    free(ck);
    free(sel);
    vp_graph_free(g);
    return st;
}

static vp_status run_maxbatch(const request *r, const vp_model *m,
                              json_t *res, vp_error *err)
{
    if (r->setup.alloc.limit == 0)
        return vp_error_set(err, VP_EARG,
                            "maxbatch needs a 'budget' or a 'gpu'");
    vp_maxbatch_result *mb = malloc(sizeof *mb);
    if (!mb)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp_status st = vp_maxbatch(m, &r->setup, r->checkpoint, 0, mb, err);
    if (st == VP_OK) {
        put(res, "max_batch", num(mb->max_batch));
        put(res, "trials", num(mb->trials));
        if (mb->max_batch)
            put(res, "at_max",
                estimate_json(&mb->at_max, r->generate != NULL));
    }
    free(mb);
    return st;
}

static json_t *candidate_json(const vp_plan_candidate *k)
{
    /* the setup (names from the library's tables: plain ASCII) */
    json_t *o = json_pack("{s:s, s:s, s:b, s:s, s:o, s:o, s:o, s:b}",
                          "precision", vp_precision_name(k->precision),
                          "optimizer", vp_optimizer_name(k->optimizer),
                          "offload_optimizer", (int)k->offload,
                          "checkpoint", vp_ckpt_mode_name(k->ckpt),
                          "checkpointed", num(k->n_checkpointed),
                          "micro_batch", num(k->micro_batch),
                          "accum", num(k->accum), "fits", (int)k->fits);
    if (!o)
        return NULL;
    put_peaks(o, k->peak_alloc, k->peak_reserved, k->device_used);
    put(o, "step_seconds", json_real(k->time.total));
    put(o, "samples_per_s", json_real(k->samples_per_s));
    put(o, "mfu", json_real(k->time.mfu));
    put(o, "reason", json_string(k->reason));
    return o;
}

static vp_status run_plan(const request *r, const vp_model *m,
                          const vp_hw *hw, bool have_hw, json_t *res,
                          vp_error *err)
{
    if (!have_hw)
        return vp_error_set(err, VP_EARG,
                            "plan needs a 'gpu' (its rates time the "
                            "candidates)");
    vp_plan_request *q = calloc(1, sizeof *q);
    vp_plan_result *out = malloc(sizeof *out);
    vp_status st = VP_ENOMEM;
    if (!q || !out) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        goto done;
    }
    q->base = r->setup;
    q->hw = *hw;
    q->global_batch = r->global_batch ? r->global_batch : 32;
    if (r->precision_set)
        q->precisions[r->setup.precision] = true;
    if (r->optimizer_set)
        q->optimizers[r->setup.optimizer] = true;
    st = vp_plan_single(m, q, out, err);
    if (st == VP_OK) {
        json_t *c = json_array();
        for (size_t i = 0; i < out->n; i++)
            json_array_append_new(c, candidate_json(&out->cand[i]));
        put(res, "gpu", json_string(hw->name));
        put(res, "global_batch", num(q->global_batch));
        put(res, "simulations", num(out->simulations));
        put(res, "fits", json_boolean(out->n && out->cand[0].fits));
        put(res, "candidates", c);
    }
done:
    free(q);
    free(out);
    return st;
}

static vp_status run(request *r, json_t *res, vp_error *err)
{
    vp_hw hw;
    bool have_hw;
    char path[PATH_MAX];
    vp_status st = apply_budget(r, &hw, &have_hw, err);
    if (st != VP_OK)
        return st;
    vp_model *m = load_model(r->model, path, sizeof path, err);
    if (!m)
        return err ? err->code : VP_EIO;
    put(res, "command", json_string(r->cmd == CMD_ESTIMATE   ? "estimate"
                                    : r->cmd == CMD_MAXBATCH ? "maxbatch"
                                                             : "plan"));
    put(res, "model", json_string(vp_model_name(m)));
    put(res, "model_path", json_string(path));
    put(res, "budget", num(r->setup.alloc.limit));
    if (r->cmd == CMD_ESTIMATE)
        st = run_estimate(r, m, res, err);
    else if (r->cmd == CMD_MAXBATCH)
        st = run_maxbatch(r, m, res, err);
    else
        st = run_plan(r, m, &hw, have_hw, res, err);
    vp_model_free(m);
    return st;
}

vp_status vp_api_call(const char *request_json, char **response,
                      vp_error *err)
{
    vp_error_clear(err);
    if (!response)
        return vp_error_set(err, VP_EARG, "no response pointer");
    *response = NULL;
    if (!request_json)
        return vp_error_set(err, VP_EARG, "no request");
    size_t len = strnlen(request_json, (size_t)VP_API_MAX_REQUEST + 1);
    if (len > VP_API_MAX_REQUEST)
        return vp_error_at(err, VP_ELIMIT, "<request>", 0, 0, 0,
                           "a request is at most %u bytes "
                           "(VP_API_MAX_REQUEST)", VP_API_MAX_REQUEST);
    json_error_t je;
    json_t *root = json_loadb(request_json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return vp_error_at(err, VP_ESYNTAX, "<request>", (uint32_t)je.line,
                           (uint32_t)je.column, 1, "%s", je.text);
    request r;
    vp_status st = parse(root, &r, err);
    json_t *res = json_object();
    if (st == VP_OK && !res)
        st = vp_error_set(err, VP_ENOMEM, "out of memory");
    if (st == VP_OK)
        st = run(&r, res, err);
    if (st == VP_OK || (st == VP_EOOM && r.cmd == CMD_ESTIMATE)) {
        *response = json_dumps(res, JSON_COMPACT);
        if (!*response)
            st = vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    json_decref(res);
    json_decref(root);
    return st;
}

void vp_api_free(char *response)
{
    free(response);
}
