/* A fake libnvidia-ml for the tests of `vramplan watch` (src/watch.c): the
 * few NVML calls watch makes, with the memory in use read from a file that
 * the watched test command writes, so a test decides what the "GPU" holds
 * and when. Built as build/tests/libfake_nvml.so; watch loads it through
 * VRAMPLAN_NVML_LIB.
 *
 * Environment:
 *   FAKE_NVML_DEVICES    number of GPUs (default 1, at most 8)
 *   FAKE_NVML_TOTAL      bytes per GPU (default 85899345920, 80 GiB)
 *   FAKE_NVML_USED_FILE  a file of used bytes, one number per GPU, read on
 *                        every query; missing or empty: FAKE_NVML_BASE
 *   FAKE_NVML_BASE       used bytes before the file exists (default 0)
 *   FAKE_NVML_FAIL       "init" makes nvmlInit_v2 fail (no driver)
 *
 * Signatures as in nvml.h (NVML API version 12). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_INSUFFICIENT_SIZE = 7
};

typedef struct fake_device {
    unsigned index;
} *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

#define MAX_DEVICES 8

static struct fake_device devices[MAX_DEVICES];
static int initialized;

static unsigned long long env_u64(const char *name, unsigned long long def)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return def;
    unsigned long long x = strtoull(v, &end, 10);
    return *end == '\0' ? x : def;
}

static unsigned device_count(void)
{
    unsigned long long n = env_u64("FAKE_NVML_DEVICES", 1);
    return n > MAX_DEVICES ? MAX_DEVICES : (unsigned)n;
}

/* Used bytes of GPU i: the i-th number of the file, else the base. */
static unsigned long long used_bytes(unsigned i)
{
    unsigned long long used = env_u64("FAKE_NVML_BASE", 0);
    const char *path = getenv("FAKE_NVML_USED_FILE");
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    if (f == NULL)
        return used;
    unsigned long long x;
    for (unsigned k = 0; k <= i && fscanf(f, "%llu", &x) == 1; k++)
        if (k == i)
            used = x;
    fclose(f);
    return used;
}

nvmlReturn_t nvmlInit_v2(void)
{
    const char *fail = getenv("FAKE_NVML_FAIL");
    if (fail != NULL && strcmp(fail, "init") == 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned i = 0; i < MAX_DEVICES; i++)
        devices[i].index = i;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    default:
        return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                           nvmlDevice_t *device)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name,
                               unsigned int length)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || name == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    int n = snprintf(name, length, "Fake GPU %u", device->index);
    return n < 0 || (unsigned)n >= length ? NVML_ERROR_INSUFFICIENT_SIZE
                                          : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                     nvmlMemory_t *memory)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = env_u64("FAKE_NVML_TOTAL", 85899345920ull);
    memory->used = used_bytes(device->index);
    if (memory->used > memory->total)
        memory->used = memory->total;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
