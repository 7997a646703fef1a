/* libFuzzer harness: a lengths file (batching, serve --lengths). */
#include <stddef.h>
#include <stdint.h>

#include "vramplan/batching.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vp_error err;
    vp_lengths l;

    if (vp_lengths_parse((const char *)data, size, "fuzz.txt", &l, &err) ==
        VP_OK)
        vp_lengths_destroy(&l);
    return 0;
}
