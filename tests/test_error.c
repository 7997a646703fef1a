/* Tests of error.h: the code table and the error record. */
#include <criterion/criterion.h>
#include <string.h>

#include "vramplan/error.h"

Test(error, strerror_from_the_map)
{
    cr_assert_str_eq(vp_strerror(VP_ENOMEM), "out of memory");
    cr_assert_str_eq(vp_strerror(VP_EOOM), "does not fit in the memory budget");
    cr_assert_str_eq(vp_strerror(VP_OK), "success");
}

Test(error, names_from_the_map)
{
    cr_assert_str_eq(vp_err_name(VP_OK), "VP_OK");
    cr_assert_str_eq(vp_err_name(VP_ESYNTAX), "VP_ESYNTAX");
    cr_assert_str_eq(vp_err_name(VP_ELIMIT), "VP_ELIMIT");
}

Test(error, unknown_code_is_never_null)
{
    cr_assert_str_eq(vp_strerror((vp_status)-1000), "unknown error");
    cr_assert_str_eq(vp_err_name((vp_status)-1000), "VP_EUNKNOWN");
}

Test(error, every_code_has_a_name_and_message)
{
#define CHECK(name, val, msg)                                         \
    cr_assert_str_eq(vp_err_name(VP_E##name), "VP_E" #name);          \
    cr_assert_str_eq(vp_strerror(VP_E##name), msg);
    VP_ERRNO_MAP(CHECK)
#undef CHECK
}

Test(error, clear_resets_everything)
{
    vp_error err;

    memset(&err, 0x5a, sizeof err);
    vp_error_clear(&err);
    cr_assert_eq(err.code, VP_OK);
    cr_assert_str_eq(err.path, "");
    cr_assert_str_eq(err.msg, "");
    cr_assert_eq(err.line + err.col + err.width, 0);
    vp_error_clear(NULL);
}

Test(error, set_formats_and_returns_the_code)
{
    vp_error err;

    memset(&err, 0x5a, sizeof err);
    cr_assert_eq(vp_error_set(&err, VP_ERANGE, "batch %d too big", 7),
                 VP_ERANGE);
    cr_assert_eq(err.code, VP_ERANGE);
    cr_assert_str_eq(err.msg, "batch 7 too big");
    cr_assert_str_eq(err.path, "");
    cr_assert_eq(err.line, 0);
}

Test(error, set_with_null_err_returns_the_code)
{
    cr_assert_eq(vp_error_set(NULL, VP_EIO, "x"), VP_EIO);
    cr_assert_eq(vp_error_at(NULL, VP_EIO, "p", 1, 2, 3, "x"), VP_EIO);
}

Test(error, at_keeps_the_position)
{
    vp_error err;

    vp_error_at(&err, VP_ESCHEMA, "models/x.yaml", 12, 9, 4,
                "unknown dtype '%s'", "bf61");
    cr_assert_eq(err.code, VP_ESCHEMA);
    cr_assert_str_eq(err.path, "models/x.yaml");
    cr_assert_eq(err.line, 12);
    cr_assert_eq(err.col, 9);
    cr_assert_eq(err.width, 4);
    cr_assert_str_eq(err.msg, "unknown dtype 'bf61'");
}

Test(error, long_message_is_truncated)
{
    vp_error err;
    char big[2000];

    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    vp_error_at(&err, VP_EIO, big, 1, 1, 1, "%s", big);
    cr_assert_eq(strlen(err.msg), sizeof err.msg - 1);
    cr_assert_eq(strlen(err.path), sizeof err.path - 1);
}

Test(error, message_may_wrap_the_previous_one)
{
    vp_error err;

    vp_error_at(&err, VP_ESCHEMA, "m.yaml", 3, 4, 1, "bad key");
    vp_error_at(&err, err.code, err.path, err.line, err.col, err.width,
                "in block 'mlp': %s", err.msg);
    cr_assert_str_eq(err.msg, "in block 'mlp': bad key");
    cr_assert_str_eq(err.path, "m.yaml");
}
