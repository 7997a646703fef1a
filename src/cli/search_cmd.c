/* The search commands on one GPU: maxbatch, plan (without --gpus),
 * techniques, and estimate's --checkpoint auto.
 *
 *   vramplan maxbatch models/gpt2-medium.yaml --budget 24GiB
 *   vramplan plan models/llama-1b.yaml --gpu rtx4090 --global-batch 64
 *   vramplan techniques models/gpt2-small.yaml --batch 16 --budget 24GiB
 *
 * Each is a library search (search.h, plan.h, techniques.h) over the
 * simulator; the steps simulated default to VP_STEADY_STEPS. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- --checkpoint auto ---------------------------------------------------- */

/* "  checkpointed: h.0 h.1 ... (3 more)" */
static void show_segments(const vp_graph *graph, const char *label,
                          const bool *set, size_t n)
{
    size_t shown = 0, count = 0;

    for (size_t i = 0; i < n; i++)
        count += set[i];
    if (count == 0)
        return;
    printf("  %s:", label);
    for (size_t i = 0; i < n; i++) {
        if (!set[i])
            continue;
        if (shown == 16) {
            printf(" ... (%zu more)", count - shown);
            break;
        }
        printf(" %s", vp_graph_segment(graph, i)->name);
        shown++;
    }
    putchar('\n');
}

int cli_checkpoint_auto(const vp_model *model, const vp_graph *graph,
                        vp_setup *setup, bool show, bool **ckpt, bool **sel)
{
    size_t n = vp_graph_segment_count(graph);
    vp_ckpt_plan plan;
    vp_error err;
    char fl[32];

    *ckpt = calloc(n > 0 ? n : 1, sizeof **ckpt);
    *sel = calloc(n > 0 ? n : 1, sizeof **sel);
    if (*ckpt == NULL || *sel == NULL)
        return cli_fail("out of memory");
    vp_status st = vp_checkpoint_auto_sel(model, setup, *ckpt, *sel, n, &plan,
                                          &err);
    if (st == VP_EOOM)
        return cli_report_no_fit(setup, &err);
    if (st != VP_OK)
        return cli_report(&err, NULL);
    if (show) {
        printf("checkpoint auto: %zu of %zu segments checkpointed, %zu with "
               "selective recomputation, recompute %s (%.1f%% of the step's "
               "FLOPs), %u simulations\n",
               plan.n_checkpointed, plan.n_segments, plan.n_selective,
               cli_si(plan.recompute_flops, "FLOP", fl, sizeof fl),
               plan.step_flops > 0
                   ? 100.0 * plan.recompute_flops / plan.step_flops
                   : 0.0,
               plan.simulations);
        show_segments(graph, "checkpointed", *ckpt, n);
        show_segments(graph, "selective", *sel, n);
    }
    setup->checkpoint = *ckpt;
    setup->n_checkpoint = n;
    setup->selective = *sel;
    setup->n_selective = n;
    return -1;
}

/* ---- what the searches share ------------------------------------------- */

static void search_help(FILE *f, const char *usage, const char *about)
{
    fputs(usage, f);
    fputs(about, f);
    fputs("\nOptions:\n", f);
    cli_setup_help(f, CLI_CMD_SEARCH);
    fputs("\n" CLI_SIZE_HELP "\n", f);
    cli_exit_help(f);
}

/* Whether argv holds option `name` ("--gpus" or "--gpus=..."). */
static bool arg_given(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);

    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strncmp(argv[i], name, n) == 0 &&
            (argv[i][n] == '\0' || argv[i][n] == '='))
            return true;
    return false;
}

/* Parse, apply --gpu, and check what maxbatch and techniques need: a
 * budget and a fixed checkpoint. The steps default to the steady state's
 * (an explicit --steps stays). Returns -1 to go on, or the exit status. */
