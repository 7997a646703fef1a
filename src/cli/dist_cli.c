/* estimate's data-parallel run: its options (CLI_DIST_ROWS) into a
 * vp_dist, and the report of its roles (the ranks simulated, and the most
 * loaded one, whose full report follows). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define NAME_OF(name, str) str,
const char *const cli_strategies[] = {VP_DIST_STRATEGY_MAP(NAME_OF) NULL};
const char *const cli_prefetches[] = {VP_PREFETCH_MAP(NAME_OF) NULL};
#undef NAME_OF
/* vp_mp_dtype order, less NONE */
const char *const cli_mp_dtypes[] = {"fp32", "bf16", "fp16", NULL};

/* --reshard-after-forward: true, false, or a number of ranks >= 2. */
static int parse_reshard(const char *t, int32_t *out)
{
    char *end;
    unsigned long n;

    if (strcmp(t, "true") == 0 || strcmp(t, "false") == 0) {
        *out = t[0] == 't';
        return -1;
    }
    n = strtoul(t, &end, 10);
    if (*t < '0' || *t > '9' || *end != '\0' || n < 2 ||
        n > VP_DIST_MAX_WORLD)
        return cli_usage_error("invalid value '%s' for "
                               "--reshard-after-forward (true, false, or "
                               "2 to %u ranks)", t, VP_DIST_MAX_WORLD);
    *out = (int32_t)n;
    return -1;
}

int cli_dist_parse(const cli_val *v, vp_dist *d, bool *set)
{
    vp_dist_init(d);
    *set = v[CLI_O_STRATEGY].given &&
           v[CLI_O_STRATEGY].choice != VP_DIST_NONE;
    for (int id = CLI_O_WORLD; id < CLI_O__DIST_END; id++)
        if (v[id].given && !*set)
            return cli_usage_error("--%s needs --strategy",
                                   id == CLI_O_WORLD ? "world"
                                                     : "its option");
    if (!*set)
        return -1;
    d->strategy = (vp_dist_strategy)v[CLI_O_STRATEGY].choice;
    d->world = v[CLI_O_WORLD].given ? (uint32_t)v[CLI_O_WORLD].u : 1;
    d->shard = v[CLI_O_SHARD].given ? (uint32_t)v[CLI_O_SHARD].u : 0;
    if (v[CLI_O_PARAM_DTYPE].given)
        d->param_dtype = (vp_mp_dtype)(v[CLI_O_PARAM_DTYPE].choice + 1);
    if (v[CLI_O_REDUCE_DTYPE].given)
        d->reduce_dtype = (vp_mp_dtype)(v[CLI_O_REDUCE_DTYPE].choice + 1);
    if (v[CLI_O_BUFFER_DTYPE].given)
        d->buffer_dtype = (vp_mp_dtype)(v[CLI_O_BUFFER_DTYPE].choice + 1);
    int rc;
    if (v[CLI_O_RESHARD].given &&
        (rc = parse_reshard(v[CLI_O_RESHARD].text,
                            &d->reshard_after_forward)) >= 0)
        return rc;
    if (v[CLI_O_BUCKET_CAP].given) {
        if (v[CLI_O_BUCKET_CAP].u == 0)
            return cli_usage_error("--bucket-cap must be more than 0 bytes");
        d->bucket_cap = v[CLI_O_BUCKET_CAP].u;
    }
    d->static_graph = v[CLI_O_STATIC_GRAPH].given;
    d->find_unused = v[CLI_O_FIND_UNUSED].given;
    d->broadcast_buffers = !v[CLI_O_NO_BCAST_BUFFERS].given;
    d->rebuild_held = !v[CLI_O_REBUILD_FREED].given;
    d->overlap_with_ddp = v[CLI_O_OVERLAP_DDP].given;
    d->limit_all_gathers = !v[CLI_O_NO_LIMIT_AG].given;
    d->forward_prefetch = v[CLI_O_FWD_PREFETCH].given;
    if (v[CLI_O_BWD_PREFETCH].given)
        d->backward_prefetch = (vp_prefetch)v[CLI_O_BWD_PREFETCH].choice;
    d->use_orig_params = v[CLI_O_ORIG_PARAMS].given;
    d->cpu_offload = v[CLI_O_CPU_OFFLOAD].given;
    if (v[CLI_O_DS].given) {
        vp_error e;
        if (!vp_dist_is_deepspeed(d->strategy))
            return cli_usage_error("--ds is DeepSpeed's (--strategy "
                                   "deepspeed-zero1, -zero2, -zero3)");
        if (vp_ds_config_parse(&d->ds, v[CLI_O_DS].text, &e) != VP_OK)
            return cli_usage_error("--ds: %s", e.msg);
    }
    return -1;
}

