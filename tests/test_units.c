/* Tests of units.h: size parsing and formatting, checked arithmetic. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "vramplan/units.h"

/* Parse text that must be valid and return the byte count. */
static uint64_t parse_ok(const char *text)
{
    uint64_t v = 0;
    vp_error err;
    vp_status st = vp_size_parse(text, &v, &err);

    cr_assert_eq(st, VP_OK, "'%s': %s (%s)", text, vp_err_name(st), err.msg);
    return v;
}

/* Parse text that must be rejected with `want`; *out must stay untouched. */
static void parse_bad(const char *text, vp_status want)
{
    uint64_t v = 42;
    vp_error err;
    vp_status st = vp_size_parse(text, &v, &err);

    cr_assert_eq(st, want, "'%s': got %s, want %s", text, vp_err_name(st),
                 vp_err_name(want));
    cr_assert_eq(err.code, want);
    cr_assert_neq(err.msg[0], '\0', "'%s': no message", text);
    cr_assert_eq(v, 42, "'%s': *out changed on error", text);
}

/* --- units ---------------------------------------------------------- */

Test(size_parse, no_unit_is_bytes) { cr_assert_eq(parse_ok("512"), 512); }
Test(size_parse, zero) { cr_assert_eq(parse_ok("0"), 0); }
Test(size_parse, bytes_B) { cr_assert_eq(parse_ok("512B"), 512); }
Test(size_parse, kilo_KB) { cr_assert_eq(parse_ok("3KB"), 3000); }
Test(size_parse, kilo_kB) { cr_assert_eq(parse_ok("3kB"), 3000); }
Test(size_parse, mega_MB) { cr_assert_eq(parse_ok("5MB"), 5000000); }
Test(size_parse, giga_GB) { cr_assert_eq(parse_ok("24GB"), 24000000000ull); }
Test(size_parse, tera_TB)
{
    cr_assert_eq(parse_ok("2TB"), 2000000000000ull);
}
Test(size_parse, kibi_KiB) { cr_assert_eq(parse_ok("3KiB"), 3072); }
Test(size_parse, mebi_MiB) { cr_assert_eq(parse_ok("5MiB"), 5ull << 20); }
Test(size_parse, gibi_GiB) { cr_assert_eq(parse_ok("24GiB"), 24ull << 30); }
Test(size_parse, tebi_TiB) { cr_assert_eq(parse_ok("2TiB"), 2ull << 40); }

/* --- spaces --------------------------------------------------------- */

Test(size_parse, space_before_unit)
{
    cr_assert_eq(parse_ok("24 GiB"), 24ull << 30);
}
Test(size_parse, spaces_and_tab_before_unit)
{
    cr_assert_eq(parse_ok("24 \t GiB"), 24ull << 30);
}
Test(size_parse, rejects_leading_space) { parse_bad(" 24GiB", VP_ERANGE); }
Test(size_parse, rejects_trailing_space) { parse_bad("24GiB ", VP_EUNIT); }
Test(size_parse, rejects_space_without_unit) { parse_bad("512 ", VP_EUNIT); }

/* --- decimals ------------------------------------------------------- */

Test(size_parse, decimal_GB)
{
    cr_assert_eq(parse_ok("1.5GB"), 1500000000ull);
}
Test(size_parse, decimal_GiB)
{
    cr_assert_eq(parse_ok("1.5GiB"), 3ull << 29);
}
Test(size_parse, decimal_rounds_down)
{
    cr_assert_eq(parse_ok("0.1KiB"), 102); /* 102.4 */
}
/* A fraction of a byte is refused, not rounded down (issue 18: --budget
 * 1.5 was taken as 1 byte); a whole number of bytes written with a
 * fraction of zeros is fine. */
Test(size_parse, a_fraction_of_a_byte_is_refused)
{
    vp_error err;
    uint64_t v;
    cr_assert_eq(vp_size_parse("1.9", &v, &err), VP_ERANGE);
    cr_assert_str_eq(err.msg, "invalid size '1.9': a fraction of a byte "
                              "(give a unit, e.g. '1.9GiB')");
    cr_assert_eq(vp_size_parse("1.5B", &v, &err), VP_ERANGE);
    cr_assert_eq(parse_ok("3.000"), 3);
}
Test(size_parse, decimal_many_digits)
{
    /* 1/3 KiB = 341.33 B; the digits past double precision still count. */
    cr_assert_eq(parse_ok("0.333333333333333333333333333KiB"), 341);
    cr_assert_eq(parse_ok("0.99999999999999999999999999TiB"),
                 (1ull << 40) - 1);
}
Test(size_parse, decimal_exact_at_every_digit)
{
    /* 0.000000001 GB is exactly one byte; a double would give 0.99999. */
    cr_assert_eq(parse_ok("0.000000001GB"), 1);
    cr_assert_eq(parse_ok("1.000000001GB"), 1000000001ull);
}
Test(size_parse, decimal_trailing_zeros) { cr_assert_eq(parse_ok("2.50MB"), 2500000); }