static int search_setup(int argc, char **argv, void (*help)(FILE *),
                        const char *no_auto, cli_setup_args *a, vp_hw *hw,
                        bool *have_hw)
{
    int rc = cli_setup_parse(argc, argv, CLI_CMD_SEARCH, help, a);

    if (rc >= 0 || (rc = cli_setup_gpu(a, hw, have_hw)) >= 0)
        return rc;
    if (a->global_batch > 0)
        return cli_usage_error("--global-batch is plan's: %s takes the "
                               "micro-batch (--batch)", argv[0]);
    if (a->setup.alloc.limit == 0)
        return cli_usage_error("%s needs --budget or --gpu", argv[0]);
    if (a->checkpoint != NULL && strcmp(a->checkpoint, "auto") == 0)
        return cli_usage_error("%s", no_auto);
    if (!a->steps_given)
        a->setup.steps = VP_STEADY_STEPS;
    return -1;
}

/* ---- maxbatch ------------------------------------------------------------- */

static void maxbatch_help(FILE *f)
{
    search_help(f,
                "Usage: vramplan maxbatch MODEL --budget SIZE [OPTIONS]\n"
                "       vramplan maxbatch MODEL --gpu NAME [--budget "
                "FRACTION] [OPTIONS]\n"
                "       vramplan maxbatch MODEL --gpu-family NAME ...   "
                "(MIG slices)\n",
                "\n"
                "The largest micro-batch whose simulated training steps fit "
                "in the\n"
                "budget, applied as torch.cuda.set_per_process_memory_fraction "
                "applies\n"
                "it: no new segment may take reserved bytes past the budget "
                "(cached\n"
                "segments are freed and the allocation retried first). The "
                "search\n"
                "doubles from 1, then bisects. --batch is ignored; --steps "
                "defaults to " VP_TEXT(VP_STEADY_STEPS) ".\n");
}

static int maxbatch_print(const cli_setup_args *a, const vp_model *model,
                          const vp_maxbatch_result *mb)
{
    char b1[32], b2[32], b3[32];

    if (a->format == CLI_FMT_JSON) {
        json_t *o = json_object();
        cli_jset(o, "model", cli_jstr(a->model_path, 512));
        cli_jset(o, "budget", cli_ju64(a->setup.alloc.limit));
        cli_jset(o, "steps", cli_ju64(a->setup.steps));
        if (a->setup.generate.prompt)
            cli_jset(o, "kv_cache_bytes",
                     cli_ju64(mb->at_max.gen.kv_cache_bytes));
        cli_jset(o, "max_batch", cli_ju64(mb->max_batch));
        cli_jset(o, "trials", cli_ju64(mb->trials));
        cli_jset(o, "peak_alloc", cli_ju64(mb->at_max.peak_alloc));
        cli_jset(o, "peak_reserved", cli_ju64(mb->at_max.peak_reserved));
        cli_jset(o, "device_used", cli_ju64(mb->at_max.device_used));
        int rc = cli_jprint(stdout, o, false);
        return rc != CLI_OK ? rc : mb->max_batch ? CLI_OK : CLI_NOFIT;
    }
    printf("model        %s\n", a->model_path);
    printf("budget       %s (%" PRIu64 " bytes) for the caching allocator\n",
           vp_size_format(a->setup.alloc.limit, b1, sizeof b1),
           a->setup.alloc.limit);
    const vp_generate *g = &a->setup.generate;
    if (g->prompt)
        printf("setup        generate(): %" PRIu64 " prompt tokens + %" PRIu64
               " new, %s, %s cache, %s, %" PRIu32 " calls\n", g->prompt,
               g->new_tokens, vp_precision_name(a->setup.precision),
               vp_cache_impl_name(g->cache), g->sample ? "sampling" : "greedy",
               a->setup.steps);
    else
        printf("setup        seq %" PRIu64 ", %s, %s, checkpoint %s, %" PRIu32
               " steps\n",
               a->setup.seq ? a->setup.seq : vp_model_default_seq(model),
               vp_precision_name(a->setup.precision),
               vp_optimizer_name(a->setup.optimizer),
               a->checkpoint ? a->checkpoint : "none", a->setup.steps);
    cli_finetune_line(stdout, &a->setup);
    if (mb->max_batch == 0) {
        printf("max batch    none: batch 1 does not fit (%u simulations)\n",
               mb->trials);
        return CLI_NOFIT;
    }
    printf("max batch    %" PRIu64 " (%u simulations)\n", mb->max_batch,
           mb->trials);
    printf("at that batch peak allocated %s, peak reserved %s, device used "
           "%s\n", vp_size_format(mb->at_max.peak_alloc, b1, sizeof b1),
           vp_size_format(mb->at_max.peak_reserved, b2, sizeof b2),
           vp_size_format(mb->at_max.device_used, b3, sizeof b3));
    return CLI_OK;
}

