/* Tests of the 64-bit key map (src/hashmap.c) that the snapshot and the
 * HTML page use to follow allocations by handle. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>

#include "../src/hashmap.h"

Test(hashmap, put_get_overwrite_and_absent)
{
    vp__map m = {0};
    cr_assert_eq(vp__map_get(&m, 5), 0, "empty map");
    cr_assert(vp__map_put(&m, 5, 50));
    cr_assert(vp__map_put(&m, 6, 60));
    cr_assert(vp__map_put(&m, 5, 55));
    cr_assert_eq(vp__map_get(&m, 5), 55);
    cr_assert_eq(vp__map_get(&m, 6), 60);
    cr_assert_eq(vp__map_get(&m, 7), 0);
    cr_assert_eq(m.n, 2);
    vp__map_free(&m);
}

/* Random puts and deletes against a plain array: deletion must keep every
 * other key reachable (the probe runs are shifted back, not broken). */
Test(hashmap, random_work_matches_an_array)
{
    enum { KEYS = 3000 };
    static uint64_t ref[KEYS + 1];
    vp__map m = {0};
    uint64_t s = 42;
    for (int op = 0; op < 60000; op++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = (s >> 33) % KEYS + 1;
        if ((s >> 20) % 3 == 0) {
            vp__map_del(&m, k);
            ref[k] = 0;
        } else {
            cr_assert(vp__map_put(&m, k, op + 1));
            ref[k] = (uint64_t)op + 1;
        }
    }
    size_t live = 0;
    for (uint64_t k = 1; k <= KEYS; k++) {
        cr_assert_eq(vp__map_get(&m, k), ref[k], "key %llu",
                     (unsigned long long)k);
        live += ref[k] != 0;
    }
    cr_assert_eq(m.n, live);
    vp__map_free(&m);
}
