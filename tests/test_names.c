/* Tests of the enum names and parsers (sim.h, graph.h) and the default
 * setup. */
#include <criterion/criterion.h>

#include "vramplan/graph.h"
#include "vramplan/sim.h"
#include "vramplan/units.h"

Test(names, precision_round_trip)
{
    for (int p = 0; p < VP_PREC__COUNT; p++) {
        vp_precision back = VP_PREC__COUNT;

        cr_assert_eq(vp_precision_parse(vp_precision_name((vp_precision)p),
                                        &back), VP_OK);
        cr_assert_eq(back, p);
    }
}

Test(names, precision_names)
{
    cr_assert_str_eq(vp_precision_name(VP_PREC_FP32), "fp32");
    cr_assert_str_eq(vp_precision_name(VP_PREC_AMP_BF16), "amp-bf16");
    cr_assert_str_eq(vp_precision_name(VP_PREC_FP16), "fp16");
}

Test(names, precision_unknown)
{
    vp_precision p = VP_PREC_BF16;

    cr_assert_eq(vp_precision_parse("fp8", &p), VP_EARG);
    cr_assert_eq(vp_precision_parse("FP32", &p), VP_EARG);
    cr_assert_eq(vp_precision_parse(NULL, &p), VP_EARG);
    cr_assert_eq(p, VP_PREC_BF16);
    cr_assert_str_eq(vp_precision_name(VP_PREC__COUNT), "unknown");
}

Test(names, optimizer_round_trip)
{
    for (int o = 0; o < VP_OPT__COUNT; o++) {
        vp_optimizer back = VP_OPT__COUNT;

        cr_assert_eq(vp_optimizer_parse(vp_optimizer_name((vp_optimizer)o),
                                        &back), VP_OK);
        cr_assert_eq(back, o);
    }
}

Test(names, optimizer_names)
{
    cr_assert_str_eq(vp_optimizer_name(VP_OPT_ADAMW), "adamw");
    cr_assert_str_eq(vp_optimizer_name(VP_OPT_SGD_PLAIN), "sgd-nomomentum");
    cr_assert_str_eq(vp_optimizer_name(VP_OPT_ADAMW_8BIT), "adamw-8bit");
}

Test(names, optimizer_unknown)
{
    vp_optimizer o;

    cr_assert_eq(vp_optimizer_parse("lion", &o), VP_EARG);
}

Test(names, attention_round_trip)
{
    static const char *const names[] = {"sdpa", "flash", "efficient",
                                        "eager", "math"};

    for (int i = 0; i < 5; i++) {
        vp_attn_impl a = VP_ATTN_MATH;

        cr_assert_eq(vp_attn_impl_parse(names[i], &a), VP_OK);
        cr_assert_str_eq(vp_attn_impl_name(a), names[i]);
    }
}

Test(names, attention_unknown)
{
    vp_attn_impl a;

    cr_assert_eq(vp_attn_impl_parse("flash2", &a), VP_EARG);
    cr_assert_str_eq(vp_attn_impl_name((vp_attn_impl)99), "unknown");
}

Test(names, categories)
{
    cr_assert_str_eq(vp_category_name(VP_CAT_PARAM), "parameters");
    cr_assert_str_eq(vp_category_name(VP_CAT_OPTIM), "optimizer state");
    cr_assert_str_eq(vp_category_name(VP_CAT_WORKSPACE),
                     "library workspaces");
    cr_assert_str_eq(vp_category_name(VP_CAT__COUNT), "unknown");
}

Test(names, phases)
{
    cr_assert_str_eq(vp_phase_name(VP_PHASE_SETUP), "setup");
    cr_assert_str_eq(vp_phase_name(VP_PHASE_FORWARD), "forward");
    cr_assert_str_eq(vp_phase_name(VP_PHASE_BACKWARD), "backward");
    cr_assert_str_eq(vp_phase_name(VP_PHASE_OPTIMIZER), "optimizer");
    cr_assert_str_eq(vp_phase_name(VP_PHASE__COUNT), "unknown");
}

Test(names, op_kinds_from_the_map)
{
#define CHECK(name, str) cr_assert_str_eq(vp_op_kind_name(VP_OP_##name), str);
    VP_OP_KIND_MAP(CHECK)
#undef CHECK
}

Test(setup, defaults)
{
    vp_setup s;
    vp_allocator_config alloc;

    vp_setup_init(&s);
    vp_allocator_config_init(&alloc);
    cr_assert_eq(s.batch, 1);
    cr_assert_eq(s.seq, 0);
    cr_assert_eq(s.precision, VP_PREC_FP32);
    cr_assert_eq(s.optimizer, VP_OPT_ADAMW);
    cr_assert_eq(s.attn, VP_ATTN_SDPA);
    cr_assert_not(s.attn_set);
    cr_assert(s.set_to_none);
    cr_assert_not(s.inference);
    cr_assert_eq(s.accum, 1);
    cr_assert_eq(s.steps, 4);
    cr_assert_null(s.checkpoint);
    cr_assert_eq(s.n_checkpoint, 0);
    cr_assert_eq(s.cublas_workspace, 32 * VP_MiB);
    cr_assert_eq(s.cublaslt_workspace, 1 * VP_MiB);
    cr_assert_eq(s.context_bytes, 718077952);
    cr_assert_eq(s.alloc.limit, alloc.limit);
    cr_assert_eq(s.alloc.device_total, alloc.device_total);
    cr_assert_eq(s.alloc.expandable_segments, alloc.expandable_segments);
    cr_assert_eq(s.alloc.max_split_size, alloc.max_split_size);
    cr_assert_eq(s.alloc.max_non_split_rounding, alloc.max_non_split_rounding);
    cr_assert_eq(s.alloc.large_segment_size, alloc.large_segment_size);
    cr_assert_arr_eq(s.alloc.roundup_power2_divisions,
                     alloc.roundup_power2_divisions,
                     sizeof alloc.roundup_power2_divisions);
}
