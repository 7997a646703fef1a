/* Tests for the caching-allocator model (src/allocator.c).
 * Rules: shared/docs/PYTORCH_MEMORY.md §1. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/allocator.h"
#include "vramplan/units.h"

#define MiB VP_MiB

static vp_allocator *make(const vp_allocator_config *cfg)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_allocator *a = vp_allocator_new(cfg, &err);
    cr_assert_not_null(a, "vp_allocator_new: %s", err.msg);
    return a;
}

static uint64_t must_malloc(vp_allocator *a, uint64_t n, int stream)
{
    vp_error err;
    uint64_t h = 0;
    memset(&err, 0, sizeof err);
    vp_status s = vp_allocator_malloc(a, n, stream, &h, &err);
    cr_assert_eq(s, VP_OK, "malloc(%llu): %d %s", (unsigned long long)n, s,
                 err.msg);
    cr_assert_neq(h, 0);
    return h;
}

static void must_free(vp_allocator *a, uint64_t h)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    cr_assert_eq(vp_allocator_release(a, h, &err), VP_OK, "%s", err.msg);
}

static vp_allocator_stats stats(const vp_allocator *a)
{
    vp_allocator_stats s;
    vp_allocator_stats_get(a, &s);
    return s;
}

static void check(const vp_allocator *a)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    cr_assert_eq(vp_allocator_check(a, &err), VP_OK, "%s", err.msg);
}

static void expect(const vp_allocator *a, uint64_t allocated,
                   uint64_t reserved, uint64_t segments, const char *row)
{
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.allocated, allocated, "%s: allocated %llu, want %llu", row,
                 (unsigned long long)s.allocated,
                 (unsigned long long)allocated);
    cr_assert_eq(s.reserved, reserved, "%s: reserved %llu, want %llu", row,
                 (unsigned long long)s.reserved, (unsigned long long)reserved);
    cr_assert_eq(s.segments, segments, "%s: segments %llu, want %llu", row,
                 (unsigned long long)s.segments, (unsigned long long)segments);
    check(a);
}

/* ------------------------------------------------ §1.7 worked example */

Test(allocator, worked_example_every_row)
{
    vp_allocator *a = make(NULL);
    uint64_t ha = must_malloc(a, 1, 0);
    expect(a, 512, 2 * MiB, 1, "a = 1 B");
    uint64_t hb = must_malloc(a, 1 * MiB, 0);
    expect(a, 1049088, 2 * MiB, 1, "b = 1 MiB");
    uint64_t hc = must_malloc(a, 1 * MiB + 1, 0);
    expect(a, 2098176, 22 * MiB, 2, "c = 1 MiB + 1");
    uint64_t hd = must_malloc(a, 12 * MiB, 0);
    expect(a, 14681088, 22 * MiB, 2, "d = 12 MiB");
    uint64_t he = must_malloc(a, 10 * MiB, 0);
    expect(a, 25166848, 32 * MiB, 3, "e = 10 MiB");
    uint64_t hf = must_malloc(a, 9 * MiB, 0);
    expect(a, 34604032, 52 * MiB, 4, "f = 9 MiB");
    must_free(a, hd);
    expect(a, 22021120, 52 * MiB, 4, "free d");
    uint64_t hg = must_malloc(a, 15 * MiB, 0);
    expect(a, 37749760, 52 * MiB, 4, "g = 15 MiB");
    uint64_t hh = must_malloc(a, 25 * MiB + 1, 0);
    expect(a, 65012736, 78 * MiB, 5, "h = 25 MiB + 1");
    cr_assert_eq(vp_allocator_block_size(a, hh), 26 * MiB);
    uint64_t hi = must_malloc(a, 11 * MiB + 1, 0);
    expect(a, 77595648, 90 * MiB, 6, "i = 11 MiB + 1");
    must_free(a, he);
    expect(a, 67109888, 90 * MiB, 6, "free e");
    vp_allocator_empty_cache(a);
    expect(a, 67109888, 80 * MiB, 5, "empty_cache");
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.peak_allocated, 77595648);
    cr_assert_eq(s.peak_reserved, 90 * MiB);
    cr_assert_eq(s.active_blocks, 7);
    (void)ha, (void)hb, (void)hc, (void)hf, (void)hg, (void)hi;
    vp_allocator_free(a);
}

/* ------------------------------------------------------------ rounding */

Test(allocator, round_size_multiples_of_512)
{
    cr_assert_eq(vp_allocator_round_size(NULL, 0), 512);
    cr_assert_eq(vp_allocator_round_size(NULL, 1), 512);
    cr_assert_eq(vp_allocator_round_size(NULL, 512), 512);
    cr_assert_eq(vp_allocator_round_size(NULL, 513), 1024);
    cr_assert_eq(vp_allocator_round_size(NULL, 1 * MiB), 1 * MiB);
    cr_assert_eq(vp_allocator_round_size(NULL, 1 * MiB + 1), 1 * MiB + 512);
    cr_assert_eq(vp_allocator_round_size(NULL, UINT64_MAX - 1022),
                 UINT64_MAX - 511);
    cr_assert_eq(vp_allocator_round_size(NULL, UINT64_MAX - 510), 0,
                 "overflow gives 0");
    cr_assert_eq(vp_allocator_round_size(NULL, UINT64_MAX), 0,
                 "overflow gives 0");
}

Test(allocator, segment_size_rules)
{
    cr_assert_eq(vp_allocator_segment_size(NULL, 512), 2 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, 1 * MiB), 2 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, 1 * MiB + 512), 20 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, 10 * MiB - 512), 20 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, 10 * MiB), 10 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, 10 * MiB + 512), 12 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, 25 * MiB + 512), 26 * MiB);
    cr_assert_eq(vp_allocator_segment_size(NULL, UINT64_MAX - 511), 0,
                 "overflow gives 0");
}

Test(allocator, segment_size_follows_large_segment_size)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.large_segment_size = 40 * MiB;
    cr_assert_eq(vp_allocator_segment_size(&cfg, 2 * MiB), 40 * MiB);
    cr_assert_eq(vp_allocator_segment_size(&cfg, 12 * MiB), 12 * MiB);
    cr_assert_eq(vp_allocator_segment_size(&cfg, 1 * MiB), 2 * MiB);
}