int cli_tp_parse(const cli_val *v, const vp_dist *d, vp_tp_layout *l)
{
    l->tp = v[CLI_O_TP].given ? (uint32_t)v[CLI_O_TP].u : 1;
    l->pp = v[CLI_O_PP].given ? (uint32_t)v[CLI_O_PP].u : 1;
    l->stage = v[CLI_O_STAGE].given ? (uint32_t)v[CLI_O_STAGE].u
                                    : VP_TP_WORST;
    l->disable_loss_parallel = v[CLI_O_NO_LOSS_PARALLEL].given;
    bool any = v[CLI_O_TP].given || v[CLI_O_PP].given ||
               v[CLI_O_SCHEDULE].given || v[CLI_O_STAGE].given;
    if (l->disable_loss_parallel && l->tp == 1)
        return cli_usage_error("--disable-loss-parallel needs --tp > 1");
    if (any && d->strategy != VP_DIST_FSDP2)
        return cli_usage_error("--tp, --pp, --schedule and --stage compose "
                               "with --strategy fsdp2 (torchtitan)");
    if ((v[CLI_O_SCHEDULE].given || v[CLI_O_STAGE].given) && l->pp == 1)
        return cli_usage_error("--schedule and --stage need --pp > 1");
    if (l->stage != VP_TP_WORST && l->stage >= l->pp)
        return cli_usage_error("--stage %u is not one of the %u stages",
                               l->stage, l->pp);
    if (v[CLI_O_SCHEDULE].given &&
        strcmp(v[CLI_O_SCHEDULE].text, "1f1b") != 0)
        return cli_usage_error("--schedule %s with fsdp2 is not modelled "
                               "(1f1b is: torch.distributed.pipelining's "
                               "Schedule1F1B)",
                               v[CLI_O_SCHEDULE].text);
    return -1;
}

void cli_tp_table(FILE *f, const vp_tp_layout *l)
{
    fprintf(f, "tensor parallel %" PRIu32 " (sequence-parallel norms%s), "
               "pipeline stage %" PRIu32 " of %" PRIu32 "%s%s\n\n",
            l->tp,
            l->disable_loss_parallel ? ", logits gathered: no loss_parallel"
                                     : "",
            l->stage, l->pp, l->pp > 1 ? " (1F1B)" : "",
            l->ac_full ? ", every layer checkpointed" : "");
}

void cli_tp_json(json_t *dist, const vp_tp_layout *l)
{
    cli_jset(dist, "tp", cli_ju64(l->tp));
    cli_jset(dist, "pp", cli_ju64(l->pp));
    cli_jset(dist, "stage", cli_ju64(l->stage));
    cli_jset(dist, "schedule", json_string(l->pp > 1 ? "1f1b" : "none"));
    if (l->disable_loss_parallel) /* only when set: the schema stands */
        cli_jset(dist, "disable_loss_parallel", json_true());
}

/* "0" or "1-6" */
static const char *rank_span(const vp_rank_estimate *r, char *buf, size_t n)
{
    if (r->n_ranks == 1)
        snprintf(buf, n, "%" PRIu32, r->rank);
    else
        snprintf(buf, n, "%" PRIu32 " and %" PRIu32 " more", r->rank,
                 r->n_ranks - 1);
    return buf;
}

