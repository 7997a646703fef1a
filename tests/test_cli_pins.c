/* The cluster planner's step-time pins on the command line (--vpp,
 * --schedule, --sp/--no-sp, --first/--last-stage-layers, --overlap-*,
 * --compile): pinned plans, a pinned layout that does not fit, the
 * exports and the errors (golden files). */
#include <criterion/criterion.h>

#include "cli_golden.h"

Test(cli_pins, pinned_interleaved_uneven_plan)
{
    GOLDEN("pins_plan_uneven", 0, "plan", "tests/data/cluster/gpt3-175b.yaml",
           "--gpus", "1024", "--gpu", "a100-80g", "--tp", "8", "--pp", "8",
           "--vpp", "3", "--no-sp", "--first-stage-layers", "10",
           "--last-stage-layers", "8", "--global-batch", "1024",
           "--precision", "bf16", "--sharding", "distributed-optimizer",
           "--top", "2");
}

Test(cli_pins, pinned_layout_that_does_not_fit_keeps_its_figures)
{
    GOLDEN("pins_plan_nofit", 1, "plan", "tests/data/cluster/gpt3-175b.yaml",
           "--gpus", "64", "--gpu", "a100-80g", "--tp", "8", "--pp", "8",
           "--recompute", "none", "--sharding", "megatron-ddp",
           "--no-offload", "--global-batch", "64", "--max-gpus", "64");
}

Test(cli_pins, pinned_layout_that_does_not_fit_json)
{
    GOLDEN("pins_plan_nofit_json", 1, "plan",
           "tests/data/cluster/gpt3-175b.yaml", "--gpus", "64", "--gpu",
           "a100-80g", "--tp", "8", "--pp", "8", "--recompute", "none",
           "--sharding", "megatron-ddp", "--no-offload", "--global-batch",
           "64", "--max-gpus", "64", "--format", "json");
}

Test(cli_pins, megatron_export_with_overlap)
{
    GOLDEN("pins_export_megatron", 0, "export",
           "tests/data/cluster/gpt3-175b.yaml", "--gpus", "512", "--gpu",
           "h100-80g", "--to", "megatron", "--tp", "8", "--pp", "8", "--sp",
           "--vpp", "2", "--overlap-tp", "on", "--first-stage-layers", "10",
           "--last-stage-layers", "8", "--global-batch", "512");
}

Test(cli_pins, contradictory_pins)
{
    GOLDEN("pins_vpp_gpipe", 2, "plan", "models/gpt2-small.yaml", "--gpus",
           "8", "--gpu", "h100-80g", "--vpp", "3", "--schedule", "gpipe");
    GOLDEN("pins_bad_switch", 2, "plan", "models/gpt2-small.yaml", "--gpus",
           "8", "--gpu", "h100-80g", "--overlap-dp", "maybe");
    GOLDEN("pins_sp_tp1", 2, "plan", "models/gpt2-small.yaml", "--gpus", "8",
           "--gpu", "h100-80g", "--tp", "1", "--sp");
}

/* DualPipe pinned (DeepSeek-V3's schedule): planned with its bubble and
 * 2x parameters; the Megatron export refuses it */
Test(cli_pins, pinned_dualpipe_plan)
{
    GOLDEN("pins_plan_dualpipe", 0, "plan",
           "tests/data/cluster/gpt3-175b.yaml", "--gpus", "512", "--gpu",
           "h100-80g", "--tp", "8", "--pp", "8", "--schedule", "dualpipe",
           "--global-batch", "1024", "--precision", "bf16", "--top", "1");
}

Test(cli_pins, dualpipe_megatron_export_refused)
{
    GOLDEN("pins_export_dualpipe", 3, "export",
           "tests/data/cluster/gpt3-175b.yaml", "--gpus", "512", "--gpu",
           "h100-80g", "--to", "megatron", "--tp", "8", "--pp", "8",
           "--schedule", "dualpipe", "--global-batch", "1024");
}

/* Multi-token prediction pinned: the plan names its modules and the
 * Megatron export passes --mtp-num-layers */
Test(cli_pins, mtp_export_megatron)
{
    GOLDEN("pins_export_mtp", 0, "export",
           "tests/data/cluster/gpt3-175b.yaml", "--gpus", "512", "--gpu",
           "h100-80g", "--to", "megatron", "--tp", "8", "--pp", "8",
           "--mtp", "1", "--global-batch", "1024");
}

/* torchao's fp8 all-gather recipe (torchtitan's float8 FSDP2 runs) on the
 * command line: the plan names it (json: fp8_all_gather); asked of a
 * search where it applies to no configuration (bf16), an error that
 * says why */
Test(cli_pins, fp8_all_gather_plan)
{
    GOLDEN("pins_plan_fp8ag", 0, "plan", "models/llama-3-8b.yaml", "--gpus",
           "64", "--gpu", "h200", "--tp", "1", "--pp", "1", "--precision",
           "fp8", "--engine", "torch", "--sharding", "fsdp2", "--compile",
           "--recompute", "selective", "--micro-batch", "2",
           "--global-batch", "128", "--fp8-all-gather", "--top", "1",
           "--format", "json");
}

Test(cli_pins, fp8_all_gather_refused_without_fp8)
{
    GOLDEN("pins_fp8ag_bf16", 2, "plan", "models/llama-3-8b.yaml", "--gpus",
           "8", "--gpu", "h200", "--precision", "bf16", "--fp8-all-gather");
}
