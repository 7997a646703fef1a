/* libFuzzer harness: a GPU profile (YAML). */
#include <stddef.h>
#include <stdint.h>

#include "vramplan/vramplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vp_error err;
    vp_gpu_profile *p = vp_gpu_parse_buf((const char *)data, size,
                                         "fuzz.yaml", &err);
    vp_gpu_free(p);
    return 0;
}