Test(allocator, roundup_power2_divisions)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    for (int i = 0; i < 16; i++)
        cfg.roundup_power2_divisions[i] = 4;
    cfg.roundup_power2_divisions[2] = 8; /* [4 MiB, 8 MiB) */
    /* 1 MiB + 1 with 4 divisions: steps of 256 KiB above 1 MiB */
    cr_assert_eq(vp_allocator_round_size(&cfg, 1 * MiB + 1), 1310720);
    /* 5 MiB + 1 with 8 divisions: steps of 512 KiB above 4 MiB */
    cr_assert_eq(vp_allocator_round_size(&cfg, 5 * MiB + 1), 5767168);
    /* powers of two are kept */
    cr_assert_eq(vp_allocator_round_size(&cfg, 4 * MiB), 4 * MiB);
    /* sizes <= 512 * divisions keep plain 512 rounding (1200 -> 1536) */
    cr_assert_eq(vp_allocator_round_size(&cfg, 1200), 1536);
    /* below 1 MiB the first interval's divisions apply */
    cr_assert_eq(vp_allocator_round_size(&cfg, 3000), 3072);
    cr_assert_eq(vp_allocator_round_size(&cfg, 4100), 5120);
    /* a used allocator rounds the same way */
    vp_allocator *a = make(&cfg);
    uint64_t h = must_malloc(a, 5 * MiB + 1, 0);
    cr_assert_eq(vp_allocator_block_size(a, h), 5767168);
    vp_allocator_free(a);
}

Test(allocator, roundup_power2_divisions_one_is_off)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    for (int i = 0; i < 16; i++)
        cfg.roundup_power2_divisions[i] = 1;
    cr_assert_eq(vp_allocator_round_size(&cfg, 5 * MiB + 1), 5 * MiB + 512);
}

/* ------------------------------------------------------------ splitting */

Test(allocator, small_pool_splits_at_512_remainder)
{
    vp_allocator *a = make(NULL);
    must_malloc(a, 1 * MiB, 0);
    must_malloc(a, 1 * MiB - 512, 0); /* leaves exactly 512 B: split */
    expect(a, 2 * MiB - 512, 2 * MiB, 1, "after two");
    must_malloc(a, 100, 0); /* fits in the 512 B remainder */
    expect(a, 2 * MiB, 2 * MiB, 1, "remainder used");
    must_malloc(a, 100, 0); /* segment full: a new one */
    expect(a, 2 * MiB + 512, 4 * MiB, 2, "new segment");
    vp_allocator_free(a);
}

Test(allocator, small_pool_no_split_without_remainder)
{
    vp_allocator *a = make(NULL);
    must_malloc(a, 1 * MiB, 0);
    uint64_t h = must_malloc(a, 1 * MiB, 0);
    cr_assert_eq(vp_allocator_block_size(a, h), 1 * MiB);
    expect(a, 2 * MiB, 2 * MiB, 1, "full");
    vp_allocator_free(a);
}

Test(allocator, large_pool_no_split_when_remainder_at_most_1MiB)
{
    vp_allocator *a = make(NULL);
    /* 19 MiB -> 20 MiB segment, remainder exactly 1 MiB: not split */
    uint64_t h = must_malloc(a, 19 * MiB, 0);
    cr_assert_eq(vp_allocator_block_size(a, h), 20 * MiB);
    expect(a, 20 * MiB, 20 * MiB, 1, "19 MiB");
    /* remainder 1 MiB + 512: split */
    uint64_t h2 = must_malloc(a, 19 * MiB - 512, 0);
    cr_assert_eq(vp_allocator_block_size(a, h2), 19 * MiB - 512);
    expect(a, 39 * MiB - 512, 40 * MiB, 2, "19 MiB - 512");
    vp_allocator_free(a);
}

Test(allocator, large_request_from_free_block_counts_unsplit_tail)
{
    vp_allocator *a = make(NULL);
    uint64_t h = must_malloc(a, 12 * MiB, 0); /* 12 MiB segment */
    must_free(a, h);
    /* 11 MiB + 512 fits the free 12 MiB block; tail 1 MiB - 512: kept */
    uint64_t h2 = must_malloc(a, 11 * MiB + 512, 0);
    cr_assert_eq(vp_allocator_block_size(a, h2), 12 * MiB);
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.allocated, 12 * MiB);
    cr_assert_eq(s.requested, 11 * MiB + 512);
    cr_assert_eq(s.reserved, 12 * MiB);
    vp_allocator_free(a);
}

/* -------------------------------------------------------------- merging */

Test(allocator, free_merges_neighbours)
{
    vp_allocator *a = make(NULL);
    uint64_t x = must_malloc(a, 4 * MiB, 0); /* 20 MiB segment */
    uint64_t y = must_malloc(a, 4 * MiB, 0);
    uint64_t z = must_malloc(a, 4 * MiB, 0);
    expect(a, 12 * MiB, 20 * MiB, 1, "three blocks");
    must_free(a, x);
    must_free(a, y); /* merges with x: an 8 MiB hole */
    uint64_t w = must_malloc(a, 8 * MiB, 0);
    expect(a, 12 * MiB, 20 * MiB, 1, "hole reused");
    must_free(a, w);
    must_free(a, z); /* everything merges back into one block */
    expect(a, 0, 20 * MiB, 1, "all free");
    vp_allocator_empty_cache(a);
    expect(a, 0, 0, 0, "whole segment released");
    vp_allocator_free(a);
}

Test(allocator, best_fit_breaks_ties_by_address)
{
    vp_allocator *a = make(NULL);
    /* two free 12 MiB blocks: the split tail of a lower 20 MiB segment and
     * a whole 12 MiB segment above it. The lower address wins, so the whole
     * segment stays free and empty_cache can release it. */
    must_malloc(a, 8 * MiB, 0);                /* seg 1: 8 + 12 free */
    uint64_t t = must_malloc(a, 12 * MiB, 0);  /* takes seg 1's tail */
    uint64_t q = must_malloc(a, 12 * MiB, 0);  /* seg 2 */
    must_free(a, t);
    must_free(a, q);
    must_malloc(a, 12 * MiB, 0);
    expect(a, 20 * MiB, 32 * MiB, 2, "reuse");
    vp_allocator_empty_cache(a);
    expect(a, 20 * MiB, 20 * MiB, 1, "seg 2 released");
    vp_allocator_free(a);
}

/* ---------------------------------------------------------- empty_cache */

