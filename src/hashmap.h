/* A map of 64-bit keys to 64-bit values (hashmap.c). Not installed. */
#ifndef VRAMPLAN_HASHMAP_H
#define VRAMPLAN_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Zero-initialise; key 0 is reserved (never stored); vp__map_get returns 0
 * for an absent key, so store value + 1 when 0 is a value. */
typedef struct vp__map {
    uint64_t *key, *val;
    size_t cap, n; /* cap: 0 or a power of two */
} vp__map;
bool vp__map_put(vp__map *m, uint64_t key, uint64_t val); /* false: OOM */
uint64_t vp__map_get(const vp__map *m, uint64_t key);
void vp__map_del(vp__map *m, uint64_t key);
void vp__map_free(vp__map *m);

#endif
