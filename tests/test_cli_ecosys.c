/* Tests of the command line's names, pictures and rough edges: model and
 * GPU names through the search path, --gpu-dir, estimate --gpu,
 * --snapshot and --html, techniques when the setup does not fit, the
 * cluster safety margin, compare --days (and vp_cluster_gpus_for_time),
 * and the progress line on a terminal. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vramplan/vramplan.h"

#include "cli_golden.h"

static uint64_t json_u64(const char *json, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(json, k);
    cr_assert_not_null(p, "no %s in %s", key, json);
    return strtoull(p + strlen(k), NULL, 10);
}

/* ---- names ------------------------------------------------------------- */

Test(names, model_name_resolves_through_the_search_path)
{
    cli_run r;
    cli_exec((const char *const[]){"estimate", "mlp10", "--format", "json",
                                   NULL},
             &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "/models/mlp10.yaml\""), "%s", r.out);
    cli_run_free(&r);
}

Test(names, unknown_model_name_suggests_and_names_the_directories)
{
    cli_run r;
    cli_exec((const char *const[]){"estimate", "gpt2-smal", NULL}, &r);
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "unknown model 'gpt2-smal' (did you mean "
                            "'gpt2-small'?): no gpt2-smal.yaml in "),
              "%s", r.err);
    cr_assert(strstr(r.err, "/models"), "%s", r.err);
    cli_run_free(&r);
}