Test(allocator, empty_cache_releases_only_whole_free_segments)
{
    vp_allocator *a = make(NULL);
    uint64_t s1 = must_malloc(a, 1000, 0);       /* small segment, split */
    uint64_t l1 = must_malloc(a, 2 * MiB, 0);     /* 20 MiB segment, split */
    uint64_t w1 = must_malloc(a, 30 * MiB, 0);    /* whole 30 MiB segment */
    uint64_t s2 = must_malloc(a, 1 * MiB, 0);     /* same small segment */
    must_free(a, w1);
    must_free(a, s2);
    expect(a, 1024 + 2 * MiB, 52 * MiB, 3, "before");
    vp_allocator_empty_cache(a);
    expect(a, 1024 + 2 * MiB, 22 * MiB, 2, "after");
    must_free(a, s1);
    must_free(a, l1);
    vp_allocator_empty_cache(a);
    expect(a, 0, 0, 0, "all released");
    vp_allocator_free(a);
}

/* --------------------------------------------------------------- streams */

Test(allocator, streams_do_not_share_free_blocks)
{
    vp_allocator *a = make(NULL);
    uint64_t h = must_malloc(a, 12 * MiB, 0);
    must_free(a, h);
    must_malloc(a, 12 * MiB, 1); /* cannot reuse stream 0's block */
    expect(a, 12 * MiB, 24 * MiB, 2, "stream 1");
    must_malloc(a, 12 * MiB, 0); /* stream 0 reuses its own */
    expect(a, 24 * MiB, 24 * MiB, 2, "stream 0");
    must_malloc(a, 100, 0);
    must_malloc(a, 100, 7);
    expect(a, 24 * MiB + 1024, 28 * MiB, 4, "small pools per stream");
    vp_allocator_free(a);
}

/* A split's rest leaves its size class (src/allocator.c t_shrink_at: it
 * moves within its directory) or stays in it (its entry updated in place):
 * a 38 MiB free block gives its head away piece by piece, the rest
 * crossing from the class [36, 40) MiB down to [20, 24) MiB, with a larger
 * free block beside it on the same stream and one on another stream (two
 * directories: no one-stream shortcut). Best fit takes the rest's head
 * each time (the smallest block that holds the request) and the larger
 * block once the rest is too small. */
Test(allocator, split_rest_moves_down_the_classes)
{
    vp_allocator *a = make(NULL);
    uint64_t big = must_malloc(a, 38 * MiB, 0);   /* a 38 MiB segment */
    uint64_t other = must_malloc(a, 40 * MiB, 0); /* a 40 MiB segment */
    uint64_t far = must_malloc(a, 38 * MiB, 3);   /* stream 3's */
    uint64_t base = vp_allocator_block_addr(a, big);
    uint64_t other_at = vp_allocator_block_addr(a, other);
    must_free(a, far);
    must_free(a, other);
    must_free(a, big);
    check(a);
    /* 1.5 MiB: the rest (36.5 MiB) stays in [36, 40); then 4 MiB pieces
     * take it through [32, 36), [28, 32) and [24, 28); 20 MiB leaves
     * 2.5 MiB */
    static const uint64_t take[] = {3 * MiB / 2, 4 * MiB, 4 * MiB, 4 * MiB,
                                    20 * MiB};
    uint64_t at = base;
    for (size_t k = 0; k < sizeof take / sizeof take[0]; k++) {
        uint64_t h = must_malloc(a, take[k], 0);
        cr_assert_eq(vp_allocator_block_addr(a, h), at,
                     "take %zu: %#llx, want the rest's head %#llx", k,
                     (unsigned long long)vp_allocator_block_addr(a, h),
                     (unsigned long long)at);
        at += take[k];
        check(a);
    }
    /* 12 MiB: the rest is too small, the 40 MiB block's head */
    uint64_t h = must_malloc(a, 12 * MiB, 0);
    cr_assert_eq(vp_allocator_block_addr(a, h), other_at);
    check(a);
    expect(a, 3 * MiB / 2 + 12 * MiB + 20 * MiB + 12 * MiB, 116 * MiB, 3,
           "every piece taken from the cache");
    vp_allocator_free(a);
}

/* A size class holds its first 8 free blocks in its directory's slab and
 * moves to an array of its own (then doubled) with the ninth; best fit
 * keeps taking the lowest address through both, and the check holds
 * after each call. 20 blocks of 12 MiB, each a segment of its own, freed
 * from the highest address down (each the class's new lowest, at its
 * array's end) and from the lowest up (each its new highest, at its
 * front), then taken back. */
Test(allocator, size_class_past_its_slab_entries)
{
    enum { N = 20 };
    for (int order = 0; order < 2; order++) {
        vp_allocator *a = make(NULL);
        uint64_t h[N], at[N];
        for (int k = 0; k < N; k++) {
            h[k] = must_malloc(a, 12 * MiB, 0);
            at[k] = vp_allocator_block_addr(a, h[k]);
            cr_assert(k == 0 || at[k] > at[k - 1]);
        }
        for (int k = 0; k < N; k++) {
            must_free(a, h[order ? k : N - 1 - k]);
            check(a);
        }
        expect(a, 0, N * 12 * MiB, N, "every block cached");
        for (int k = 0; k < N; k++) {
            uint64_t g = must_malloc(a, 12 * MiB, 0);
            cr_assert_eq(vp_allocator_block_addr(a, g), at[k],
                         "order %d, take %d: %#llx, want %#llx", order, k,
                         (unsigned long long)vp_allocator_block_addr(a, g),
                         (unsigned long long)at[k]);
            check(a);
            if (k % 3 == 0) { /* give some back: the class shrinks and
                                 grows again past 8 */
                must_free(a, g);
                check(a);
                g = must_malloc(a, 12 * MiB, 0);
                cr_assert_eq(vp_allocator_block_addr(a, g), at[k]);
            }
        }
        expect(a, N * 12 * MiB, N * 12 * MiB, N, "every block taken back");
        vp_allocator_free(a);
    }
}

/* ------------------------------------------------------- memory fraction */

Test(allocator, limit_retry_frees_cached_segments_and_succeeds)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.limit = 40 * MiB;
    vp_allocator *a = make(&cfg);
    uint64_t x = must_malloc(a, 12 * MiB, 0);
    must_malloc(a, 20 * MiB, 0);
    must_free(a, x); /* 12 MiB cached, 32 MiB reserved */
    /* 14 MiB: 32 + 14 > 40 -> release cached 12 MiB, retry: 20 + 14 */
    must_malloc(a, 14 * MiB, 0);
    expect(a, 34 * MiB, 34 * MiB, 2, "after retry");
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert_eq(s.num_ooms, 0);
    cr_assert_eq(s.peak_reserved, 34 * MiB);
    vp_allocator_free(a);
}