int cli_maxbatch(int argc, char **argv)
{
    cli_setup_args a;
    vp_maxbatch_result mb;
    vp_model *model = NULL;
    vp_error err;
    bool have_hw;
    vp_hw hw;
    int rc;

    if (arg_given(argc, argv, "--gpu-family"))
        return cli_mig_maxbatch(argc, argv);
    rc = search_setup(argc, argv, maxbatch_help,
                      "maxbatch takes a fixed --checkpoint (none, all or "
                      "names), not auto", &a, &hw, &have_hw);
    if (rc < 0 && a.host_probe_us > 0.0)
        rc = cli_usage_error("maxbatch times no step: --host-probe-us is "
                             "plan's and techniques'");

    vp_error_clear(&err);
    if (rc < 0 && (model = vp_model_load(a.model_path, &err)) == NULL)
        rc = cli_report(&err, NULL);
    if (rc < 0) {
        vp_status st = vp_maxbatch(model, &a.setup, a.checkpoint, 0, &mb,
                                   &err);
        if (st == VP_EARG && err.msg[0])
            rc = cli_usage_error("%s", err.msg);
        else if (st != VP_OK)
            rc = cli_report(&err, NULL);
        else
            rc = maxbatch_print(&a, model, &mb);
    }
    vp_model_free(model);
    cli_args_free(&a.args);
    return rc;
}

/* ---- plan on one GPU ------------------------------------------------------ */

static void plan_help(FILE *f)
{
    search_help(f,
                "Usage: vramplan plan MODEL --gpu NAME [--budget "
                "SIZE|FRACTION] [OPTIONS]\n"
                "       vramplan plan MODEL --gpus N --gpu NAME ...   "
                "(clusters)\n"
                "       vramplan plan MODEL --gpu-family NAME ...   "
                "(MIG slices)\n",
                "\n"
                "Search the training setup of MODEL on one GPU: precision, "
                "optimizer\n"
                "variant (AdamW foreach, fused, 8-bit), activation "
                "checkpointing (none,\n"
                "every layer, or the least recomputation that fits) and the "
                "split of\n"
                "--global-batch into micro-batches with gradient "
                "accumulation. Every\n"
                "candidate is simulated under the budget and timed with the "
                "GPU\n"
                "profile's rates; the fastest that fits wins, and the others "
                "are listed\n"
                "with the reason each lost. --precision and --optimizer "
                "restrict the\n"
                "search to one value.\n");
}

static json_t *plan_candidate_json(const vp_plan_candidate *k)
{
    json_t *o = json_object();

    cli_jset(o, "precision", json_string(vp_precision_name(k->precision)));
    cli_jset(o, "optimizer", json_string(vp_optimizer_name(k->optimizer)));
    cli_jset(o, "offload_optimizer", json_boolean(k->offload));
    cli_jset(o, "checkpoint", json_string(vp_ckpt_mode_name(k->ckpt)));
    cli_jset(o, "checkpointed", cli_ju64(k->n_checkpointed));
    cli_jset(o, "micro_batch", cli_ju64(k->micro_batch));
    cli_jset(o, "accum", cli_ju64(k->accum));
    cli_jset(o, "fits", json_boolean(k->fits));
    cli_jset(o, "peak_alloc", cli_ju64(k->peak_alloc));
    cli_jset(o, "peak_reserved", cli_ju64(k->peak_reserved));
    cli_jset(o, "step_seconds", cli_jreal(k->time.total, "%.6f"));
    cli_jset(o, "samples_per_s", cli_jreal(k->samples_per_s, "%.3f"));
    cli_jset(o, "mfu", cli_jreal(k->time.mfu, "%.4f"));
    cli_jset(o, "reason", cli_jstr(k->reason, sizeof k->reason));
    return o;
}

