/* Tests of dynamic batching (batching.h): the lengths file, a bucket case
 * checked by hand, monotonicity, packing, and the CLI's output and errors
 * (golden files). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <string.h>

#include "cli_golden.h"
#include "vramplan/vramplan.h"
#include "vramplan/batching.h"

static vp_status parse(const char *text, vp_lengths *l, vp_error *err)
{
    return vp_lengths_parse(text, strlen(text), "t.txt", l, err);
}

/* ---- the lengths file ------------------------------------------------------ */

Test(lengths, one_per_line)
{
    vp_lengths l;
    vp_error err;
    cr_assert_eq(parse("# c\n128\n64\n\n128\n  512 \n", &l, &err), VP_OK,
                 "%s", err.msg);
    cr_assert_eq(l.n, 3);
    cr_assert_eq(l.len[0], 64);
    cr_assert_eq(l.count[1], 2); /* 128 twice */
    cr_assert_eq(l.sequences, 4);
    cr_assert_eq(l.tokens, 64 + 128 + 128 + 512);
    cr_assert_eq(l.max_len, 512);
    vp_lengths_destroy(&l);
}

Test(lengths, histogram_merges_repeats)
{
    vp_lengths l;
    vp_error err;
    cr_assert_eq(parse("256 10\n128\t300\n256 5\n", &l, &err), VP_OK, "%s",
                 err.msg);
    cr_assert_eq(l.n, 2);
    cr_assert_eq(l.count[1], 15);
    cr_assert_eq(l.tokens, 128 * 300 + 256 * 15);
    vp_lengths_destroy(&l);
}