Test(allocator, limit_oom_when_cache_cannot_help)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.limit = 40 * MiB;
    vp_allocator *a = make(&cfg);
    uint64_t x = must_malloc(a, 12 * MiB, 0);
    must_malloc(a, 20 * MiB, 0);
    vp_error err;
    memset(&err, 0, sizeof err);
    uint64_t h = 99;
    cr_assert_eq(vp_allocator_malloc(a, 14 * MiB, 0, &h, &err), VP_EOOM);
    cr_assert_eq(err.code, VP_EOOM);
    cr_assert_eq(h, 0);
    expect(a, 32 * MiB, 32 * MiB, 2, "unchanged after OOM");
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.num_ooms, 1);
    cr_assert_eq(s.num_alloc_retries, 1);
    /* a cached block still serves requests that fit it */
    must_free(a, x);
    must_malloc(a, 8 * MiB, 0); /* from the free 12 MiB segment, split */
    expect(a, 28 * MiB, 32 * MiB, 2, "8 MiB from the cache");
    cr_assert_eq(vp_allocator_malloc(a, 8 * MiB, 0, &h, &err), VP_EOOM);
    cr_assert_eq(stats(a).num_ooms, 2);
    vp_allocator_free(a);
}

Test(allocator, limit_may_be_reached_exactly)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.limit = 40 * MiB;
    vp_allocator *a = make(&cfg);
    must_malloc(a, 12 * MiB, 0);
    must_malloc(a, 28 * MiB, 0);
    expect(a, 40 * MiB, 40 * MiB, 2, "at the limit");
    cr_assert_eq(stats(a).num_alloc_retries, 0);
    vp_allocator_free(a);
}

Test(allocator, limit_check_uses_segment_size_not_request)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.limit = 19 * MiB;
    vp_allocator *a = make(&cfg);
    vp_error err;
    uint64_t h;
    /* 2 MiB request needs a 20 MiB segment, over the 19 MiB limit */
    cr_assert_eq(vp_allocator_malloc(a, 2 * MiB, 0, &h, &err), VP_EOOM);
    /* a small request needs only 2 MiB */
    must_malloc(a, 4096, 0);
    expect(a, 4096, 2 * MiB, 1, "small fits");
    vp_allocator_free(a);
}

Test(allocator, device_total_caps_reserved_without_limit)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.device_total = 40 * MiB;
    vp_allocator *a = make(&cfg);
    uint64_t x = must_malloc(a, 12 * MiB, 0);
    must_malloc(a, 20 * MiB, 0);
    must_free(a, x);
    must_malloc(a, 14 * MiB, 0); /* retry path succeeds */
    cr_assert_eq(stats(a).num_alloc_retries, 1);
    vp_error err;
    uint64_t h;
    cr_assert_eq(vp_allocator_malloc(a, 8 * MiB, 0, &h, &err), VP_EOOM);
    cr_assert_eq(stats(a).num_ooms, 1);
    check(a);
    vp_allocator_free(a);
}

/* --------------------------------------------------------- max_split_size */

static vp_allocator_config split_cfg(void)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.max_split_size = 32 * MiB;
    return cfg;
}

Test(allocator, max_split_oversize_block_is_not_split)
{
    vp_allocator_config cfg = split_cfg();
    vp_allocator *a = make(&cfg);
    /* 32 MiB + 512 -> 34 MiB segment; remainder 2 MiB - 512 > 1 MiB, but
     * the request is >= max_split_size: not split */
    uint64_t h = must_malloc(a, 32 * MiB + 512, 0);
    cr_assert_eq(vp_allocator_block_size(a, h), 34 * MiB);
    vp_allocator_free(a);

    a = make(NULL); /* default config splits it */
    h = must_malloc(a, 32 * MiB + 512, 0);
    cr_assert_eq(vp_allocator_block_size(a, h), 32 * MiB + 512);
    vp_allocator_free(a);
}

Test(allocator, max_split_small_request_skips_oversize_block)
{
    vp_allocator_config cfg = split_cfg();
    vp_allocator *a = make(&cfg);
    uint64_t h = must_malloc(a, 40 * MiB, 0);
    must_free(a, h);
    must_malloc(a, 4 * MiB, 0); /* not from the 40 MiB block: new 20 MiB */
    expect(a, 4 * MiB, 60 * MiB, 2, "oversize not reused");
    vp_allocator_free(a);
}

Test(allocator, max_split_oversize_rounding_limit)
{
    vp_allocator_config cfg = split_cfg();
    vp_allocator *a = make(&cfg);
    uint64_t h = must_malloc(a, 60 * MiB, 0);
    must_free(a, h);
    /* 36 + 20 <= 60: the 60 MiB block is too big to hand out */
    must_malloc(a, 36 * MiB, 0);
    expect(a, 36 * MiB, 96 * MiB, 2, "36 MiB");
    /* 44 + 20 > 60: reused whole, not split */
    uint64_t h2 = must_malloc(a, 44 * MiB, 0);
    cr_assert_eq(vp_allocator_block_size(a, h2), 60 * MiB);
    expect(a, 96 * MiB, 96 * MiB, 2, "44 MiB");
    vp_allocator_free(a);
}

Test(allocator, max_split_releases_oversize_block_before_full_flush)
{
    vp_allocator_config cfg = split_cfg();
    cfg.limit = 90 * MiB;
    vp_allocator *a = make(&cfg);
    uint64_t x = must_malloc(a, 40 * MiB, 0);
    must_malloc(a, 40 * MiB, 0);
    vp_error err;
    uint64_t h;
    /* 80 + 20 > 90 with nothing cached: OOM after the full retry */
    cr_assert_eq(vp_allocator_malloc(a, 3 * MiB, 0, &h, &err), VP_EOOM);
    cr_assert_eq(stats(a).num_alloc_retries, 1);
    vp_allocator_free(a);

    a = make(&cfg);
    x = must_malloc(a, 40 * MiB, 0);
    must_malloc(a, 40 * MiB, 0);
    must_free(a, x);
    /* 4 MiB: the 40 MiB block is oversize; 80 + 20 > 90 -> release the
     * oversize cached block (release_available_cached_blocks), no retry */
    must_malloc(a, 4 * MiB, 0);
    expect(a, 44 * MiB, 60 * MiB, 2, "after release_available");
    cr_assert_eq(stats(a).num_alloc_retries, 0);
    vp_allocator_free(a);
}

Test(allocator, max_split_under_20MiB_is_refused)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.max_split_size = 10 * MiB;
    vp_error err;
    memset(&err, 0, sizeof err);
    cr_assert_null(vp_allocator_new(&cfg, &err));
    cr_assert_eq(err.code, VP_EARG);
}