static int plan_json(const cli_setup_args *a, const vp_plan_request *req,
                     const vp_plan_result *res)
{
    json_t *o = json_object(), *cands = json_array();

    cli_jset(o, "model", cli_jstr(a->model_path, 512));
    cli_jset(o, "gpu", cli_jstr(req->hw.name, sizeof req->hw.name));
    cli_jset(o, "budget", cli_ju64(req->base.alloc.limit));
    cli_jset(o, "global_batch", cli_ju64(req->global_batch));
    cli_jset(o, "simulations", cli_ju64(res->simulations));
    for (size_t i = 0; i < res->n; i++)
        cli_jpush(cands, plan_candidate_json(&res->cand[i]));
    cli_jset(o, "candidates", cands);
    return cli_jprint(stdout, o, false);
}

static void plan_row(size_t i, const vp_plan_candidate *k)
{
    char mb[48], ck[48], on[24], b[32];

    snprintf(mb, sizeof mb, "%" PRIu64 " x %" PRIu32, k->micro_batch,
             k->accum);
    if (k->ckpt == VP_CKPT_AUTO && k->n_segments)
        snprintf(ck, sizeof ck, "%zu/%zu", k->n_checkpointed, k->n_segments);
    else
        snprintf(ck, sizeof ck, "%s", vp_ckpt_mode_name(k->ckpt));
    snprintf(on, sizeof on, "%s%s", vp_optimizer_name(k->optimizer),
             k->offload ? "+off" : "");
    if (!k->fits)
        printf("%4s  %-9s %-16s %-5s %12s %14s %11s %10s %6s\n", "-",
               vp_precision_name(k->precision), on, ck,
               k->micro_batch ? mb : "-", "-", "-", "-", "-");
    else
        printf("%4zu  %-9s %-16s %-5s %12s %14s %9.1f ms %10.1f %5.1f%%\n",
               i + 1, vp_precision_name(k->precision), on, ck, mb,
               vp_size_format(k->peak_reserved, b, sizeof b),
               k->time.total * 1e3, k->samples_per_s, 100.0 * k->time.mfu);
}

static void plan_table(const cli_setup_args *a, const vp_model *model,
                       const vp_plan_request *req, const vp_plan_result *res)
{
    bool any = res->n && res->cand[0].fits;
    char b[32];

    printf("model        %s (%s)\n", vp_model_name(model), a->model_path);
    printf("gpu          %s, budget %s for the caching allocator\n",
           req->hw.name, vp_size_format(req->base.alloc.limit, b, sizeof b));
    printf("target       global batch %" PRIu64 ", seq %" PRIu64 "\n",
           req->global_batch,
           a->setup.seq ? a->setup.seq : vp_model_default_seq(model));
    cli_finetune_line(stdout, &req->base);
    printf("searched     %zu setups, %" PRIu32 " simulations\n\n", res->n,
           res->simulations);
    printf("%4s  %-9s %-16s %-5s %12s %14s %11s %10s %6s\n", "rank",
           "precision", "optimizer", "ckpt", "micro x acc", "peak reserved",
           "step time", "samples/s", "MFU");
    for (size_t i = 0; i < res->n; i++)
        plan_row(i, &res->cand[i]);
    if (any) {
        const vp_plan_candidate *k = &res->cand[0];
        printf("\nbest: %s, %s%s, checkpoint %s, micro-batch %" PRIu64
               " with %" PRIu32 " accumulation steps\n",
               vp_precision_name(k->precision),
               vp_optimizer_name(k->optimizer),
               k->offload ? " (state offloaded to the host)" : "",
               vp_ckpt_mode_name(k->ckpt), k->micro_batch, k->accum);
        printf("\nwhy the others lost:\n");
    } else {
        printf("\nnothing fits in the budget:\n");
    }
    for (size_t i = any ? 1 : 0; i < res->n; i++) {
        const vp_plan_candidate *k = &res->cand[i];
        char on[32];
        snprintf(on, sizeof on, "%s%s", vp_optimizer_name(k->optimizer),
                 k->offload ? "+off" : "");
        printf("  %-9s %-18s %-5s %s\n", vp_precision_name(k->precision),
               on, vp_ckpt_mode_name(k->ckpt), k->reason);
    }
}