void cli_dist_table(FILE *f, const vp_dist *d, const vp_rank_estimate *r,
                    size_t n, size_t worst)
{
    char a[32], b[32], c[48];

    fprintf(f, "data parallel %s over %" PRIu32 " ranks",
            vp_dist_strategy_name(d->strategy), d->world);
    if (d->shard && d->shard != d->world)
        fprintf(f, " (shard groups of %" PRIu32 ")", d->shard);
    if (d->param_dtype)
        fprintf(f, ", param_dtype %s, reduce_dtype %s",
                vp_mp_dtype_name(d->param_dtype),
                vp_mp_dtype_name(d->reduce_dtype ? d->reduce_dtype
                                                 : d->param_dtype));
    fprintf(f, "\n%zu rank role%s simulated:\n", n, n == 1 ? "" : "s");
    for (size_t k = 0; k < n; k++)
        fprintf(f, "  rank %-18s peak allocated %11s, reserved %11s%s\n",
                rank_span(&r[k], c, sizeof c),
                vp_size_format(r[k].est.peak_alloc, a, sizeof a),
                vp_size_format(r[k].est.peak_reserved, b, sizeof b),
                k == worst ? "  (most loaded)" : "");
    fprintf(f, "the report below is rank %" PRIu32 "'s\n\n", r[worst].rank);
}

/* DeepSpeed's knobs as simulated, by their config names. */
static json_t *ds_json(const vp_ds_config *c, bool stage3)
{
    static const char *const off[] = {"none", "cpu", "nvme"};
    json_t *o = json_object();
    cli_jset(o, "reduce_bucket_size", cli_ju64(c->reduce_bucket_size));
    cli_jset(o, "allgather_bucket_size", cli_ju64(c->allgather_bucket_size));
    cli_jset(o, "contiguous_gradients", json_boolean(c->contiguous_gradients));
    /* overlap_comm's default: stage 3's (zero/config.py) */
    cli_jset(o, "overlap_comm", json_boolean(c->overlap_comm < 0
                                                 ? stage3
                                                 : c->overlap_comm));
    cli_jset(o, "round_robin_gradients",
             json_boolean(c->round_robin_gradients));
    cli_jset(o, "offload_optimizer", json_string(off[c->offload_optimizer]));
    cli_jset(o, "offload_param", json_string(off[c->offload_param]));
    cli_jset(o, "stage3_prefetch_bucket_size",
             cli_ju64(c->prefetch_bucket_size));
    cli_jset(o, "stage3_max_live_parameters",
             cli_ju64(c->max_live_parameters));
    cli_jset(o, "stage3_max_reuse_distance", cli_ju64(c->max_reuse_distance));
    cli_jset(o, "stage3_param_persistence_threshold",
             cli_ju64(c->param_persistence_threshold));
    cli_jset(o, "sub_group_size", cli_ju64(c->sub_group_size));
    cli_jset(o, "gradient_clipping", json_real(c->gradient_clipping));
    cli_jset(o, "zero_init", json_boolean(c->zero_init));
    return o;
}

json_t *cli_dist_json(const vp_dist *d, const vp_rank_estimate *r, size_t n,
                      size_t worst)
{
    json_t *o = json_object(), *roles = json_array();

    cli_jset(o, "strategy", json_string(vp_dist_strategy_name(d->strategy)));
    cli_jset(o, "world", cli_ju64(d->world));
    cli_jset(o, "shard", cli_ju64(d->shard ? d->shard : d->world));
    cli_jset(o, "param_dtype", json_string(vp_mp_dtype_name(d->param_dtype)));
    cli_jset(o, "reduce_dtype",
             json_string(vp_mp_dtype_name(d->reduce_dtype)));
    if (vp_dist_is_deepspeed(d->strategy))
        cli_jset(o, "ds_config",
                 ds_json(&d->ds, d->strategy == VP_DIST_DS_ZERO3));
    for (size_t k = 0; k < n; k++) {
        json_t *x = json_object();
        cli_jset(x, "rank", cli_ju64(r[k].rank));
        cli_jset(x, "ranks", cli_ju64(r[k].n_ranks));
        cli_jset(x, "peak_alloc", cli_ju64(r[k].est.peak_alloc));
        cli_jset(x, "peak_reserved", cli_ju64(r[k].est.peak_reserved));
        cli_jset(x, "device_used", cli_ju64(r[k].est.device_used));
        cli_jpush(roles, x);
    }
    cli_jset(o, "roles", roles);
    cli_jset(o, "most_loaded_rank", cli_ju64(r[worst].rank));
    return o;
}
