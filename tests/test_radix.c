/* vp__radix_pairs (src/util.c), the sort behind the steady state's
 * listings (the allocator's segments, the live tensors nothing names):
 * a stable sort of (key, value) pairs by key, whatever the number of
 * pairs and the bits in which the keys differ (the digits' width and the
 * number of passes follow both). Checked against qsort of the same pairs
 * with their first position as the tie break. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/util.h"

/* (key, position) triples for the reference order. */
static int ref_cmp(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    if (a[0] != b[0])
        return a[0] < b[0] ? -1 : 1;
    return a[2] < b[2] ? -1 : a[2] > b[2];
}

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* n pairs whose keys are base + (random bits of `span` bits from bit
 * `low`), values their positions; sorted, and compared with the
 * reference. */
static void check(size_t n, unsigned low, unsigned span, uint64_t seed)
{
    uint64_t *v = malloc((n ? n : 1) * 4 * sizeof *v);
    uint64_t *r = malloc((n ? n : 1) * 3 * sizeof *r);
    cr_assert(v && r);
    uint64_t mask = span >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << span) - 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = 0x7f0000000000ull + ((next_rand(&seed) & mask) << low);
        v[2 * i] = k;
        v[2 * i + 1] = i;
        r[3 * i] = k;
        r[3 * i + 1] = i;
        r[3 * i + 2] = i;
    }
    const uint64_t *q = vp__radix_pairs(v, v + 2 * n, n);
    cr_assert_not_null(q);
    qsort(r, n, 3 * sizeof *r, ref_cmp);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(q[2 * i], r[3 * i], "n %zu span %u: key %zu", n, span,
                     i);
        cr_assert_eq(q[2 * i + 1], r[3 * i + 1],
                     "n %zu span %u: value %zu (stability)", n, span, i);
    }
    free(v);
    free(r);
}

Test(radix, sorts_stably_for_every_count_and_key_width)
{
    static const size_t ns[] = {0, 1, 2, 3, 100, 1023, 1024, 3000, 5000};
    static const unsigned spans[] = {1, 3, 8, 9, 11, 12, 22, 29, 33, 55};
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof spans / sizeof spans[0]; b++)
            check(ns[a], 9, spans[b], next_rand(&seed));
}

Test(radix, keys_of_all_64_bits)
{
    uint64_t seed = 12345;
    check(2000, 0, 64, seed);
    check(300, 0, 64, seed);
}

Test(radix, equal_keys_keep_their_order)
{
    /* span 1: two distinct keys, many of each */
    check(4096, 9, 1, 99);
    check(500, 20, 1, 7);
}
