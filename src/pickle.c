/* A writer of Python pickles (protocol 2), for the memory snapshot
 * (snapshot.c). It uses only the opcodes that both Python's unpickler and
 * the JavaScript unpickler of PyTorch's memory viewer read
 * (torch/utils/viz/MemoryViz.js, unpickle(): PROTO 2..4, EMPTY_DICT,
 * EMPTY_LIST, MARK, SETITEMS, APPENDS, TUPLE2, BINUNICODE, BININT1,
 * BININT2, BININT, LONG1, NEWTRUE, NEWFALSE, NONE, BINFLOAT, BINPUT,
 * LONG_BINPUT, BINGET, LONG_BINGET, STOP). Containers are filled in
 * batches of 1000 items, as Python's pickler does (a JavaScript spread of
 * a whole long list could pass the engine's argument limit). */
#include <string.h>

#include "pickle.h"
#include "util.h"

enum {
    OP_PROTO = 0x80,
    OP_STOP = '.',
    OP_MARK = '(',
    OP_EMPTY_DICT = '}',
    OP_EMPTY_LIST = ']',
    OP_SETITEMS = 'u',
    OP_APPENDS = 'e',
    OP_TUPLE2 = 0x86,
    OP_BINUNICODE = 'X',
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_BININT = 'J',
    OP_LONG1 = 0x8a,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_NONE = 'N',
    OP_BINFLOAT = 'G',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_BINGET = 'h',
    OP_LONG_BINGET = 'j'
};

#define BATCH 1000

static void put(vp__pk *w, int byte)
{
    if (fputc(byte, w->f) == EOF)
        w->bad = true;
}

static void put_u32(vp__pk *w, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        put(w, (int)((v >> (8 * i)) & 0xff));
}

void vp__pk_begin(vp__pk *w, FILE *f)
{
    memset(w, 0, sizeof *w);
    w->f = f;
    put(w, OP_PROTO);
    put(w, 2);
}

bool vp__pk_end(vp__pk *w)
{
    VP_ASSERT(w->depth == 0);
    put(w, OP_STOP);
    return !w->bad && !ferror(w->f);
}

void vp__pk_int(vp__pk *w, int64_t v)
{
    if (v >= 0 && v < 256) {
        put(w, OP_BININT1);
        put(w, (int)v);
    } else if (v >= 0 && v < 65536) {
        put(w, OP_BININT2);
        put(w, (int)(v & 0xff));
        put(w, (int)(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put(w, OP_BININT);
        put_u32(w, (uint32_t)(int32_t)v);
    } else {
        /* LONG1: little-endian two's complement, 8 bytes */
        put(w, OP_LONG1);
        put(w, 8);
        uint64_t u = (uint64_t)v;
        for (int i = 0; i < 8; i++)
            put(w, (int)((u >> (8 * i)) & 0xff));
    }
}

void vp__pk_uint(vp__pk *w, uint64_t v)
{
    if (v <= INT64_MAX) {
        vp__pk_int(w, (int64_t)v);
        return;
    }
    /* nine bytes, so that the top bit stays a value bit */
    put(w, OP_LONG1);
    put(w, 9);
    for (int i = 0; i < 8; i++)
        put(w, (int)((v >> (8 * i)) & 0xff));
    put(w, 0);
}

void vp__pk_bool(vp__pk *w, bool v)
{
    put(w, v ? OP_NEWTRUE : OP_NEWFALSE);
}

void vp__pk_none(vp__pk *w)
{
    put(w, OP_NONE);
}

void vp__pk_float(vp__pk *w, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put(w, OP_BINFLOAT);
    for (int i = 7; i >= 0; i--) /* big-endian */
        put(w, (int)((u >> (8 * i)) & 0xff));
}

/* Length of a valid UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2
                               : (s[0] & 0xf0) == 0xe0   ? 3
                               : (s[0] & 0xf8) == 0xf0   ? 4
                                                         : 0;
    if (len == 0 || len > n || (len == 2 && s[0] < 0xc2))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    /* overlong forms, surrogates and code points past U+10FFFF */
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || s[0] > 0xf4 ||
        (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

void vp__pk_str(vp__pk *w, const char *s)
{
    /* invalid UTF-8 bytes (a name from a file in another encoding) become
     * '?', so that both unpicklers decode the string */
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    put(w, OP_BINUNICODE);
    put_u32(w, (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n));
    for (size_t i = 0; i < n && i < UINT32_MAX;) {
        size_t len = utf8_len(u + i, n - i);
        if (len == 0) {
            put(w, '?');
            i++;
            continue;
        }
        for (size_t k = 0; k < len; k++)
            put(w, u[i + k]);
        i += len;
    }
}

static void open_container(vp__pk *w, int empty_op, int batch_op)
{
    VP_ASSERT(w->depth < VP_PK_MAX_DEPTH);
    put(w, empty_op);
    put(w, OP_MARK);
    w->batch_op[w->depth] = (uint8_t)batch_op;
    w->items[w->depth] = 0;
    w->depth++;
}

void vp__pk_dict(vp__pk *w)
{
    open_container(w, OP_EMPTY_DICT, OP_SETITEMS);
}

void vp__pk_list(vp__pk *w)
{
    open_container(w, OP_EMPTY_LIST, OP_APPENDS);
}

void vp__pk_item(vp__pk *w)
{
    VP_ASSERT(w->depth > 0);
    uint32_t *n = &w->items[w->depth - 1];
    if (++*n == BATCH) {
        put(w, w->batch_op[w->depth - 1]);
        put(w, OP_MARK);
        *n = 0;
    }
}

void vp__pk_close(vp__pk *w)
{
    VP_ASSERT(w->depth > 0);
    w->depth--;
    put(w, w->batch_op[w->depth]);
}

void vp__pk_key(vp__pk *w, const char *key)
{
    vp__pk_str(w, key);
}

void vp__pk_tuple2(vp__pk *w)
{
    put(w, OP_TUPLE2);
}

void vp__pk_str_memo(vp__pk *w, const char *s, uint32_t *slot)
{
    if (*slot != VP_PK_NO_MEMO) {
        vp__pk_memo_get(w, *slot);
        return;
    }
    vp__pk_str(w, s);
    *slot = vp__pk_memo_put(w);
}

uint32_t vp__pk_memo_put(vp__pk *w)
{
    uint32_t id = w->memo++;
    if (id < 256) {
        put(w, OP_BINPUT);
        put(w, (int)id);
    } else {
        put(w, OP_LONG_BINPUT);
        put_u32(w, id);
    }
    return id;
}

void vp__pk_memo_get(vp__pk *w, uint32_t id)
{
    if (id < 256) {
        put(w, OP_BINGET);
        put(w, (int)id);
    } else {
        put(w, OP_LONG_BINGET);
        put_u32(w, id);
    }
}