static int plan_run(const cli_setup_args *a, vp_plan_request *req)
{
    vp_plan_result *res = malloc(sizeof *res);
    vp_error err;
    int rc;

    vp_error_clear(&err);
    vp_model *model = vp_model_load(a->model_path, &err);
    if (model == NULL) {
        free(res);
        return cli_report(&err, NULL);
    }
    if (res == NULL) {
        vp_model_free(model);
        return cli_fail("out of memory");
    }
    if (vp_plan_single(model, req, res, &err) != VP_OK) {
        rc = cli_report(&err, NULL);
    } else if (a->format == CLI_FMT_JSON) {
        rc = plan_json(a, req, res);
    } else {
        plan_table(a, model, req, res);
        rc = CLI_OK;
    }
    if (rc == CLI_OK && !(res->n && res->cand[0].fits))
        rc = CLI_NOFIT;
    free(res);
    vp_model_free(model);
    return rc;
}

int cli_plan(int argc, char **argv)
{
    vp_plan_request req;
    cli_setup_args a;
    bool have_hw;
    int rc;

    if (arg_given(argc, argv, "--gpus"))
        return cli_plan_cluster(argc, argv);
    if (arg_given(argc, argv, "--gpu-family"))
        return cli_mig_plan(argc, argv);
    memset(&req, 0, sizeof req);
    rc = cli_setup_parse(argc, argv, CLI_CMD_SEARCH, plan_help, &a);
    if (rc < 0 && a.setup.generate.prompt)
        rc = cli_usage_error("plan chooses a training setup; --generate "
                             "works with estimate and maxbatch");
    if (rc < 0)
        rc = cli_setup_gpu(&a, &req.hw, &have_hw);
    if (rc < 0 && !have_hw)
        rc = cli_usage_error("plan needs --gpu NAME (its rates time the "
                             "candidates)");
    if (rc < 0) {
        if (a.precision_given)
            req.precisions[a.setup.precision] = true;
        if (a.optimizer_given)
            req.optimizers[a.setup.optimizer] = true;
        req.base = a.setup;
        req.global_batch = a.global_batch ? a.global_batch : 32;
        rc = plan_run(&a, &req);
    }
    cli_args_free(&a.args);
    return rc;
}

/* ---- techniques ------------------------------------------------------------ */

static void techniques_help(FILE *f)
{
    search_help(f,
                "Usage: vramplan techniques MODEL --budget SIZE [--gpu NAME] "
                "[OPTIONS]\n",
                "\n"
                "What each memory technique buys on MODEL with your setup: "
                "the peak\n"
                "memory, whether your batch fits the budget, the largest "
                "batch, and\n"
                "(with --gpu) the step time, for each technique alone and a "
                "few\n"
                "combinations. Every figure comes from the simulator.\n");
}

static int techniques_json(const cli_setup_args *a,
                           const vp_technique_result *out, size_t n)
{
    json_t *o = json_object(), *list = json_array();

    cli_jset(o, "model", cli_jstr(a->model_path, 512));
    cli_jset(o, "budget", cli_ju64(a->setup.alloc.limit));
    cli_jset(o, "batch", cli_ju64(a->setup.batch));
    cli_jset(o, "steps", cli_ju64(a->setup.steps));
    for (size_t i = 0; i < n; i++) {
        const vp_technique_result *r = &out[i];
        json_t *t = json_object();
        cli_jset(t, "name", cli_jstr(r->name, sizeof r->name));
        cli_jset(t, "applicable", json_boolean(r->applicable));
        cli_jset(t, "fits", json_boolean(r->fits));
        cli_jset(t, "peak_alloc", cli_ju64(r->peak_alloc));
        cli_jset(t, "peak_reserved", cli_ju64(r->peak_reserved));
        cli_jset(t, "max_batch", cli_ju64(r->max_batch));
        cli_jset(t, "step_seconds", cli_jreal(r->step_s, "%.6f"));
        cli_jset(t, "note", cli_jstr(r->note, sizeof r->note));
        cli_jpush(list, t);
    }
    cli_jset(o, "techniques", list);
    return cli_jprint(stdout, o, false);
}

