/* vramplan: size units (units.h).
 *
 * Parsing is exact: the integer part is accumulated in uint64_t with
 * checked arithmetic, and the fractional part is scaled by the unit with
 * integer long division, so "18446744073.709551615GB" is exactly
 * UINT64_MAX and never goes through a double. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "vramplan/units.h"

/* Longest piece of the input quoted back in a message. */
#define SHOW 64

static const struct unit {
    const char *name;
    uint64_t bytes;
} units[] = {
    {"B", 1},
    {"KB", 1000},
    {"kB", 1000},
    {"MB", 1000 * 1000},
    {"GB", 1000 * 1000 * 1000},
    {"TB", (uint64_t)1000 * 1000 * 1000 * 1000},
    {"KiB", VP_KiB},
    {"MiB", VP_MiB},
    {"GiB", VP_GiB},
    {"TiB", VP_GiB * 1024},
};

#define UNIT_LIST "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static const struct unit *unit_find(const char *name)
{
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(units[i].name, name) == 0)
            return &units[i];
    return NULL;
}

/* floor(0.d1d2...dn * unit) for the n digits at frac. Horner's rule from
 * the last digit: t = floor((d_i * unit + t) / 10), exact because
 * floor((a + x) / 10) == floor((a + floor(x)) / 10) for integer a. t stays
 * below unit (<= 2^40), so d_i * unit + t never overflows. */
static uint64_t frac_scale(const char *frac, size_t n, uint64_t unit)
{
    uint64_t t = 0;

    while (n-- > 0)
        t = ((uint64_t)(frac[n] - '0') * unit + t) / 10;
    return t;
}

vp_status vp_size_parse(const char *text, uint64_t *out, vp_error *err)
{
    const char *p, *digits, *frac = NULL, *space, *rest;
    size_t n_digits, n_frac = 0;
    const struct unit *u;
    uint64_t whole = 0, bytes;

    if (text == NULL || out == NULL)
        return vp_error_set(err, VP_EARG, "vp_size_parse: NULL argument");
    if (*text == '\0')
        return vp_error_set(err, VP_ERANGE, "empty size");
    if (*text == '-')
        return vp_error_set(err, VP_ERANGE,
                            "invalid size '%.*s': sizes cannot be negative",
                            SHOW, text);

    /* Syntax first: digits [. digits] [spaces] [unit]. */
    digits = p = text;
    while (is_digit(*p))
        p++;
    n_digits = (size_t)(p - digits);
    if (n_digits == 0)
        return vp_error_set(err, VP_ERANGE,
                            "invalid size '%.*s': expected a number", SHOW,
                            text);
    if (*p == '.') {
        frac = ++p;
        while (is_digit(*p))
            p++;
        n_frac = (size_t)(p - frac);
        if (n_frac == 0)
            return vp_error_set(err, VP_ERANGE,
                                "invalid size '%.*s': expected digits after "
                                "the decimal point", SHOW, text);
    }
    space = p;
    while (*p == ' ' || *p == '\t')
        p++;
    rest = p;
    if (*rest == '\0') {
        if (rest != space)
            return vp_error_set(err, VP_EUNIT,
                                "invalid size '%.*s': expected a unit after "
                                "the space (" UNIT_LIST ")", SHOW, text);
        u = &units[0];
    } else if ((u = unit_find(rest)) == NULL) {
        if (!is_alpha(*rest))
            return vp_error_set(err, VP_ERANGE,
                                "invalid size '%.*s': not a number", SHOW,
                                text);
        return vp_error_set(err, VP_EUNIT,
                            "invalid size '%.*s': unknown unit '%.*s' "
                            "(expected " UNIT_LIST ")", SHOW, text, SHOW,
                            rest);
    }

    /* "1.5" alone is a byte and a half: refused, not taken as 1 B */
    for (size_t i = 0; u->bytes == 1 && i < n_frac; i++)
        if (frac[i] != '0')
            return vp_error_set(err, VP_ERANGE,
                                "invalid size '%.*s': a fraction of a byte "
                                "(give a unit, e.g. '%.*sGiB')",
                                SHOW, text, (int)(space - text), text);

    /* Then the value: whole * unit + floor(fraction * unit). */
    for (size_t i = 0; i < n_digits; i++)
        if (!vp_mul_u64(whole, 10, &whole) ||
            !vp_add_u64(whole, (uint64_t)(digits[i] - '0'), &whole))
            goto overflow;
    if (!vp_mul_u64(whole, u->bytes, &bytes) ||
        !vp_add_u64(bytes, frac_scale(frac, n_frac, u->bytes), &bytes))
        goto overflow;
    *out = bytes;
    return VP_OK;

overflow:
    return vp_error_set(err, VP_EOVERFLOW,
                        "invalid size '%.*s': more than 2^64-1 bytes", SHOW,
                        text);
}

char *vp_size_format(uint64_t bytes, char *buf, size_t n)
{
    static const char *const names[] = {"B",   "KiB", "MiB", "GiB",
                                        "TiB", "PiB", "EiB"};
    const size_t last = sizeof names / sizeof names[0] - 1;
    uint64_t unit = 1, whole, rem;
    unsigned hundredths;
    size_t k = 0;

    if (buf == NULL || n == 0)
        return buf;
    while (k < last && bytes / unit >= 1024) {
        unit *= 1024;
        k++;
    }
    if (k == 0) {
        snprintf(buf, n, "%" PRIu64 " B", bytes);
        return buf;
    }

    /* Two decimals by long division (rem * 10 < 2^64 since unit <= 2^60),
     * rounded half up; 1023.999 KiB becomes 1.00 MiB. */
    whole = bytes / unit;
    rem = bytes % unit;
    hundredths = (unsigned)(rem * 10 / unit) * 10;
    rem = rem * 10 % unit;
    hundredths += (unsigned)(rem * 10 / unit);
    rem = rem * 10 % unit;
    if (rem >= unit - rem)
        hundredths++;
    if (hundredths == 100) {
        hundredths = 0;
        whole++;
        if (whole == 1024 && k < last) {
            whole = 1;
            k++;
        }
    }
    snprintf(buf, n, "%" PRIu64 ".%02u %s", whole, hundredths, names[k]);
    return buf;
}