/* --- large values --------------------------------------------------- */

Test(size_parse, integer_beyond_double_precision)
{
    cr_assert_eq(parse_ok("9007199254740993"), 9007199254740993ull);
}
Test(size_parse, max_u64) { cr_assert_eq(parse_ok("18446744073709551615"), UINT64_MAX); }
Test(size_parse, max_u64_with_fraction)
{
    cr_assert_eq(parse_ok("18446744073709551615.0B"), UINT64_MAX);
}
Test(size_parse, max_u64_as_decimal_GB)
{
    cr_assert_eq(parse_ok("18446744073.709551615GB"), UINT64_MAX);
}
Test(size_parse, leading_zeros)
{
    cr_assert_eq(parse_ok("000000000000000000000000000001KiB"), 1024);
}

/* --- overflow ------------------------------------------------------- */

Test(size_parse, overflow_integer)
{
    parse_bad("18446744073709551616", VP_EOVERFLOW);
}
Test(size_parse, overflow_long_integer)
{
    parse_bad("123456789012345678901234567890", VP_EOVERFLOW);
}
Test(size_parse, overflow_by_unit) { parse_bad("16777216TiB", VP_EOVERFLOW); }
Test(size_parse, overflow_by_fraction)
{
    /* 18446744073.709551616 GB is 2^64 bytes exactly. */
    parse_bad("18446744073.709551616GB", VP_EOVERFLOW);
}
Test(size_parse, overflow_just_below_is_fine)
{
    cr_assert_eq(parse_ok("16777215.999999TiB"),
                 16777215ull * (1ull << 40) + 1099510528264ull);
}

/* --- bad input ------------------------------------------------------ */

Test(size_parse, rejects_empty) { parse_bad("", VP_ERANGE); }
Test(size_parse, rejects_negative) { parse_bad("-1GB", VP_ERANGE); }
Test(size_parse, rejects_plus_sign) { parse_bad("+1GB", VP_ERANGE); }
Test(size_parse, rejects_unit_alone) { parse_bad("GB", VP_ERANGE); }
Test(size_parse, rejects_unknown_unit) { parse_bad("1XB", VP_EUNIT); }
Test(size_parse, rejects_lowercase_unit) { parse_bad("1gib", VP_EUNIT); }
Test(size_parse, rejects_lowercase_kb) { parse_bad("1kb", VP_EUNIT); }
Test(size_parse, rejects_short_unit) { parse_bad("1G", VP_EUNIT); }
Test(size_parse, rejects_two_points) { parse_bad("1.2.3GB", VP_ERANGE); }
Test(size_parse, rejects_point_without_digits) { parse_bad("1.GB", VP_ERANGE); }
Test(size_parse, rejects_point_first) { parse_bad(".5GB", VP_ERANGE); }
Test(size_parse, rejects_comma) { parse_bad("1,5GB", VP_ERANGE); }
Test(size_parse, rejects_nan) { parse_bad("nan", VP_ERANGE); }
Test(size_parse, rejects_inf) { parse_bad("inf", VP_ERANGE); }
Test(size_parse, rejects_exponent) { parse_bad("1e9", VP_EUNIT); }
Test(size_parse, rejects_hex) { parse_bad("0x10", VP_EUNIT); }
Test(size_parse, rejects_trailing_junk) { parse_bad("24GiBx", VP_EUNIT); }
Test(size_parse, rejects_number_after_unit) { parse_bad("24GiB5", VP_EUNIT); }
Test(size_parse, rejects_second_number) { parse_bad("1 2", VP_ERANGE); }

Test(size_parse, null_text_is_an_argument_error)
{
    uint64_t v;

    cr_assert_eq(vp_size_parse(NULL, &v, NULL), VP_EARG);
}

Test(size_parse, null_err_is_allowed)
{
    uint64_t v = 7;

    cr_assert_eq(vp_size_parse("1XB", &v, NULL), VP_EUNIT);
    cr_assert_eq(v, 7);
}

Test(size_parse, message_quotes_input_and_unit)
{
    uint64_t v;
    vp_error err;

    vp_size_parse("24XB", &v, &err);
    cr_assert_str_eq(err.msg, "invalid size '24XB': unknown unit 'XB' "
                              "(expected B, KB, MB, GB, TB, KiB, MiB, GiB "
                              "or TiB)");
    cr_assert_eq(err.path[0], '\0');
    cr_assert_eq(err.line, 0);
}

/* --- formatting ----------------------------------------------------- */

static const char *fmt(uint64_t bytes)
{
    static char buf[32];

    return vp_size_format(bytes, buf, sizeof buf);
}