static void techniques_table(const cli_setup_args *a, const vp_model *model,
                             const vp_hw *hw, const vp_technique_result *out,
                             size_t n)
{
    uint64_t base = n ? out[0].peak_alloc : 0;
    char b1[32], b2[32], b3[32];

    printf("model        %s (%s)\n", vp_model_name(model), a->model_path);
    printf("setup        batch %" PRIu64 ", seq %" PRIu64 ", %s, %s, %" PRIu32
           " steps, budget %s%s%s\n",
           a->setup.batch,
           a->setup.seq ? a->setup.seq : vp_model_default_seq(model),
           vp_precision_name(a->setup.precision),
           vp_optimizer_name(a->setup.optimizer), a->setup.steps,
           vp_size_format(a->setup.alloc.limit, b1, sizeof b1),
           hw ? ", gpu " : "", hw ? hw->name : "");
    cli_finetune_line(stdout, &a->setup);
    putchar('\n');
    printf("%-26s %12s %12s %5s %9s %11s  %s\n", "technique", "peak alloc",
           "reserved", "fits", "max batch", "step time", "notes");
    for (size_t i = 0; i < n; i++) {
        const vp_technique_result *r = &out[i];
        char t[32] = "-", d[48] = "";
        if (!r->applicable) {
            printf("%-26s %12s %12s %5s %9s %11s  %s\n", r->name, "-", "-",
                   "-", "-", "-", r->note);
            continue;
        }
        if (r->step_s > 0)
            snprintf(t, sizeof t, "%.1f ms", r->step_s * 1e3);
        if (i > 0 && base)
            snprintf(d, sizeof d, "%+.1f%% memory",
                     100.0 * ((double)r->peak_alloc / (double)base - 1.0));
        printf("%-26s %12s %12s %5s %9" PRIu64 " %11s  %s%s%s\n", r->name,
               vp_size_format(r->peak_alloc, b2, sizeof b2),
               vp_size_format(r->peak_reserved, b3, sizeof b3),
               r->fits ? "yes" : "no", r->max_batch, t, d,
               d[0] && r->note[0] ? "; " : "", r->note);
    }
}

int cli_techniques(int argc, char **argv)
{
    vp_technique_result out[VP_TECHNIQUES_MAX];
    vp_model *model = NULL;
    cli_setup_args a;
    size_t n = 0;
    vp_error err;
    bool have_hw;
    vp_hw hw;
    int rc = search_setup(argc, argv, techniques_help,
                          "give techniques a fixed --checkpoint; 'checkpoint "
                          "optimal' is one of its rows", &a, &hw, &have_hw);

    if (rc < 0 && a.setup.generate.prompt)
        rc = cli_usage_error("techniques compares training techniques; "
                             "--generate works with estimate and maxbatch");
    vp_error_clear(&err);
    if (rc < 0 && (model = vp_model_load(a.model_path, &err)) == NULL)
        rc = cli_report(&err, NULL);
    if (rc < 0 && vp_techniques(model, &a.setup, a.checkpoint,
                                have_hw ? &hw : NULL, out, VP_TECHNIQUES_MAX,
                                &n, &err) != VP_OK)
        rc = cli_report(&err, NULL);
    if (rc < 0 && a.format == CLI_FMT_JSON) {
        rc = techniques_json(&a, out, n);
    } else if (rc < 0) {
        techniques_table(&a, model, have_hw ? &hw : NULL, out, n);
        rc = CLI_OK;
    }
    if (rc == CLI_OK) { /* exit 1 when no row fits, as the help says */
        bool any = false;
        for (size_t i = 0; i < n; i++)
            any = any || (out[i].applicable && out[i].fits);
        rc = any ? CLI_OK : CLI_NOFIT;
    }
    vp_model_free(model);
    cli_args_free(&a.args);
    return rc;
}
