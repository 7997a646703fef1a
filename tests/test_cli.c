/* Tests of the vramplan command line against golden files.
 *
 * Each case runs the binary (VRAMPLAN_BIN, default ./vramplan, from the
 * repository root) and compares its stdout with tests/golden/NAME.out, its
 * stderr with tests/golden/NAME.err and its exit status with the expected
 * one. Run with VRAMPLAN_UPDATE_GOLDEN=1 to rewrite the golden files from
 * the current output (then review the diff). */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>
#include <jansson.h>
#include "vramplan/vramplan.h"

#include "cli_golden.h"

/* --- help and usage errors ----------------------------------------- */

Test(cli, help) { GOLDEN("help", 0, "--help"); }
Test(cli, help_short) { GOLDEN("help", 0, "-h"); }
Test(cli, estimate_help) { GOLDEN("estimate_help", 0, "estimate", "--help"); }

/* A data-parallel run: the roles table, then the most loaded rank's
 * report (tests/data/dist/tiny-gpt.yaml; the rules in test_dist.c). */
Test(cli, estimate_dist_zero1_roles)
{
    GOLDEN("estimate_dist_zero1_roles", 0, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--batch", "2", "--strategy",
           "ddp-zero1", "--world", "2");
}
Test(cli, estimate_dist_fsdp2_json)
{
    GOLDEN("estimate_dist_fsdp2_json", 0, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--batch", "2", "--strategy",
           "fsdp2", "--world", "4", "--param-dtype", "bf16", "--format",
           "json");
}
Test(cli, estimate_dist_world_needs_strategy)
{
    GOLDEN("estimate_dist_world_needs_strategy", 2, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--world", "2");
}
Test(cli, estimate_dist_bad_reshard)
{
    GOLDEN("estimate_dist_bad_reshard", 2, "estimate",
           "tests/data/dist/tiny-gpt.yaml", "--strategy", "fsdp2",
           "--world", "4", "--reshard-after-forward", "1");
}

Test(cli, version)
{
    cli_run r;

    cli_exec((const char *const[]){"--version", NULL}, &r);
    cr_assert_str_eq(r.out, "vramplan " VRAMPLAN_VERSION "\n");
    cr_assert_str_eq(r.err, "");
    cr_assert_eq(r.status, 0);
    cli_run_free(&r);
}

Test(cli, no_command)
{
    check_golden("no_command", 2, (const char *const[]){NULL});
}
Test(cli, unknown_command) { GOLDEN("unknown_command", 2, "frobnicate"); }
Test(cli, unknown_option)
{
    GOLDEN("unknown_option", 2, "estimate", "models/mlp10.yaml",
           "--frobnicate");
}
Test(cli, missing_value)
{
    GOLDEN("missing_value", 2, "estimate", "models/mlp10.yaml", "--batch");
}
Test(cli, missing_model_argument) { GOLDEN("missing_model_argument", 2, "estimate"); }
Test(cli, batch_zero)
{
    GOLDEN("batch_zero", 2, "estimate", "models/mlp10.yaml", "--batch", "0");
}
Test(cli, batch_negative)
{
    GOLDEN("batch_negative", 2, "estimate", "models/mlp10.yaml", "--batch",
           "-1");
}
Test(cli, batch_not_a_number)
{
    GOLDEN("batch_not_a_number", 2, "estimate", "models/mlp10.yaml",
           "--batch", "abc");
}
Test(cli, batch_exponent)
{
    GOLDEN("batch_exponent", 2, "estimate", "models/mlp10.yaml", "--batch",
           "1e3");
}
Test(cli, unknown_option_suggests_the_closest)
{
    GOLDEN("unknown_option_suggestion", 2, "estimate", "models/mlp10.yaml",
           "--bacth", "8");
}
Test(cli, unknown_command_suggests_the_closest)
{
    GOLDEN("unknown_command_suggestion", 2, "estimat", "models/mlp10.yaml");
}
Test(cli, unknown_precision_suggests_the_closest)
{
    GOLDEN("unknown_precision", 2, "estimate", "models/mlp10.yaml",
           "--precision", "amp-bf61");
}
Test(cli, flag_with_a_value)
{
    GOLDEN("flag_with_value", 2, "estimate", "models/mlp10.yaml",
           "--inference=yes");
}
Test(cli, budget_bad_unit)
{
    GOLDEN("budget_bad_unit", 2, "estimate", "models/mlp10.yaml", "--budget",
           "24XB");
}

/* --- model errors --------------------------------------------------- */

Test(cli, missing_model)
{
    GOLDEN("missing_model", 2, "estimate",
           "tests/data/bad/cli-does-not-exist.yaml");
}
Test(cli, bad_model_syntax)
{
    GOLDEN("bad_model_syntax", 3, "estimate",
           "tests/data/bad/cli-syntax.yaml");
}
Test(cli, bad_model_unknown_key)
{
    GOLDEN("bad_model_unknown_key", 3, "estimate",
           "tests/data/bad/cli-unknown-key.yaml");
}
Test(cli, bad_model_range)
{
    GOLDEN("bad_model_range", 3, "estimate", "tests/data/bad/cli-range.yaml");
}
/* A GPU profile's error points at the spot and exits 3, as a model's
 * does (it exited 2 with no caret). */
Test(cli, bad_gpu_profile_unknown_key)
{
    GOLDEN("bad_gpu_profile_unknown_key", 3, "maxbatch", "models/mlp10.yaml",
           "--gpu", "tests/data/gpu/bad-unknown-key.yaml");
}
/* The message names the directories searched (resource.h), absolute
 * paths that depend on the checkout: no golden file. */
Test(cli, gpu_profile_not_found)
{
    cli_run r;

    cli_exec((const char *const[]){"maxbatch", "models/mlp10.yaml", "--gpu",
                                   "no-such-gpu", NULL},
             &r);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert_str_eq(r.out, "");
    const char *want = "vramplan: error: --gpu no-such-gpu: unknown GPU "
                       "'no-such-gpu': no no-such-gpu.yaml in ";
    cr_assert(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
    cr_assert(strstr(r.err, "/gpus") != NULL, "%s", r.err);
    cr_assert_eq(strchr(r.err, '\n'), r.err + strlen(r.err) - 1,
                 "one line: %s", r.err);
    cli_run_free(&r);
}
Test(cli, checkpoint_no_match)
{
    GOLDEN("checkpoint_no_match", 2, "estimate", "models/mlp10.yaml",
           "--checkpoint", "nosuch.*");
}

/* --- estimates ------------------------------------------------------ */

Test(cli, estimate_gpt2_small_table)
{
    GOLDEN("estimate_gpt2_small_table", 0, "estimate",
           "models/gpt2-small.yaml", "--batch", "8", "--seq", "1024",
           "--precision", "amp-bf16");
}
Test(cli, estimate_gpt2_small_json)
{
    GOLDEN("estimate_gpt2_small_json", 0, "estimate",
           "models/gpt2-small.yaml", "--batch", "8", "--seq", "1024",
           "--precision", "amp-bf16", "--format", "json");
}
Test(cli, estimate_mlp10_csv)
{
    GOLDEN("estimate_mlp10_csv", 0, "estimate", "models/mlp10.yaml",
           "--format", "csv");
}
Test(cli, budget_does_not_fit)
{
    GOLDEN("budget_does_not_fit", 1, "estimate", "models/mlp10.yaml",
           "--budget", "1MiB");
}

/* The timeline has its header and one row per simulated event. */
Test(cli, timeline_has_one_row_per_event)
{
    static const char header[] =
        "seq,step,phase,op,category,action,bytes,allocated,reserved\n";
    char path[] = "/tmp/vramplan-timeline-XXXXXX";
    const char *events_key;
    unsigned long long events;
    size_t rows = 0;
    char *csv;
    cli_run r;
    int fd = mkstemp(path);

    cr_assert_neq(fd, -1, "mkstemp: %s", strerror(errno));
    close(fd);
    cli_exec((const char *const[]){"estimate", "models/mlp10.yaml",
                                   "--steps", "2", "--format", "json",
                                   "--timeline", path, NULL}, &r);
    csv = read_file(path);
    unlink(path);
    cr_assert_eq(r.status, 0, "stderr:\n%s", r.err);
    cr_assert_not_null(csv);

    events_key = strstr(r.out, "\"events\": ");
    cr_assert_not_null(events_key);
    events = strtoull(events_key + strlen("\"events\": "), NULL, 10);
    cr_assert_eq(strncmp(csv, header, strlen(header)), 0,
                 "timeline header: %.*s", (int)strcspn(csv, "\n"), csv);
    for (const char *p = csv; *p != '\0'; p++)
        rows += *p == '\n';
    cr_assert_eq(rows - 1, events, "%zu rows for %llu events", rows - 1,
                 events);
    free(csv);
    cli_run_free(&r);
}

/* JSON output goes through jansson: a path with quotes, a backslash, a
 * control character and a byte that is not UTF-8 comes out as a valid
 * JSON string (the invalid byte as U+FFFD). */
Test(cli, json_output_escapes_any_string)
{
    static const char name[] = "a\"b\\c\001d\377.yaml";
    char dir[] = "/tmp/vp-json-XXXXXX", path[128], cmd[512];
    json_error_t je;
    cli_run r;

    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "cp models/mlp10.yaml '%s'", path);
    cr_assert_eq(system(cmd), 0);
    cli_exec((const char *const[]){"estimate", path, "--steps", "1",
                                   "--format", "json", NULL}, &r);
    unlink(path);
    rmdir(dir);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *doc = json_loads(r.out, 0, &je);
    cr_assert_not_null(doc, "not JSON: %s", je.text);
    const char *got = json_string_value(json_object_get(doc, "model_path"));
    char want[128];
    snprintf(want, sizeof want, "%s/a\"b\\c\001d\xEF\xBF\xBD.yaml", dir);
    cr_assert_str_eq(got, want);
    json_decref(doc);
    cli_run_free(&r);
}

/* --- generate() ---------------------------------------------------------- */

#define GEN_LLAMA "tests/data/good/hf-llama.json"

/* the weights, the KV cache and the peaks apart, per call */
Test(cli, estimate_generate_table)
{
    GOLDEN("estimate_generate_table", 0, "estimate", GEN_LLAMA, "--batch",
           "4", "--precision", "bf16", "--generate", "prompt=100,new=10",
           "--steps", "2");
}
Test(cli, estimate_generate_json)
{
    GOLDEN("estimate_generate_json", 0, "estimate", GEN_LLAMA, "--batch",
           "4", "--precision", "bf16", "--generate",
           "prompt=100,new=10,sample,top-p=0.9", "--cache", "static",
           "--steps", "2", "--format", "json");
}
Test(cli, estimate_generate_csv)
{
    GOLDEN("estimate_generate_csv", 0, "estimate", GEN_LLAMA, "--batch", "4",
           "--precision", "bf16", "--generate", "prompt=100,new=10",
           "--steps", "1", "--format", "csv");
}
Test(cli, generate_unknown_item)
{
    GOLDEN("generate_unknown_item", 2, "estimate", GEN_LLAMA, "--generate",
           "prompt=100,nwe=10");
}
Test(cli, generate_refuses_seq)
{
    GOLDEN("generate_refuses_seq", 2, "estimate", GEN_LLAMA, "--generate",
           "prompt=100,new=10", "--seq", "128");
}
Test(cli, generate_refuses_an_optimizer)
{
    GOLDEN("generate_refuses_an_optimizer", 2, "estimate", GEN_LLAMA,
           "--generate", "prompt=100,new=10", "--optimizer", "sgd");
}
Test(cli, cache_needs_generate)
{
    GOLDEN("cache_needs_generate", 2, "estimate", GEN_LLAMA, "--cache",
           "static");
}
Test(cli, generate_needs_a_causal_lm)
{
    GOLDEN("generate_needs_a_causal_lm", 3, "estimate",
           "tests/data/good/hf-bert.json", "--generate", "prompt=16,new=4");
}