Test(lengths, crlf_file)
{
    vp_lengths l;
    vp_error err;
    cr_assert_eq(vp_lengths_load("tests/data/batching/crlf.txt", &l, &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(l.sequences, 3);
    vp_lengths_destroy(&l);
}

Test(lengths, error_positions)
{
    vp_lengths l;
    vp_error err;
    cr_assert_eq(parse("12\n  7x\n", &l, &err), VP_ESYNTAX);
    cr_assert_eq(err.line, 2);
    cr_assert_eq(err.col, 3);
    cr_assert_eq(err.width, 2);
    cr_assert_eq(parse("12 3 4\n", &l, &err), VP_ESYNTAX);
    cr_assert_eq(err.col, 6);
    cr_assert_eq(parse("12\n-4\n", &l, &err), VP_ESYNTAX);
    cr_assert_eq(parse("12 0\n", &l, &err), VP_ERANGE);
    cr_assert_eq(err.col, 4);
    cr_assert_eq(parse("99999999999999999999999\n", &l, &err), VP_ERANGE);
    cr_assert_eq(parse("\n# only\n", &l, &err), VP_ESYNTAX);
}

Test(lengths, mixed_forms)
{
    vp_lengths l;
    vp_error err;
    cr_assert_eq(parse("12\n13 2\n", &l, &err), VP_ESYNTAX);
    cr_assert_eq(err.line, 2);
    cr_assert_str_eq(err.msg, "a histogram line in a file of lengths");
}

/* ---- sizing ---------------------------------------------------------------- */

static vp_model *model;
static vp_setup setup;

static void gpt2_inference(void)
{
    vp_error err;
    model = vp_model_load("models/gpt2-small.yaml", &err);
    cr_assert_not_null(model);
    vp_setup_init(&setup);
    setup.inference = true;
    setup.optimizer = VP_OPT_NONE;
    setup.precision = VP_PREC_BF16;
    setup.steps = 2;
    setup.alloc.limit = 2 * VP_GiB;
}

static void done(void) { vp_model_free(model); }

static uint64_t maxbatch_at(const vp_setup *s, uint64_t seq)
{
    vp_setup t = *s;
    vp_maxbatch_result mb;
    vp_error err;
    t.seq = seq;
    cr_assert_eq(vp_maxbatch(model, &t, NULL, 0, &mb, &err), VP_OK);
    return mb.max_batch;
}

/* 90 x3, 100 x2 | 200 x4, 250 x1 in buckets of 128 and 256: the first
 * pads to 100, the second to 250; padding 1 - 1520 / 1750; the token
 * budget is the largest T with floor(T / L) <= max batch in both. */
Test(batching, hand_checked_buckets, .init = gpt2_inference, .fini = done)
{
    vp_lengths l;
    vp_batching_result r;
    vp_error err;
    const uint64_t bounds[] = {128, 256};

    cr_assert_eq(vp_lengths_load("tests/data/batching/buckets.txt", &l, &err),
                 VP_OK);
    cr_assert_eq(vp_batching_plan(model, &setup, NULL, &l, bounds, 2, &r,
                                  &err),
                 VP_OK, "%s", err.msg);
    cr_assert_eq(r.n_buckets, 2);
    cr_assert_eq(r.bucket[0].padded_len, 100);
    cr_assert_eq(r.bucket[1].padded_len, 250);
    cr_assert_eq(r.bucket[0].sequences, 5);
    cr_assert_eq(r.bucket[1].tokens, 1050);
    cr_assert_float_eq(r.padding_waste, 1.0 - 1520.0 / 1750.0, 1e-12);

    uint64_t b100 = maxbatch_at(&setup, 100), b250 = maxbatch_at(&setup, 250);
    uint64_t t100 = (b100 + 1) * 100 - 1, t250 = (b250 + 1) * 250 - 1;
    uint64_t t = t100 < t250 ? t100 : t250;
    cr_assert_eq(r.bucket[0].max_batch, b100);
    cr_assert_eq(r.token_budget, t);
    cr_assert_eq(r.bucket[0].batch, t / 100);
    cr_assert_eq(r.bucket[1].batch, t / 250);
    cr_assert_leq(r.bucket[1].batch, b250);
    cr_assert_eq(r.bucket[1].batches, (5 + t / 250 - 1) / (t / 250));
    vp_lengths_destroy(&l);
}

/* a larger budget never lowers the token budget; within one plan, longer
 * buckets never take larger batches */
Test(batching, monotone, .init = gpt2_inference, .fini = done)
{
    vp_lengths l;
    vp_batching_result r;
    vp_error err;
    uint64_t last = 0;

    cr_assert_eq(vp_lengths_load("tests/data/batching/hist.txt", &l, &err),
                 VP_OK);
    for (uint64_t gib = 2; gib <= 5; gib++) {
        setup.alloc.limit = gib * VP_GiB;
        cr_assert_eq(vp_batching_plan(model, &setup, NULL, &l, NULL, 0, &r,
                                      &err),
                     VP_OK, "%s", err.msg);
        cr_assert_geq(r.token_budget, last);
        last = r.token_budget;
        for (size_t k = 1; k < r.n_buckets; k++)
            cr_assert_leq(r.bucket[k].batch, r.bucket[k - 1].batch);
        cr_assert_geq(r.packed_tokens, l.max_len);
    }
    vp_lengths_destroy(&l);
}

/* packed batches: rows of the longest length that fit with flash
 * attention; all the tokens in ceil(tokens / per batch) batches */
Test(batching, packed_rows, .init = gpt2_inference, .fini = done)
{
    vp_lengths l;
    vp_batching_result r;
    vp_error err;
    vp_setup f = setup;

    cr_assert_eq(vp_lengths_load("tests/data/batching/hist.txt", &l, &err),
                 VP_OK);
    cr_assert_eq(vp_batching_plan(model, &setup, NULL, &l, NULL, 0, &r,
                                  &err),
                 VP_OK);
    f.attn = VP_ATTN_FLASH;
    f.attn_set = true;
    cr_assert_eq(r.packed_tokens, maxbatch_at(&f, 1024) * 1024);
    cr_assert_eq(r.packed_batches,
                 (l.tokens + r.packed_tokens - 1) / r.packed_tokens);
    vp_lengths_destroy(&l);
}

Test(batching, longest_does_not_fit, .init = gpt2_inference, .fini = done)
{
    vp_lengths l;
    vp_batching_result r;
    vp_error err;

    setup.alloc.limit = 300 * VP_MiB; /* under the weights */
    cr_assert_eq(vp_lengths_load("tests/data/batching/hist.txt", &l, &err),
                 VP_OK);
    cr_assert_eq(vp_batching_plan(model, &setup, NULL, &l, NULL, 0, &r,
                                  &err),
                 VP_EOOM);
    vp_lengths_destroy(&l);
}

Test(batching, bounds_below_longest, .init = gpt2_inference, .fini = done)
{
    vp_lengths l;
    vp_batching_result r;
    vp_error err;
    const uint64_t bounds[] = {128, 512};

    cr_assert_eq(vp_lengths_load("tests/data/batching/hist.txt", &l, &err),
                 VP_OK);
    cr_assert_eq(vp_batching_plan(model, &setup, NULL, &l, bounds, 2, &r,
                                  &err),
                 VP_EARG);
    vp_lengths_destroy(&l);
}

/* ---- the CLI ----------------------------------------------------------------- */

Test(cli_batching, histogram_inference_table)
{
    GOLDEN("batching_hist_inference", 0, "batching", "models/gpt2-small.yaml",
           "--lengths", "tests/data/batching/hist.txt", "--gpu", "h200",
           "--budget", "4GiB", "--inference", "--precision", "bf16");
}
Test(cli_batching, buckets_json)
{
    GOLDEN("batching_buckets_json", 0, "batching", "models/gpt2-small.yaml",
           "--lengths", "tests/data/batching/buckets.txt", "--gpu", "h200",
           "--budget", "3GiB", "--precision", "amp-bf16", "--buckets",
           "128,256", "--format", "json");
}
Test(cli_batching, bad_not_a_number)
{
    GOLDEN("batching_bad_not_a_number", 3, "batching",
           "models/gpt2-small.yaml", "--lengths",
           "tests/data/batching/bad-not-a-number.txt", "--gpu", "h200");
}
Test(cli_batching, bad_zero)
{
    GOLDEN("batching_bad_zero", 3, "batching", "models/gpt2-small.yaml",
           "--lengths", "tests/data/batching/bad-zero.txt", "--gpu", "h200");
}
Test(cli_batching, bad_mixed)
{
    GOLDEN("batching_bad_mixed", 3, "batching", "models/gpt2-small.yaml",
           "--lengths", "tests/data/batching/bad-mixed.txt", "--gpu", "h200");
}
Test(cli_batching, bad_three_fields)
{
    GOLDEN("batching_bad_three_fields", 3, "batching",
           "models/gpt2-small.yaml", "--lengths",
           "tests/data/batching/bad-three-fields.txt", "--gpu", "h200");
}
Test(cli_batching, bad_empty)
{
    GOLDEN("batching_bad_empty", 3, "batching", "models/gpt2-small.yaml",
           "--lengths", "tests/data/batching/bad-empty.txt", "--gpu", "h200");
}
Test(cli_batching, bad_too_long)
{
    GOLDEN("batching_bad_too_long", 3, "batching", "models/gpt2-small.yaml",
           "--lengths", "tests/data/batching/bad-too-long.txt", "--gpu",
           "h200");
}
Test(cli_batching, missing_lengths)
{
    GOLDEN("batching_missing_lengths", 2, "batching",
           "models/gpt2-small.yaml", "--gpu", "h200");
}
Test(cli_batching, unknown_option)
{
    GOLDEN("batching_unknown_option", 2, "batching",
           "models/gpt2-small.yaml", "--lenghts", "x", "--gpu", "h200");
}