Test(allocator, bad_divisions_are_refused)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.roundup_power2_divisions[3] = 3;
    vp_error err;
    memset(&err, 0, sizeof err);
    cr_assert_null(vp_allocator_new(&cfg, &err));
    cr_assert_eq(err.code, VP_EARG);
}

/* -------------------------------------------------------------- handles */

Test(allocator, double_free_is_refused)
{
    vp_allocator *a = make(NULL);
    uint64_t h = must_malloc(a, 100, 0);
    must_free(a, h);
    vp_error err;
    memset(&err, 0, sizeof err);
    cr_assert_eq(vp_allocator_release(a, h, &err), VP_EARG);
    cr_assert_eq(err.code, VP_EARG);
    cr_assert_eq(vp_allocator_block_size(a, h), 0);
    expect(a, 0, 2 * MiB, 1, "state kept");
    vp_allocator_free(a);
}

Test(allocator, stale_handle_refused_after_reuse)
{
    vp_allocator *a = make(NULL);
    uint64_t h1 = must_malloc(a, 12 * MiB, 0);
    must_free(a, h1);
    uint64_t h2 = must_malloc(a, 12 * MiB, 0); /* same block again */
    cr_assert_neq(h1, h2);
    vp_error err;
    cr_assert_eq(vp_allocator_release(a, h1, &err), VP_EARG);
    cr_assert_eq(vp_allocator_block_size(a, h2), 12 * MiB);
    must_free(a, h2);
    vp_allocator_free(a);
}

Test(allocator, unknown_handle_is_refused)
{
    vp_allocator *a = make(NULL);
    vp_error err;
    cr_assert_eq(vp_allocator_release(a, 12345, &err), VP_EARG);
    cr_assert_eq(vp_allocator_release(a, UINT64_MAX, &err), VP_EARG);
    cr_assert_eq(vp_allocator_release(a, (uint64_t)7 << 32 | 1, &err),
                 VP_EARG);
    cr_assert_eq(vp_allocator_release(a, 0, &err), VP_OK, "0 is a no-op");
    /* slot word 0 (as handle 0's) with a generation: no handle */
    cr_assert_eq(vp_allocator_release(a, (uint64_t)3 << 32, &err), VP_EARG);
    cr_assert_eq(vp_allocator_block_size(a, 12345), 0);
    vp_allocator_free(a);
}

Test(allocator, zero_bytes_takes_no_block)
{
    vp_allocator *a = make(NULL);
    uint64_t h = 5;
    vp_error err;
    cr_assert_eq(vp_allocator_malloc(a, 0, 0, &h, &err), VP_OK);
    cr_assert_eq(h, 0);
    expect(a, 0, 0, 0, "nothing");
    cr_assert_eq(stats(a).active_blocks, 0);
    vp_allocator_free(a);
}

/* ------------------------------------------------------------- overflow */

Test(allocator, overflowing_request_is_refused)
{
    vp_allocator *a = make(NULL);
    vp_error err;
    uint64_t h;
    cr_assert_eq(vp_allocator_malloc(a, UINT64_MAX, 0, &h, &err),
                 VP_EOVERFLOW);
    /* rounds to 512 fine, but not to the 2 MiB segment size */
    cr_assert_eq(vp_allocator_malloc(a, UINT64_MAX - 1 * MiB, 0, &h, &err),
                 VP_EOVERFLOW);
    /* the edge (open_request tests it before the allocation size is
     * computed): 2^64 - 2 MiB rounds up to itself; 512 more does not fit */
    uint64_t edge = UINT64_MAX - 2 * MiB + 1;
    cr_assert_eq(vp_allocator_malloc(a, edge + 1, 0, &h, &err), VP_EOVERFLOW);
    cr_assert_eq(vp_allocator_malloc(a, edge, 0, &h, &err), VP_EOOM,
                 "a segment of 2^64 - 2 MiB: no overflow, the address space "
                 "is what runs out");
    expect(a, 0, 0, 0, "nothing taken");
    vp_allocator_free(a);
}

Test(allocator, huge_requests_never_wrap_reserved)
{
    vp_allocator *a = make(NULL); /* no device size: unbounded */
    vp_error err;
    uint64_t h;
    uint64_t half = (uint64_t)1 << 63;
    must_malloc(a, half, 0);
    cr_assert_eq(vp_allocator_malloc(a, half, 1, &h, &err), VP_EOOM);
    expect(a, half, half, 1, "one half");
    cr_assert_eq(stats(a).num_ooms, 1);
    vp_allocator_free(a);

    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.device_total = 80 * VP_GiB;
    a = make(&cfg);
    cr_assert_eq(vp_allocator_malloc(a, (uint64_t)1 << 62, 0, &h, &err),
                 VP_EOOM);
    cr_assert_eq(vp_allocator_malloc(a, UINT64_MAX - 4 * MiB - 1, 0, &h,
                                     &err),
                 VP_EOOM);
    expect(a, 0, 0, 0, "nothing taken");
    vp_allocator_free(a);
}

/* -------------------------------------------------- expandable segments */

static vp_allocator_config exp_cfg(void)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.expandable_segments = true;
    cfg.device_total = 80 * VP_GiB;
    return cfg;
}

Test(allocator, expandable_maps_pages_and_grows_in_place)
{
    vp_allocator_config cfg = exp_cfg();
    vp_allocator *a = make(&cfg);
    uint64_t x = must_malloc(a, 1 * MiB + 1, 0); /* one 20 MiB page */
    expect(a, 1 * MiB + 512, 20 * MiB, 0, "first");
    /* 25 MiB: the free tail (19 MiB - 512) grows by one more page */
    uint64_t y = must_malloc(a, 25 * MiB, 0);
    expect(a, 26 * MiB + 512, 40 * MiB, 0, "grown");
    /* 12 MiB fits in the rest of the second page without new pages */
    uint64_t z = must_malloc(a, 12 * MiB, 0);
    expect(a, 38 * MiB + 512, 40 * MiB, 0, "fits");
    must_free(a, x);
    must_free(a, y);
    must_free(a, z);
    expect(a, 0, 40 * MiB, 0, "all free");
    vp_allocator_empty_cache(a);
    expect(a, 0, 0, 0, "unmapped");
    /* usable again after the segment was released */
    must_malloc(a, 30 * MiB, 0);
    expect(a, 30 * MiB, 40 * MiB, 0, "again");
    vp_allocator_free(a);
}

