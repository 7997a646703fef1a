/* JSON output of every command, through jansson: one string escaper (and
 * valid UTF-8), reals rounded as the text output prints them, and one
 * place that notices an allocation failure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Reals are rounded by cli_jreal to the digits the command means, so 15
 * significant digits (DBL_DIG) print them exactly and briefly. */
#define REAL_DIGITS 15

static bool oom; /* an allocation failed while building a document */

/* The length of the valid UTF-8 sequence at s (n bytes left), 0 if the
 * bytes there are not one (RFC 3629: no overlongs, surrogates, or code
 * points past U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2
                 : s[0] >= 0xE0 && s[0] <= 0xEF               ? 3
                 : s[0] >= 0xF0 && s[0] <= 0xF4               ? 4
                                                              : 0;
    unsigned char lo = 0x80, hi = 0xBF;

    if (len == 0 || len > n)
        return 0;
    if (s[0] == 0xE0)
        lo = 0xA0;
    else if (s[0] == 0xED)
        hi = 0x9F;
    else if (s[0] == 0xF0)
        lo = 0x90;
    else if (s[0] == 0xF4)
        hi = 0x8F;
    for (size_t i = 1; i < len; i++) {
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF))
            return 0;
    }
    return len;
}

json_t *cli_jstr(const char *s, size_t max)
{
    size_t n = 0, o = 0;
    char *buf;
    json_t *j;

    while (n < max && s[n] != '\0')
        n++;
    buf = malloc(3 * n + 1); /* each bad byte becomes 3 (U+FFFD) */
    if (buf == NULL) {
        oom = true;
        return NULL;
    }
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k == 0) {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        }
    }
    j = json_stringn(buf, o);
    free(buf);
    oom |= j == NULL;
    return j;
}

json_t *cli_ju64(uint64_t v)
{
    json_t *j = v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v)
                                         : json_real((double)v);

    oom |= j == NULL;
    return j;
}

json_t *cli_jreal(double v, const char *fmt)
{
    char text[64];
    json_t *j;

    if (!isfinite(v)) {
        j = json_null();
    } else {
        snprintf(text, sizeof text, fmt, v);
        j = json_real(strtod(text, NULL));
    }
    oom |= j == NULL;
    return j;
}

void cli_jset(json_t *obj, const char *key, json_t *v)
{
    if (obj == NULL || v == NULL || json_object_set_new(obj, key, v) != 0)
        oom = true;
}

void cli_jpush(json_t *arr, json_t *v)
{
    if (arr == NULL || v == NULL || json_array_append_new(arr, v) != 0)
        oom = true;
}

int cli_jprint(FILE *f, json_t *v, bool indent)
{
    size_t flags = JSON_REAL_PRECISION(REAL_DIGITS) |
                   (indent ? JSON_INDENT(2) : 0);
    int rc = CLI_OK;

    if (v == NULL || oom || json_dumpf(v, f, flags) != 0)
        rc = cli_fail("out of memory writing the JSON output");
    else
        fputc('\n', f);
    json_decref(v);
    return rc;
}
