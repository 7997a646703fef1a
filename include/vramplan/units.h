/* vramplan: checked byte arithmetic and size units.
 *
 * Byte counts are uint64_t everywhere. Every multiply and add on them goes
 * through these helpers, which report overflow instead of wrapping. */
#ifndef VRAMPLAN_UNITS_H
#define VRAMPLAN_UNITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

#define VP_KiB ((uint64_t)1024)
#define VP_MiB ((uint64_t)1024 * 1024)
#define VP_GiB ((uint64_t)1024 * 1024 * 1024)

/* a + b into *out; false (and *out untouched) on overflow. */
static inline bool vp_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b)
        return false;
    *out = a + b;
    return true;
}

/* a * b into *out; false (and *out untouched) on overflow. */
static inline bool vp_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
#if defined(__GNUC__)
    /* the overflow flag of one multiply: the test by division below costs
     * a 64-bit divide, and the simulator sizes nearly every tensor here */
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
#else
    if (a != 0 && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
#endif
}

/* ceil(a / m) * m into *out (m > 0); false on overflow. */
static inline bool vp_round_up_u64(uint64_t a, uint64_t m, uint64_t *out)
{
    uint64_t q = a / m + (a % m != 0);
    return vp_mul_u64(q, m, out);
}

/* Parse a size: a non-negative number (integer or decimal) followed by an
 * optional unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB
 * (powers of 1024); no unit means bytes. Case of the unit letters is as
 * written here, except that "kB" is accepted for KB. Spaces between number and
 * unit are allowed. The result is rounded down to a whole byte.
 * Returns VP_OK, VP_EUNIT (unknown unit), VP_ERANGE (negative, empty or not
 * a number) or VP_EOVERFLOW (more than 2^64-1 bytes). */
vp_status vp_size_parse(const char *text, uint64_t *out, vp_error *err);

/* Format bytes for people: "512 B", "1.50 KiB", "13.47 GiB" (binary units,
 * two decimals). Writes at most n bytes including the NUL; returns buf. */
char *vp_size_format(uint64_t bytes, char *buf, size_t n);

#endif