Test(allocator, expandable_small_pool_uses_2MiB_pages)
{
    vp_allocator_config cfg = exp_cfg();
    vp_allocator *a = make(&cfg);
    uint64_t h[5];
    for (int i = 0; i < 5; i++)
        h[i] = must_malloc(a, 1 * MiB, 0);
    expect(a, 5 * MiB, 6 * MiB, 0, "three pages");
    /* free the middle: pages only partly free stay mapped */
    must_free(a, h[2]);
    vp_allocator_empty_cache(a);
    expect(a, 4 * MiB, 6 * MiB, 0, "partial page kept");
    must_free(a, h[3]);
    vp_allocator_empty_cache(a);
    /* [2,4) MiB is a whole free page now */
    expect(a, 3 * MiB, 4 * MiB, 0, "one page unmapped");
    /* best fit first takes the free 1 MiB at the end ... */
    must_malloc(a, 1 * MiB, 0);
    expect(a, 4 * MiB, 4 * MiB, 0, "free block reused");
    /* ... then the lowest unmapped range with room: the hole */
    must_malloc(a, 1 * MiB, 0);
    expect(a, 5 * MiB, 6 * MiB, 0, "hole mapped again");
    (void)h;
    vp_allocator_free(a);
}

Test(allocator, expandable_best_fit_prefers_block_without_room_to_grow)
{
    vp_allocator_config cfg = exp_cfg();
    vp_allocator *a = make(&cfg);
    must_malloc(a, 4 * MiB, 0);                 /* [0,4)            */
    uint64_t b = must_malloc(a, 6 * MiB, 0);    /* [4,10)           */
    must_malloc(a, 5 * MiB, 0);                 /* [10,15), tail 5  */
    must_free(a, b);                            /* plain hole of 6  */
    expect(a, 9 * MiB, 20 * MiB, 0, "setup");
    /* 4 MiB: the tail (5 MiB + unmapped) ranks after the 6 MiB hole */
    must_malloc(a, 4 * MiB, 0);
    /* so a 6 MiB request finds no block and must grow the tail */
    must_malloc(a, 6 * MiB, 0);
    expect(a, 19 * MiB, 40 * MiB, 0, "tail grown");
    vp_allocator_free(a);
}

Test(allocator, expandable_limit_and_oom_unmap)
{
    vp_allocator_config cfg = exp_cfg();
    cfg.limit = 60 * MiB;
    vp_allocator *a = make(&cfg);
    uint64_t x = must_malloc(a, 30 * MiB, 0); /* pages [0,40) */
    must_malloc(a, 5 * MiB, 0);               /* [30,35) */
    must_free(a, x);                          /* [0,30) free, 40 mapped */
    expect(a, 5 * MiB, 40 * MiB, 0, "setup");
    /* 32 MiB: no free block fits; limit check 40 + 32 > 60 fails, the
     * retry unmaps page [0,20) and then maps the tail's deficit */
    must_malloc(a, 32 * MiB, 0);
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert_eq(s.num_ooms, 0);
    check(a);
    vp_error err;
    uint64_t h;
    cr_assert_eq(vp_allocator_malloc(a, 50 * MiB, 0, &h, &err), VP_EOOM);
    check(a);
    vp_allocator_free(a);
}

Test(allocator, expandable_streams_get_separate_segments)
{
    vp_allocator_config cfg = exp_cfg();
    vp_allocator *a = make(&cfg);
    must_malloc(a, 4 * MiB, 0);
    must_malloc(a, 4 * MiB, 1);
    expect(a, 8 * MiB, 40 * MiB, 0, "two streams");
    vp_allocator_free(a);
}

/* ---------------------------------------------------------------- peaks */

Test(allocator, reset_peaks_sets_peaks_to_current)
{
    vp_allocator *a = make(NULL);
    uint64_t h = must_malloc(a, 30 * MiB, 0);
    uint64_t g = must_malloc(a, 4 * MiB, 0);
    must_free(a, h);
    vp_allocator_stats s = stats(a);
    cr_assert_eq(s.peak_allocated, 34 * MiB);
    cr_assert_eq(s.peak_reserved, 50 * MiB);
    vp_allocator_empty_cache(a);
    vp_allocator_reset_peaks(a);
    s = stats(a);
    cr_assert_eq(s.peak_allocated, 4 * MiB);
    cr_assert_eq(s.peak_reserved, 20 * MiB);
    must_free(a, g);
    must_malloc(a, 2 * MiB, 0);
    s = stats(a);
    cr_assert_eq(s.peak_allocated, 4 * MiB, "peak is a maximum");
    vp_allocator_free(a);
}

Test(allocator, null_arguments)
{
    vp_error err;
    uint64_t h;
    cr_assert_eq(vp_allocator_malloc(NULL, 1, 0, &h, &err), VP_EARG);
    vp_allocator_free(NULL);
    vp_allocator_empty_cache(NULL);
    vp_allocator *a = make(NULL);
    cr_assert_eq(vp_allocator_malloc(a, 1, 0, NULL, &err), VP_EARG);
    cr_assert_eq(vp_allocator_malloc(a, 1, 0, &h, NULL), VP_OK,
                 "err may be NULL");
    vp_allocator_free(a);
}

/* --------------------------------------------------------------- stress */

typedef struct live {
    uint64_t h, n;
} live;

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Random malloc/free/empty_cache; after every op: invariants, allocated ==
 * sum of live block sizes, requested == sum of requests. */