Test(size_format, zero) { cr_assert_str_eq(fmt(0), "0 B"); }
Test(size_format, bytes) { cr_assert_str_eq(fmt(512), "512 B"); }
Test(size_format, below_one_kib) { cr_assert_str_eq(fmt(1023), "1023 B"); }
Test(size_format, one_kib) { cr_assert_str_eq(fmt(1024), "1.00 KiB"); }
Test(size_format, one_and_a_half_kib) { cr_assert_str_eq(fmt(1536), "1.50 KiB"); }
Test(size_format, gib_two_decimals)
{
    cr_assert_str_eq(fmt(14463302369ull), "13.47 GiB"); /* 13.47 x 2^30 */
}
Test(size_format, rounds_to_nearest)
{
    cr_assert_str_eq(fmt(1024 + 5 * 1024 / 1000 + 1), "1.01 KiB");
    cr_assert_str_eq(fmt(1029), "1.00 KiB"); /* 1.0048 */
}
Test(size_format, rounding_carries_into_next_unit)
{
    cr_assert_str_eq(fmt((1ull << 20) - 1), "1.00 MiB");
}
Test(size_format, tib) { cr_assert_str_eq(fmt(3ull << 40), "3.00 TiB"); }
Test(size_format, max_u64) { cr_assert_str_eq(fmt(UINT64_MAX), "16.00 EiB"); }

Test(size_format, returns_buf_and_truncates)
{
    char buf[4];

    cr_assert_eq(vp_size_format(1536, buf, sizeof buf), buf);
    cr_assert_str_eq(buf, "1.5");
}

Test(size_format, zero_size_buffer_is_untouched)
{
    char buf[4] = "abc";

    vp_size_format(1536, buf, 0);
    cr_assert_str_eq(buf, "abc");
}

/* --- checked arithmetic --------------------------------------------- */

Test(checked, add_ok)
{
    uint64_t r = 0;

    cr_assert(vp_add_u64(UINT64_MAX - 1, 1, &r));
    cr_assert_eq(r, UINT64_MAX);
}

Test(checked, add_overflow_leaves_out)
{
    uint64_t r = 5;

    cr_assert_not(vp_add_u64(UINT64_MAX, 1, &r));
    cr_assert_eq(r, 5);
}

Test(checked, mul_ok)
{
    uint64_t r = 0;

    cr_assert(vp_mul_u64(1ull << 32, (1ull << 32) - 1, &r));
    cr_assert_eq(r, (1ull << 32) * ((1ull << 32) - 1));
}

Test(checked, mul_by_zero)
{
    uint64_t r = 5;

    cr_assert(vp_mul_u64(0, UINT64_MAX, &r));
    cr_assert_eq(r, 0);
    cr_assert(vp_mul_u64(UINT64_MAX, 0, &r));
    cr_assert_eq(r, 0);
}

Test(checked, mul_overflow_leaves_out)
{
    uint64_t r = 5;

    cr_assert_not(vp_mul_u64(1ull << 32, 1ull << 32, &r));
    cr_assert_eq(r, 5);
}

/* vp_mul_u64's overflow flag (a builtin where the compiler has one) says
 * what the division test says: a * b fits in 64 bits iff a == 0 or
 * b <= UINT64_MAX / a; on edge pairs and pairs of every pair of bit
 * lengths. */
Test(checked, mul_flag_is_the_division_test)
{
    static const uint64_t edge[] = {0, 1, 2, 3, 0xffffffffull,
                                    0x100000000ull, 0x100000001ull,
                                    UINT64_MAX / 3, UINT64_MAX / 3 + 1,
                                    UINT64_MAX / 2, UINT64_MAX / 2 + 1,
                                    UINT64_MAX - 1, UINT64_MAX};
    size_t ne = sizeof edge / sizeof edge[0];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t fits = 0, overflows = 0;
    for (size_t k = 0; k < ne * ne + 64 * 64 * 4; k++) {
        uint64_t a, b;
        if (k < ne * ne) {
            a = edge[k / ne];
            b = edge[k % ne];
        } else {
            size_t j = k - ne * ne; /* bit lengths (j / 4) % 64 and j / 256 */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            a = (x >> (63 - (j / 4) % 64)) | ((uint64_t)1 << ((j / 4) % 64)) >> 1;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b = x >> (63 - j / 256 % 64);
        }
        bool want = a == 0 || b <= UINT64_MAX / a;
        uint64_t r = 7;
        cr_assert_eq(vp_mul_u64(a, b, &r), want, "%llu * %llu",
                     (unsigned long long)a, (unsigned long long)b);
        cr_assert_eq(r, want ? a * b : 7, "%llu * %llu: out",
                     (unsigned long long)a, (unsigned long long)b);
        fits += want;
        overflows += !want;
    }
    /* both answers many times */
    cr_assert_gt(fits, 1000);
    cr_assert_gt(overflows, 1000);
}

Test(checked, round_up)
{
    uint64_t r = 0;

    cr_assert(vp_round_up_u64(1, 512, &r));
    cr_assert_eq(r, 512);
    cr_assert(vp_round_up_u64(1024, 512, &r));
    cr_assert_eq(r, 1024);
    cr_assert(vp_round_up_u64(0, 512, &r));
    cr_assert_eq(r, 0);
}

Test(checked, round_up_overflow)
{
    uint64_t r = 5;

    cr_assert_not(vp_round_up_u64(UINT64_MAX, 512, &r));
    cr_assert_eq(r, 5);
}
