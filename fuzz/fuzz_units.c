/* libFuzzer harness: size and unit strings (vp_size_parse) and error
 * bound specs (vp_error_bounds_parse), NUL-terminated copies. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    vp_error err;
    uint64_t v;
    (void)vp_size_parse(s, &v, &err);
    vp_error_bound b[VP_MG__COUNT];
    (void)vp_error_bounds_parse(s, b, &err);
    free(s);
    return 0;
}