static void stress(const vp_allocator_config *cfg, uint64_t seed, int ops,
                   int streams)
{
    vp_allocator *a = make(cfg);
    live *lv = calloc((size_t)ops, sizeof *lv);
    cr_assert_not_null(lv);
    size_t n = 0;
    uint64_t ooms = 0;
    for (int op = 0; op < ops; op++) {
        uint64_t r = rnd(&seed) % 1000;
        if (r < 5) {
            vp_allocator_empty_cache(a);
        } else if (r < 420 && n > 0) {
            size_t k = (size_t)(rnd(&seed) % n);
            must_free(a, lv[k].h);
            lv[k] = lv[--n];
        } else {
            /* log-uniform 1 B .. ~90 MiB */
            uint64_t e = rnd(&seed) % 27;
            uint64_t sz = ((uint64_t)1 << e) + rnd(&seed) % ((uint64_t)1 << e);
            if (sz > 90 * MiB)
                sz = 90 * MiB;
            int st = (int)(rnd(&seed) % (uint64_t)streams);
            uint64_t h = 0;
            vp_error err;
            vp_status s = vp_allocator_malloc(a, sz, st, &h, &err);
            if (s == VP_EOOM) {
                ooms++;
            } else {
                cr_assert_eq(s, VP_OK, "%s", err.msg);
                cr_assert_geq(vp_allocator_block_size(a, h),
                              vp_allocator_round_size(cfg, sz));
                lv[n].h = h;
                lv[n].n = sz;
                n++;
            }
        }
        check(a);
        uint64_t sum = 0, req = 0;
        for (size_t k = 0; k < n; k++) {
            uint64_t b = vp_allocator_block_size(a, lv[k].h);
            cr_assert_neq(b, 0);
            sum += b;
            req += lv[k].n;
        }
        vp_allocator_stats s = stats(a);
        cr_assert_eq(s.allocated, sum);
        cr_assert_eq(s.requested, req);
        cr_assert_eq(s.active_blocks, n);
        cr_assert_geq(s.reserved, s.allocated);
        if (cfg && cfg->limit && !cfg->expandable_segments)
            cr_assert_leq(s.reserved, cfg->limit);
    }
    cr_assert_eq(stats(a).num_ooms, ooms);
    while (n > 0)
        must_free(a, lv[--n].h);
    vp_allocator_empty_cache(a);
    expect(a, 0, 0, 0, "drained");
    free(lv);
    vp_allocator_free(a);
}

Test(allocator, stress_default)
{
    stress(NULL, 1, 4000, 1);
}

Test(allocator, stress_streams)
{
    stress(NULL, 2, 4000, 3);
}

Test(allocator, stress_limit_and_max_split)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.limit = 600 * MiB;
    cfg.max_split_size = 40 * MiB;
    stress(&cfg, 3, 4000, 2);
}

Test(allocator, stress_expandable)
{
    vp_allocator_config cfg = exp_cfg();
    cfg.limit = 700 * MiB;
    stress(&cfg, 4, 4000, 2);
}

Test(allocator, stress_power2_divisions)
{
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    for (int i = 0; i < 16; i++)
        cfg.roundup_power2_divisions[i] = (uint32_t)(1u << (i % 4 + 1));
    cfg.device_total = 800 * MiB;
    stress(&cfg, 5, 4000, 2);
}

/* The plain fit (no expandable segments, max_split_size UINT64_MAX) takes
 * best fit's block as found and splits a large block on its rest alone;
 * the general code does the same whenever no block size reaches
 * max_split_size. Twin allocators, one on each path (max_split_size
 * 2^64 - 512: no size reaches it, but the plain fit is off), given the same
 * random calls, must agree on every handle, block size, block address and
 * statistic. A release's merges take a free neighbour out of the index by
 * the plain fit's own erase (erase_plain) on one and by t_erase on the
 * other; the check after each call finds an index that lost or kept the
 * wrong entry. */
Test(allocator, plain_fit_equals_the_general_path)
{
    vp_allocator_config pc, gc;
    vp_allocator_config_init(&pc);
    pc.limit = 600 * MiB;
    gc = pc;
    gc.max_split_size = UINT64_MAX - 511;
    vp_allocator *p = make(&pc), *g = make(&gc);
    enum { OPS = 3000 };
    uint64_t hp[OPS], hg[OPS], seed = 11;
    size_t n = 0;
    for (int op = 0; op < OPS; op++) {
        uint64_t r = rnd(&seed) % 1000;
        if (r < 5) {
            vp_allocator_empty_cache(p);
            vp_allocator_empty_cache(g);
        } else if (r < 420 && n > 0) {
            size_t k = (size_t)(rnd(&seed) % n);
            must_free(p, hp[k]);
            must_free(g, hg[k]);
            hp[k] = hp[--n];
            hg[k] = hg[n];
        } else {
            uint64_t e = rnd(&seed) % 27;
            uint64_t sz = ((uint64_t)1 << e) + rnd(&seed) % ((uint64_t)1 << e);
            vp_error ep, eg;
            uint64_t a = 0, b = 0;
            vp_status sp = vp_allocator_malloc(p, sz, 0, &a, &ep);
            vp_status sg = vp_allocator_malloc(g, sz, 0, &b, &eg);
            cr_assert_eq(sp, sg, "op %d: status %d against %d", op, sp, sg);
            cr_assert_eq(a, b, "op %d: handles differ", op);
            if (sp == VP_OK) {
                cr_assert_eq(vp_allocator_block_size(p, a),
                             vp_allocator_block_size(g, b), "op %d", op);
                cr_assert_eq(vp_allocator_block_addr(p, a),
                             vp_allocator_block_addr(g, b), "op %d", op);
                hp[n] = a;
                hg[n++] = b;
            }
        }
        vp_allocator_stats x = stats(p), y = stats(g);
        cr_assert_eq(memcmp(&x, &y, sizeof x), 0, "op %d: stats differ", op);
        check(p);
        check(g);
    }
    cr_assert_gt(stats(p).num_ooms, 0, "the limit was never reached");
    vp_allocator_free(p);
    vp_allocator_free(g);
}

/* ------------------------------------------- addresses and listing */

Test(allocator, block_addr_of_live_and_just_freed_blocks)
{
    vp_allocator *a = make(NULL);
    uint64_t x = must_malloc(a, 1000, 0); /* 1024 B at the 2 MiB segment */
    uint64_t y = must_malloc(a, 1000, 0);
    cr_assert_eq(vp_allocator_block_addr(a, x), 2 * MiB);
    cr_assert_eq(vp_allocator_block_addr(a, y), 2 * MiB + 1024);
    must_free(a, x);
    cr_assert_eq(vp_allocator_block_addr(a, x), 2 * MiB, "just freed");
    must_free(a, y);
    cr_assert_eq(vp_allocator_block_addr(a, y), 2 * MiB + 1024);
    cr_assert_eq(vp_allocator_block_addr(a, x), 0, "freed earlier");
    cr_assert_eq(vp_allocator_block_addr(a, 0), 0);
    cr_assert_eq(vp_allocator_block_addr(NULL, y), 0);
    vp_allocator_free(a);
}

#define MAX_SEGS 64
typedef struct seg_list {
    size_t n;
    vp_allocator_segment_info seg[MAX_SEGS];
    vp_allocator_block_info blk[MAX_SEGS][8];
    size_t calls;
    vp_status stop_with; /* returned from the visitor */
} seg_list;

