/* A map from 64-bit keys to 64-bit values (internal.h): open addressing
 * with linear probing; deletion shifts the entries of the probe run back,
 * so no tombstones build up. Key 0 marks an empty slot. */
#include <stdlib.h>

#include "hashmap.h"
#include "util.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static bool grow(vp__map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    if (cap > SIZE_MAX / sizeof(uint64_t))
        return false;
    uint64_t *k = calloc(cap, sizeof *k), *v = calloc(cap, sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i])
            continue;
        size_t j = mix(m->key[i]) & (cap - 1);
        while (k[j])
            j = (j + 1) & (cap - 1);
        k[j] = m->key[i];
        v[j] = m->val[i];
    }
    free(m->key);
    free(m->val);
    m->key = k;
    m->val = v;
    m->cap = cap;
    return true;
}

/* The slot of key, or the empty slot where it would go. */
static size_t slot(const vp__map *m, uint64_t key)
{
    size_t j = mix(key) & (m->cap - 1);
    while (m->key[j] && m->key[j] != key)
        j = (j + 1) & (m->cap - 1);
    return j;
}

bool vp__map_put(vp__map *m, uint64_t key, uint64_t val)
{
    VP_ASSERT(key != 0);
    if ((m->n + 1) * 4 > m->cap * 3 && !grow(m))
        return false;
    size_t j = slot(m, key);
    if (!m->key[j]) {
        m->key[j] = key;
        m->n++;
    }
    m->val[j] = val;
    return true;
}

uint64_t vp__map_get(const vp__map *m, uint64_t key)
{
    if (!m->cap || key == 0)
        return 0;
    size_t j = slot(m, key);
    return m->key[j] ? m->val[j] : 0;
}

void vp__map_del(vp__map *m, uint64_t key)
{
    if (!m->cap || key == 0)
        return;
    size_t j = slot(m, key), mask = m->cap - 1;
    if (!m->key[j])
        return;
    m->key[j] = 0;
    m->n--;
    for (size_t i = (j + 1) & mask; m->key[i]; i = (i + 1) & mask) {
        size_t home = mix(m->key[i]) & mask;
        /* the entry at i may move to the hole at j unless its home lies
         * in the cyclic range (j, i] */
        bool stays = j <= i ? (home > j && home <= i) : (home > j || home <= i);
        if (!stays) {
            m->key[j] = m->key[i];
            m->val[j] = m->val[i];
            m->key[i] = 0;
            j = i;
        }
    }
}

void vp__map_free(vp__map *m)
{
    free(m->key);
    free(m->val);
    m->key = m->val = NULL;
    m->cap = m->n = 0;
}