Test(names, gpu_dir_is_searched_first)
{
    char dir[] = "/tmp/vp-gpudir-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[128], cmd[256];
    snprintf(path, sizeof path, "%s/mygpu.yaml", dir);
    snprintf(cmd, sizeof cmd, "cp gpus/h100-80g.yaml %s", path);
    cr_assert_eq(system(cmd), 0);
    cli_run r;
    cli_exec((const char *const[]){"estimate", "models/mlp10.yaml", "--gpu",
                                   "mygpu", "--gpu-dir", dir, NULL},
             &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cli_run_free(&r);
    cli_exec((const char *const[]){"estimate", "models/mlp10.yaml", "--gpu",
                                   "mygpu", NULL},
             &r);
    cr_assert_eq(r.status, 2, "only in --gpu-dir");
    cr_assert(strstr(r.err, "unknown GPU 'mygpu'"), "%s", r.err);
    cli_run_free(&r);
    unlink(path);
    rmdir(dir);
}

Test(names, env_dir_serves_models)
{
    setenv("VRAMPLAN_MODEL_DIR", "tests/data/good:/nonexistent", 1);
    cli_run r;
    cli_exec((const char *const[]){"estimate", "mlp-sim", "--format", "csv",
                                   NULL},
             &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cli_run_free(&r);
    unsetenv("VRAMPLAN_MODEL_DIR");
}

/* ---- estimate --gpu, --snapshot, --html -------------------------------- */

Test(estimate_gpu, budget_is_the_memory_less_the_context)
{
    GOLDEN("estimate_mlp10_gpu_json", 0, "estimate", "models/mlp10.yaml",
           "--gpu", "h100-80g", "--format", "json");
}

Test(estimate_gpu, does_not_fit_the_gpu)
{
    GOLDEN("estimate_gpu_does_not_fit", 1, "estimate", "models/mlp10.yaml",
           "--gpu", "rtx4090", "--batch", "200000");
}

Test(estimate_gpu, fraction_needs_a_gpu)
{
    GOLDEN("estimate_fraction_no_gpu", 2, "estimate", "models/mlp10.yaml",
           "--budget", "0.5");
}

Test(pictures, snapshot_and_html_are_written)
{
    const char *snap = "/tmp/vp-cli-test.pickle", *html = "/tmp/vp-cli.html";
    unlink(snap);
    unlink(html);
    cli_run r;
    cli_exec((const char *const[]){"estimate", "models/mlp10.yaml",
                                   "--snapshot", snap, "--html", html, NULL},
             &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    struct stat st;
    cr_assert_eq(stat(snap, &st), 0);
    cr_assert_gt(st.st_size, 1000);
    cr_assert_eq(stat(html, &st), 0);
    cr_assert_gt(st.st_size, 1000);
    cli_run_free(&r);
    unlink(snap);
    unlink(html);
}

Test(pictures, written_when_the_run_does_not_fit)
{
    const char *html = "/tmp/vp-cli-oom.html";
    unlink(html);
    cli_run r;
    cli_exec((const char *const[]){"estimate", "models/mlp10.yaml", "--budget",
                                   "1GiB", "--html", html, NULL},
             &r);
    cr_assert_eq(r.status, 1);
    struct stat st;
    cr_assert_eq(stat(html, &st), 0, "the page of the failed run");
    cli_run_free(&r);
    unlink(html);
}

Test(pictures, unwritable_file_is_an_error)
{
    GOLDEN("estimate_snapshot_unwritable", 2, "estimate", "models/mlp10.yaml",
           "--snapshot", "/nonexistent/dir/s.pickle");
}

/* ---- techniques ---------------------------------------------------------- */

Test(techniques, table_when_the_setup_does_not_fit)
{
    GOLDEN("techniques_baseline_does_not_fit", 0, "techniques",
           "models/mlp10.yaml", "--batch", "200000", "--gpu", "rtx4090");
}

/* ---- cluster: safety margin and --days ----------------------------------- */

static uint64_t plan_memory(const char *margin)
{
    cli_run r;
    const char *args[] = {"plan",     "models/gpt2-small.yaml", "--gpus", "8",
                          "--gpu",    "h100-80g", "--format", "json",
                          margin ? "--margin" : NULL, margin, NULL};
    cli_exec(args, &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    uint64_t m = json_u64(r.out, "gpu_memory");
    cli_run_free(&r);
    return m;
}

Test(cluster_margin, default_keeps_five_percent_free)
{
    uint64_t full = plan_memory("0");
    uint64_t kept = plan_memory(NULL);
    cr_assert_eq(kept, full - (uint64_t)((double)full * 0.05));
    cli_run r;
    cli_exec((const char *const[]){"plan", "models/gpt2-small.yaml", "--gpus",
                                   "8", "--gpu", "h100-80g", NULL},
             &r);
    cr_assert(strstr(r.out, "5.0% kept free as a safety margin (--margin "
                            "0.05)"),
              "%s", r.out);
    cli_run_free(&r);
}

Test(cluster_margin, bad_margin)
{
    GOLDEN("plan_cluster_bad_margin", 2, "plan", "models/gpt2-small.yaml",
           "--gpus", "8", "--gpu", "h100-80g", "--margin", "1");
}

Test(compare_days, csv_marks_the_fewest)
{
    cli_run r;
    cli_exec((const char *const[]){"compare", "models/gpt2-small.yaml",
                                   "--gpu", "h100-80g", "--tokens", "100B",
                                   "--days", "2", "--format", "csv", NULL},
             &r);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, ",plan,fewest_for_days\n"), "%s", r.out);
    cr_assert(strstr(r.out, ",true\n"), "%s", r.out);
    cli_run_free(&r);
}

/* The size found finishes in time and the next smaller size tried does
 * not. */
Test(compare_days, fewest_gpus_is_the_smallest_that_finishes)
{
    vp_error err;
    vp_model *m = vp_model_load("models/llama-3-8b.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_cluster_model *cm = vp_cluster_model_new(m, 0, &err);
    cr_assert_not_null(cm, "%s", err.msg);
    vp_gpu_profile *p = vp_gpu_load("h100-80g", &err);
    cr_assert_not_null(p, "%s", err.msg);
    vp_hw hw;
    vp_gpu_hw(p, VP_GPU_BF16, &hw);
    vp_hw_fill_defaults(&hw);
    vp_cluster c;
    vp_cluster_init(&c, &hw, 1, 8);
    vp_search_opts o;
    vp_search_opts_init(&o);
    o.top = 0;
    vp_cluster_plan *pl = malloc(sizeof *pl);
    cr_assert_not_null(pl);
    double tokens = 1e11, secs = 3 * 86400.0;
    uint32_t n = 0;
    cr_assert_eq(vp_cluster_gpus_for_time(cm, &c, &o, tokens, secs, 4096, &n,
                                          pl, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_gt(n, 8, "more than a node for 100B tokens in 3 days");
    cr_assert_eq(n % 8, 0, "whole nodes");
    cr_assert(pl->found);
    cr_assert_leq(tokens / pl->best.time.tokens_per_s, secs);
    vp_cluster c2 = c;
    c2.gpus = n - 8;
    cr_assert_eq(vp_cluster_search(cm, &c2, &o, pl, &err), VP_OK);
    cr_assert(!pl->found || tokens / pl->best.time.tokens_per_s > secs,
              "one node fewer is too slow");
    cr_assert_eq(vp_cluster_gpus_for_time(cm, &c, &o, tokens, 0, 4096, &n, pl,
                                          &err),
                 VP_EARG);
    free(pl);
    vp_gpu_free(p);
    vp_cluster_model_free(cm);
    vp_model_free(m);
}

/* ---- progress ------------------------------------------------------------- */

Test(progress, line_on_a_terminal_only, .timeout = 60)
{
    /* script(1) gives the command a terminal; a line every 2 ms */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "VRAMPLAN_PROGRESS_MS=2 script -qec '%s techniques "
             "models/mlp10.yaml --budget 4GiB >/dev/null' /dev/null",
             cli_bin());
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char buf[8192], rest[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    while (fread(rest, 1, sizeof rest, f) > 0)
        ; /* read to the end: a closed pipe would stop script with SIGPIPE */
    int st = pclose(f);
    cr_assert_eq(st, 0, "script exited with %d: %s", st, buf);
    cr_assert(strstr(buf, "vramplan techniques: ") &&
                  strstr(buf, " simulations, "),
              "no progress line: %s", buf);
    cr_assert(strstr(buf, "\r\033[K"), "the line is erased");
    /* not a terminal: nothing */
    cli_run r;
    setenv("VRAMPLAN_PROGRESS_MS", "2", 1);
    cli_exec((const char *const[]){"techniques", "models/mlp10.yaml",
                                   "--budget", "4GiB", NULL},
             &r);
    cr_assert_str_eq(r.err, "");
    cli_run_free(&r);
}

/* ---- fine-tuning: LoRA, QLoRA, freezing, loading -------------------------- */

Test(finetune, lora_estimate_table)
{
    GOLDEN("finetune_lora_estimate", 0, "estimate", "models/llama-1b.yaml",
           "--batch", "2", "--seq", "512", "--precision", "amp-bf16",
           "--base-dtype", "bf16", "--lora",
           "r=16,alpha=32,targets=q_proj,v_proj,dropout=0.05", "-c", "all");
}
Test(finetune, qlora_estimate_json)
{
    GOLDEN("finetune_qlora_estimate_json", 0, "estimate",
           "models/llama-1b.yaml", "--batch", "2", "--seq", "512",
           "--precision", "amp-bf16", "--lora",
           "r=16,alpha=32,targets=all-linear", "--quant", "nf4",
           "--double-quant", "-o", "paged-adamw-8bit", "-c", "all",
           "--format", "json");
}
/* the case: from_pretrained(torch_dtype=bf16) never holds the
 * fp32 model, so a 7B model fits a 24 GB card for inference */
Test(finetune, bf16_inference_of_7b_fits_24gb)
{
    GOLDEN("finetune_mistral_inference_maxbatch", 0, "maxbatch",
           "models/mistral-7b.yaml", "--gpu", "rtx4090", "--precision",
           "bf16", "--inference");
}
/* QLoRA of a 7B model on a 24 GB card: the techniques table */
Test(finetune, techniques_of_7b_on_24gb)
{
    GOLDEN("finetune_techniques_llama7b_rtx4090", 0, "techniques",
           "models/llama-2-7b.yaml", "--gpu", "rtx4090", "--batch", "1",
           "--seq", "2048", "--precision", "bf16");
}
Test(finetune, maxbatch_names_the_setup)
{
    GOLDEN("finetune_qlora_maxbatch", 0, "maxbatch", "models/llama-1b.yaml",
           "--gpu", "rtx4090", "--seq", "1024", "--precision", "amp-bf16",
           "--lora", "r=8,alpha=16,targets=q_proj,v_proj", "--quant", "nf4",
           "-c", "all");
}
Test(finetune, unknown_lora_key)
{
    GOLDEN("finetune_err_lora_key", 2, "estimate", "models/llama-1b.yaml",
           "--lora", "r=8,rank=4,targets=q_proj");
}
Test(finetune, lora_target_matches_nothing)
{
    GOLDEN("finetune_err_lora_target", 2, "estimate", "models/llama-1b.yaml",
           "--lora", "r=8,targets=nope");
}
Test(finetune, freeze_pattern_matches_nothing)
{
    GOLDEN("finetune_err_freeze", 2, "estimate", "models/llama-1b.yaml",
           "--freeze", "layers.99");
}
Test(finetune, base_dtype_against_precision)
{
    GOLDEN("finetune_err_base_dtype", 2, "estimate", "models/llama-1b.yaml",
           "--lora", "r=8,targets=q_proj", "--base-dtype", "bf16");
}
Test(finetune, quantized_base_is_not_cast)
{
    GOLDEN("finetune_err_quant_cast", 2, "estimate", "models/llama-1b.yaml",
           "--lora", "r=8,targets=q_proj", "--quant", "nf4", "--load",
           "fp32-then-cast");
}