static vp_status keep_segment(const vp_allocator_segment_info *s, void *ud)
{
    seg_list *l = ud;
    l->calls++;
    if (l->n < MAX_SEGS) {
        l->seg[l->n] = *s;
        for (size_t i = 0; i < s->n_blocks && i < 8; i++)
            l->blk[l->n][i] = s->blocks[i];
        l->n++;
    }
    return l->stop_with;
}

static void list(const vp_allocator *a, seg_list *l)
{
    vp_error err;
    vp_status stop = l->stop_with;
    memset(l, 0, sizeof *l);
    l->stop_with = stop;
    cr_assert_eq(vp_allocator_segments(a, keep_segment, l, &err), stop);
}

Test(allocator, segments_listed_in_address_order_with_blocks)
{
    vp_allocator *a = make(NULL);
    uint64_t big = must_malloc(a, 30 * MiB, 0); /* large: 30 MiB at 2 MiB */
    uint64_t s1 = must_malloc(a, 1000, 0);      /* small 2 MiB at 32 MiB */
    uint64_t s2 = must_malloc(a, 3000, 0);
    must_free(a, s1);
    seg_list l = {0};
    list(a, &l);
    cr_assert_eq(l.n, 2);
    cr_assert_eq(l.seg[0].addr, 2 * MiB);
    cr_assert_eq(l.seg[0].size, 30 * MiB);
    cr_assert(l.seg[0].large);
    cr_assert_eq(l.seg[0].n_blocks, 1);
    cr_assert_eq(l.blk[0][0].handle, big);
    cr_assert_eq(l.blk[0][0].requested, 30 * MiB);
    cr_assert_eq(l.seg[1].addr, 32 * MiB);
    cr_assert_not(l.seg[1].large);
    cr_assert_eq(l.seg[1].size, 2 * MiB);
    cr_assert_eq(l.seg[1].allocated, 3072);
    cr_assert_eq(l.seg[1].requested, 3000);
    /* free 1024 | s2 3072 | free remainder, in address order */
    cr_assert_eq(l.seg[1].n_blocks, 3);
    cr_assert_not(l.blk[1][0].allocated);
    cr_assert_eq(l.blk[1][0].size, 1024);
    cr_assert_eq(l.blk[1][0].handle, 0);
    cr_assert_eq(l.blk[1][1].handle, s2);
    cr_assert_eq(l.blk[1][1].addr, 32 * MiB + 1024);
    cr_assert_eq(l.blk[1][2].size, 2 * MiB - 4096);
    vp_allocator_free(a);
}

Test(allocator, segments_visitor_status_stops_the_walk)
{
    vp_allocator *a = make(NULL);
    must_malloc(a, 30 * MiB, 0);
    must_malloc(a, 1000, 0);
    seg_list l = {0};
    l.stop_with = VP_EIO;
    list(a, &l);
    cr_assert_eq(l.calls, 1);
    vp_error err;
    cr_assert_eq(vp_allocator_segments(a, NULL, NULL, &err), VP_EARG);
    vp_allocator_free(a);
}

typedef struct map_log {
    int n;
    bool unmap[8];
    uint64_t addr[8], size[8];
} map_log;

static void log_map(bool is_unmap, uint64_t addr, uint64_t size, void *ud)
{
    map_log *m = ud;
    if (m->n < 8) {
        m->unmap[m->n] = is_unmap;
        m->addr[m->n] = addr;
        m->size[m->n] = size;
    }
    m->n++;
}

Test(allocator, expandable_map_hook_and_mapped_ranges_as_segments)
{
    vp_allocator_config cfg = exp_cfg();
    vp_allocator *a = make(&cfg);
    map_log m = {0};
    vp_allocator_set_map_hook(a, log_map, &m);
    uint64_t x = must_malloc(a, 1 * MiB + 1, 0); /* maps page 0 */
    uint64_t y = must_malloc(a, 25 * MiB, 0);    /* maps page 1 */
    cr_assert_eq(m.n, 2);
    cr_assert_eq(m.addr[0], 2 * MiB);
    cr_assert_eq(m.size[0], 20 * MiB);
    cr_assert_eq(m.addr[1], 22 * MiB);
    cr_assert_eq(m.size[1], 20 * MiB);
    cr_assert_not(m.unmap[0] || m.unmap[1]);
    seg_list l = {0};
    list(a, &l);
    cr_assert_eq(l.n, 1, "one mapped range");
    cr_assert(l.seg[0].expandable);
    cr_assert_eq(l.seg[0].size, 40 * MiB);
    cr_assert_eq(l.seg[0].allocated, 26 * MiB + 512);
    must_free(a, x);
    must_free(a, y);
    vp_allocator_empty_cache(a);
    cr_assert_eq(m.n, 3);
    cr_assert(m.unmap[2]);
    cr_assert_eq(m.addr[2], 2 * MiB);
    cr_assert_eq(m.size[2], 40 * MiB);
    list(a, &l);
    cr_assert_eq(l.n, 0);
    vp_allocator_free(a);
}

/* The listing agrees with the counters after random work. */
static void listing_agrees(const vp_allocator_config *cfg, uint64_t seed)
{
    vp_allocator *a = make(cfg);
    uint64_t h[64] = {0};
    for (int op = 0; op < 600; op++) {
        size_t k = (size_t)(rnd(&seed) % 64);
        if (h[k]) {
            must_free(a, h[k]);
            h[k] = 0;
        } else {
            uint64_t e = rnd(&seed) % 26;
            uint64_t sz = ((uint64_t)1 << e) + rnd(&seed) % ((uint64_t)1 << e);
            h[k] = must_malloc(a, sz, 0);
        }
        if (op % 97 == 0)
            vp_allocator_empty_cache(a);
    }
    seg_list l = {0};
    list(a, &l);
    cr_assert_lt(l.n, MAX_SEGS);
    uint64_t reserved = 0, allocated = 0, prev_end = 0;
    for (size_t i = 0; i < l.n; i++) {
        cr_assert_geq(l.seg[i].addr, prev_end, "address order");
        prev_end = l.seg[i].addr + l.seg[i].size;
        reserved += l.seg[i].size;
        allocated += l.seg[i].allocated;
    }
    vp_allocator_stats s = stats(a);
    cr_assert_eq(reserved, s.reserved);
    cr_assert_eq(allocated, s.allocated);
    vp_allocator_free(a);
}

Test(allocator, listing_agrees_with_counters)
{
    listing_agrees(NULL, 11);
}

Test(allocator, listing_agrees_with_counters_expandable)
{
    vp_allocator_config cfg = exp_cfg();
    listing_agrees(&cfg, 12);
}
