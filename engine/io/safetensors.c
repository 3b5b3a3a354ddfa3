/*
 * safetensors.c — safetensors reader and writer (contract in
 * io/safetensors.h). JSON through cJSON (Debian libcjson).
 */
#include "io/safetensors.h"
#include "internal.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ST_MAX_HEADER (100u << 20) /* as the reference implementation */

static const struct { const char *name; lucid_dtype dt; } st_dtypes[] = {
    {"F32", LUCID_F32}, {"F64", LUCID_F64}, {"BF16", LUCID_BF16},
    {"F16", LUCID_F16}, {"U8", LUCID_U8},   {"I32", LUCID_I32},
    {"I64", LUCID_I64},
};

const char *lucid_st_dtype_name(lucid_dtype dt) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
    return NULL;
}

int lucid_st_dtype_parse(const char *s, lucid_dtype *out) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (s && strcmp(st_dtypes[i].name, s) == 0) {
            *out = st_dtypes[i].dt;
            return 0;
        }
    return -1;
}

/* ================================================================ reader */

struct lucid_safetensors {
    char *path;
    unsigned char *buf;     /* whole file */
    size_t size;
    size_t data_off;        /* 8 + N */
    int n;
    lucid_st_info *info;    /* sorted by begin */
    int nmeta;
    char **meta;            /* key, value pairs */
};

void lucid_safetensors_close(lucid_safetensors *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free((char *)f->info[i].name);
    for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
    free(f->info);
    free(f->meta);
    free(f->buf);
    free(f->path);
    free(f);
}

static lucid_status read_file(lucid_ctx *ctx, const char *path,
                              unsigned char **buf, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot open: %s", path,
                            strerror(errno));
    struct stat stt;
    if (fstat(fileno(fp), &stt) == 0 && !S_ISREG(stt.st_mode)) {
        /* a folder opens for reading on Linux; its "size" is not a length */
        fclose(fp);
        return lucid_seterr(ctx, LUCID_ERR_IO, "%s: %s, not a safetensors file", path,
                            S_ISDIR(stt.st_mode) ? "is a directory" : "is not a regular file");
    }
    if (fseek(fp, 0, SEEK_END) != 0) goto ioerr;
    long sz = ftell(fp);
    if (sz < 0 || fseek(fp, 0, SEEK_SET) != 0) goto ioerr;
    *buf = malloc((size_t)sz + 1);
    if (!*buf) {
        fclose(fp);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory reading %ld bytes",
                            path, sz);
    }
    if (fread(*buf, 1, (size_t)sz, fp) != (size_t)sz) {
        free(*buf);
        *buf = NULL;
        goto ioerr;
    }
    fclose(fp);
    *size = (size_t)sz;
    return LUCID_OK;
ioerr:
    fclose(fp);
    return lucid_seterr(ctx, LUCID_ERR_IO, "%s: read failed: %s", path,
                        strerror(errno));
}

/* A JSON number that is a non-negative integer <= 2^53. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = cJSON_GetNumberValue(j);
    if (!(v >= 0.0) || v > 9007199254740992.0 || v != (double)(uint64_t)v)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

static int info_cmp(const void *a, const void *b) {
    const lucid_st_info *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static lucid_status parse_entry(lucid_ctx *ctx, const char *path,
                                const cJSON *e, uint64_t data_size,
                                lucid_st_info *out) {
    const char *nm = e->string;
#define BAD(...) lucid_seterr(ctx, LUCID_ERR_FORMAT, __VA_ARGS__)
    if (!cJSON_IsObject(e))
        return BAD("%s: tensor '%s': header entry is not an object", path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || lucid_st_dtype_parse(dt->valuestring, &out->dtype))
        return BAD("%s: tensor '%s': dtype %s%s%s is missing or not one of "
                   "F32 F64 BF16 F16 U8 I32 I64",
                   path, nm, cJSON_IsString(dt) ? "\"" : "",
                   cJSON_IsString(dt) ? dt->valuestring : "",
                   cJSON_IsString(dt) ? "\"" : "");
    if (!cJSON_IsArray(sh))
        return BAD("%s: tensor '%s': shape is missing or not an array", path, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > LUCID_MAX_DIMS)
        return BAD("%s: tensor '%s': %d dims (at most %d supported)", path, nm,
                   nd, LUCID_MAX_DIMS);
    out->ndim = nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_uint(cJSON_GetArrayItem(sh, d), &v))
            return BAD("%s: tensor '%s': shape[%d] is not a non-negative integer",
                       path, nm, d);
        out->shape[d] = (int64_t)v;
        if (v && numel > UINT64_MAX / v) overflow = 1;
        numel *= v;
    }
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 ||
        !json_uint(cJSON_GetArrayItem(of, 0), &out->begin) ||
        !json_uint(cJSON_GetArrayItem(of, 1), &out->end))
        return BAD("%s: tensor '%s': data_offsets must be [begin, end] "
                   "non-negative integers",
                   path, nm);
    if (out->begin > out->end)
        return BAD("%s: tensor '%s': data_offsets [%llu, %llu] has begin > end",
                   path, nm, (unsigned long long)out->begin,
                   (unsigned long long)out->end);
    if (out->end > data_size)
        return BAD("%s: tensor '%s': data_offsets [%llu, %llu] run past the "
                   "data section (%llu bytes): truncated or corrupt file",
                   path, nm, (unsigned long long)out->begin,
                   (unsigned long long)out->end, (unsigned long long)data_size);
    uint64_t es = lucid_dtype_size(out->dtype);
    /* the tensor lucid makes of it must be sizable in int64 (numel,
     * contiguous strides, bytes): [0, 2^53, 2^53] holds no bytes but
     * cannot be strided */
    if (!overflow && lucid_shape_bytes(nd, out->shape, out->dtype, NULL, NULL) != 0) {
        char b[256];
        return BAD("%s: tensor '%s': tensor size overflows: shape %s of %s",
                   path, nm, lucid_shape_str(nd, out->shape, b, sizeof b),
                   dt->valuestring);
    }
    if (overflow || numel > UINT64_MAX / es || numel * es != out->end - out->begin)
        return BAD("%s: tensor '%s': %llu bytes in data_offsets but dtype %s "
                   "and shape need %llu",
                   path, nm, (unsigned long long)(out->end - out->begin),
                   dt->valuestring,
                   (unsigned long long)(overflow ? UINT64_MAX : numel * es));
#undef BAD
    return LUCID_OK;
}

static lucid_status parse_header(lucid_ctx *ctx, lucid_safetensors *f,
                                 const cJSON *root) {
    const char *path = f->path;
    uint64_t data_size = f->size - f->data_off;
    int total = cJSON_GetArraySize(root);
    f->info = calloc((size_t)total + 1, sizeof *f->info);
    f->meta = calloc(2 * (size_t)total + 2, sizeof *f->meta);
    if (!f->info || !f->meta)
        return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", path);
    int seen_meta = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!e->string)
            return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s: header entry without a name", path);
        if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta++)
                return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                    "%s: __metadata__ appears twice", path);
            if (!cJSON_IsObject(e))
                return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                    "%s: __metadata__ is not an object", path);
            for (const cJSON *m = e->child; m; m = m->next) {
                if (!cJSON_IsString(m))
                    return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                        "%s: __metadata__ value of '%s' is "
                                        "not a string",
                                        path, m->string);
                char **kv = realloc(f->meta, (2 * (size_t)f->nmeta + 2) * sizeof *kv);
                if (!kv) return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", path);
                f->meta = kv;
                kv[2 * f->nmeta] = strdup(m->string);
                kv[2 * f->nmeta + 1] = strdup(m->valuestring);
                f->nmeta++;
            }
            continue;
        }
        if (!*e->string)
            return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s: tensor with an empty name", path);
        for (int i = 0; i < f->n; i++)
            if (strcmp(f->info[i].name, e->string) == 0)
                return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                    "%s: tensor '%s' appears twice in the "
                                    "header",
                                    path, e->string);
        lucid_st_info *in = &f->info[f->n];
        LUCID_TRY(parse_entry(ctx, path, e, data_size, in));
        in->name = strdup(e->string);
        if (!in->name) return lucid_seterr(ctx, LUCID_ERR_OOM, "%s: out of memory", path);
        f->n++;
    }
    qsort(f->info, (size_t)f->n, sizeof *f->info, info_cmp);
    uint64_t pos = 0;
    for (int i = 0; i < f->n; i++) {
        const lucid_st_info *in = &f->info[i];
        if (in->begin < pos)
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: tensor '%s' [%llu, %llu) overlaps tensor "
                                "'%s'",
                                path, in->name, (unsigned long long)in->begin,
                                (unsigned long long)in->end, f->info[i - 1].name);
        if (in->begin > pos)
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: hole of %llu bytes in the data section "
                                "before tensor '%s'",
                                path, (unsigned long long)(in->begin - pos),
                                in->name);
        pos = in->end;
    }
    if (pos != data_size)
        return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                            "%s: the data section has %llu bytes but the "
                            "tensors cover %llu (trailing garbage or a "
                            "corrupt header)",
                            path, (unsigned long long)data_size,
                            (unsigned long long)pos);
    return LUCID_OK;
}

lucid_status lucid_safetensors_open(lucid_ctx *ctx, const char *path,
                                    lucid_safetensors **out) {
    *out = NULL;
    lucid_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path ? path : ""))) {
        free(f);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors: out of memory");
    }
    lucid_status st = read_file(ctx, path, &f->buf, &f->size);
    if (st != LUCID_OK) {
        lucid_safetensors_close(f);
        return st;
    }
    uint64_t hl = 0;
    if (f->size < 8) {
        st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                          "%s: %zu bytes: too short for a safetensors header "
                          "(truncated file?)",
                          path, f->size);
    } else {
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | f->buf[i];
        if (hl > ST_MAX_HEADER || hl > f->size - 8)
            st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                              "%s: header length %llu does not fit in the "
                              "file of %zu bytes (truncated or not a "
                              "safetensors file)",
                              path, (unsigned long long)hl, f->size);
        else if (hl < 2 || f->buf[8] != '{')
            st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                              "%s: the header does not start with '{' (not a "
                              "safetensors file)",
                              path);
    }
    if (st == LUCID_OK) {
        f->data_off = 8 + (size_t)hl;
        cJSON *root = cJSON_ParseWithLength((const char *)f->buf + 8, (size_t)hl);
        if (!root || !cJSON_IsObject(root))
            st = lucid_seterr(ctx, LUCID_ERR_FORMAT,
                              "%s: the JSON header is malformed%s", path,
                              root ? " (not an object)" : "");
        else
            st = parse_header(ctx, f, root);
        cJSON_Delete(root);
    }
    if (st == LUCID_OK) st = lucid_safetensors_verify(ctx, f);
    if (st != LUCID_OK) {
        lucid_safetensors_close(f);
        return st;
    }
    *out = f;
    return LUCID_OK;
}

const char *lucid_safetensors_path(const lucid_safetensors *f) { return f->path; }
uint64_t lucid_safetensors_data_offset(const lucid_safetensors *f) { return f->data_off; }
const unsigned char *lucid_safetensors_buffer(const lucid_safetensors *f) { return f->buf; }
int lucid_safetensors_count(const lucid_safetensors *f) { return f->n; }

const lucid_st_info *lucid_safetensors_info(const lucid_safetensors *f, int i) {
    return (i >= 0 && i < f->n) ? &f->info[i] : NULL;
}

int lucid_safetensors_find(const lucid_safetensors *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->info[i].name, name) == 0) return i;
    return -1;
}

const void *lucid_safetensors_bytes(const lucid_safetensors *f, int i) {
    return (i >= 0 && i < f->n) ? f->buf + f->data_off + f->info[i].begin : NULL;
}

int lucid_safetensors_metadata_count(const lucid_safetensors *f) { return f->nmeta; }

const char *lucid_safetensors_metadata_key(const lucid_safetensors *f, int i) {
    return (i >= 0 && i < f->nmeta) ? f->meta[2 * i] : NULL;
}

const char *lucid_safetensors_metadata_get(const lucid_safetensors *f,
                                           const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

lucid_status lucid_safetensors_load(lucid_ctx *ctx, lucid_safetensors *f,
                                    const char *name, lucid_tensor *dst) {
    int i = lucid_safetensors_find(f, name);
    if (i < 0)
        return lucid_seterr(ctx, LUCID_ERR_FORMAT, "%s: no tensor named '%s'",
                            f->path, name);
    const lucid_st_info *in = &f->info[i];
    int64_t numel = 1;
    for (int d = 0; d < in->ndim; d++) numel *= in->shape[d];
    int same = dst->ndim == in->ndim;
    for (int d = 0; same && d < in->ndim; d++) same = dst->shape[d] == in->shape[d];
    if (!same && !(lucid_tensor_is_contiguous(dst) && lucid_tensor_numel(dst) == numel)) {
        char a[128], b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: tensor '%s' has shape %s; the destination "
                            "has shape %s",
                            f->path, name, lucid_shape_str(in->ndim, in->shape, a, sizeof a),
                            lucid_shape_str(dst->ndim, dst->shape, b, sizeof b));
    }
    if (in->dtype != dst->dtype &&
        !(lucid_dtype_is_float(in->dtype) && lucid_dtype_is_float(dst->dtype)))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: tensor '%s' is %s; the destination is %s",
                            f->path, name, lucid_st_dtype_name(in->dtype),
                            lucid_dtype_name(dst->dtype));
    if (numel == 0) return LUCID_OK;
    /* Aligned host copy of the bytes, wrapped as a tensor, then lucid_copy
     * (device transfer and dtype conversion). */
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *src = NULL;
    int64_t n1 = numel;
    LUCID_TRY(lucid_tensor_empty(ctx, cpu, in->dtype, 1, &n1, &src));
    memcpy(lucid_tensor_data(src), lucid_safetensors_bytes(f, i), in->end - in->begin);
    lucid_tensor *view = NULL;
    lucid_status st = same ? lucid_tensor_view(ctx, src, in->ndim, in->shape, &view)
                           : lucid_tensor_view(ctx, src, dst->ndim, dst->shape, &view);
    if (st == LUCID_OK) st = lucid_copy(ctx, dst, view);
    if (view) lucid_tensor_release(view);
    lucid_tensor_release(src);
    return st;
}

/* ================================================================ writer */

typedef struct st_item {
    char *name;
    lucid_dtype dtype;
    int ndim;
    int64_t shape[LUCID_MAX_DIMS];
    size_t nbytes;
    void *data;
    int borrowed; /* data lies in one of the writer's blocks (not freed alone) */
} st_item;

struct lucid_st_writer {
    int n, cap;
    st_item *items;
    int nmeta;
    char **meta;
    int nblocks, cap_blocks;
    void **blocks; /* adopted snapshot blocks (lucid_st_writer_adopt_block) */
};

lucid_status lucid_st_writer_create(lucid_ctx *ctx, lucid_st_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? LUCID_OK
                : lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors writer: out of memory");
}

void lucid_st_writer_free(lucid_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->items[i].name);
        if (!w->items[i].borrowed) free(w->items[i].data);
    }
    for (int i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
    for (int i = 0; i < w->nblocks; i++) free(w->blocks[i]);
    free(w->items);
    free(w->meta);
    free(w->blocks);
    free(w);
}

lucid_status lucid_st_writer_adopt_block(lucid_ctx *ctx, lucid_st_writer *w,
                                         void *block) {
    if (w->nblocks == w->cap_blocks) {
        int cap = w->cap_blocks ? 2 * w->cap_blocks : 8;
        void **b = realloc(w->blocks, (size_t)cap * sizeof *b);
        if (!b) {
            free(block);
            return lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors writer: out of memory");
        }
        w->blocks = b;
        w->cap_blocks = cap;
    }
    w->blocks[w->nblocks++] = block;
    return LUCID_OK;
}

/* Append one tensor: its bytes copied (copy = 1) or borrowed from an
 * adopted block (copy = 0). Checks name, dtype, dims and uniqueness. */
static lucid_status add_item(lucid_ctx *ctx, lucid_st_writer *w,
                             const char *name, lucid_dtype dt, int ndim,
                             const int64_t *shape, const void *data, int copy) {
    if (!name || !*name || strcmp(name, "__metadata__") == 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "safetensors writer: invalid tensor name '%s'",
                            name ? name : "(null)");
    if (!lucid_st_dtype_name(dt))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "safetensors writer: tensor '%s': unsupported dtype", name);
    if (ndim < 0 || ndim > LUCID_MAX_DIMS)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "safetensors writer: tensor '%s': %d dims", name, ndim);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i].name, name) == 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "safetensors writer: tensor '%s' added twice", name);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "safetensors writer: tensor '%s': negative size", name);
    }
    int64_t nbytes = 0;
    if (lucid_shape_bytes(ndim, shape, dt, NULL, &nbytes) != 0) {
        char b[256];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "safetensors writer: tensor '%s': tensor size "
                            "overflows: shape %s",
                            name, lucid_shape_str(ndim, shape, b, sizeof b));
    }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        st_item *it = realloc(w->items, (size_t)cap * sizeof *it);
        if (!it) return lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors writer: out of memory");
        w->items = it;
        w->cap = cap;
    }
    st_item *it = &w->items[w->n];
    memset(it, 0, sizeof *it);
    it->nbytes = (size_t)nbytes;
    it->name = strdup(name);
    it->borrowed = !copy;
    it->data = copy ? malloc(it->nbytes ? it->nbytes : 1) : (void *)data;
    if (!it->name || !it->data) {
        free(it->name);
        if (copy) free(it->data);
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "safetensors writer: out of memory for '%s' (%zu bytes)",
                            name, it->nbytes);
    }
    if (copy && it->nbytes) memcpy(it->data, data, it->nbytes);
    it->dtype = dt;
    it->ndim = ndim;
    for (int d = 0; d < ndim; d++) it->shape[d] = shape[d];
    w->n++;
    return LUCID_OK;
}

lucid_status lucid_st_writer_add_raw(lucid_ctx *ctx, lucid_st_writer *w,
                                     const char *name, lucid_dtype dt,
                                     int ndim, const int64_t *shape,
                                     const void *data) {
    return add_item(ctx, w, name, dt, ndim, shape, data, 1);
}

lucid_status lucid_st_writer_add_borrowed(lucid_ctx *ctx, lucid_st_writer *w,
                                          const char *name, lucid_dtype dt,
                                          int ndim, const int64_t *shape,
                                          const void *data) {
    return add_item(ctx, w, name, dt, ndim, shape, data, 0);
}

size_t lucid_st_writer_data_bytes(const lucid_st_writer *w) {
    size_t n = 0;
    for (int i = 0; i < w->n; i++) n += w->items[i].nbytes;
    return n;
}

lucid_status lucid_st_writer_add(lucid_ctx *ctx, lucid_st_writer *w,
                                 const char *name, const lucid_tensor *t) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *h = NULL;
    LUCID_TRY(lucid_tensor_to(ctx, t, cpu, t->dtype, &h));
    lucid_status st = lucid_st_writer_add_raw(ctx, w, name, t->dtype, t->ndim,
                                              t->shape, lucid_tensor_data(h));
    lucid_tensor_release(h);
    return st;
}

lucid_status lucid_st_writer_set_metadata(lucid_ctx *ctx, lucid_st_writer *w,
                                          const char *key, const char *value) {
    if (!key || !value)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "safetensors writer: NULL metadata");
    if (strcmp(key, LUCID_ST_CRC_KEY) == 0 || strcmp(key, LUCID_ST_CRC_TENSORS_KEY) == 0 ||
        strcmp(key, LUCID_ST_HEADER_CRC_KEY) == 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "safetensors writer: metadata key '%s' is reserved "
                            "(the writer stores the data checksum there)",
                            key);
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            char *v = strdup(value);
            if (!v) return lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory");
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return LUCID_OK;
        }
    char **kv = realloc(w->meta, (2 * (size_t)w->nmeta + 2) * sizeof *kv);
    if (!kv) return lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory");
    w->meta = kv;
    kv[2 * w->nmeta] = strdup(key);
    kv[2 * w->nmeta + 1] = strdup(value);
    if (!kv[2 * w->nmeta] || !kv[2 * w->nmeta + 1]) {
        free(kv[2 * w->nmeta]);
        free(kv[2 * w->nmeta + 1]);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "out of memory");
    }
    w->nmeta++;
    return LUCID_OK;
}

/* The JSON header: __metadata__ (the caller's entries, then the two
 * checksum entries), then the tensors in the order added. */
static char *build_header(const lucid_st_writer *w, const char *crc,
                          const char *crc_list) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; m && i < w->nmeta; i++)
        cJSON_AddStringToObject(m, w->meta[2 * i], w->meta[2 * i + 1]);
    if (m) {
        cJSON_AddStringToObject(m, LUCID_ST_CRC_KEY, crc);
        cJSON_AddStringToObject(m, LUCID_ST_CRC_TENSORS_KEY, crc_list);
        /* filled in by lucid_st_writer_encode once the header's bytes exist */
        cJSON_AddStringToObject(m, LUCID_ST_HEADER_CRC_KEY, "00000000");
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_item *it = &w->items[i];
        cJSON *e = cJSON_AddObjectToObject(root, it->name);
        if (!e) break;
        cJSON_AddStringToObject(e, "dtype", lucid_st_dtype_name(it->dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; sh && d < it->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)it->shape[d]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        if (of) {
            cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
            cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + it->nbytes)));
        }
        off += it->nbytes;
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

lucid_status lucid_st_writer_encode(lucid_ctx *ctx, const lucid_st_writer *w,
                                    unsigned char **hdr_out, size_t *hdr_len) {
    *hdr_out = NULL;
    *hdr_len = 0;
    const void **data = malloc(((size_t)w->n + 1) * sizeof *data);
    size_t *nbytes = malloc(((size_t)w->n + 1) * sizeof *nbytes);
    if (!data || !nbytes) {
        free(data);
        free(nbytes);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors writer: out of memory");
    }
    for (int i = 0; i < w->n; i++) {
        data[i] = w->items[i].data;
        nbytes[i] = w->items[i].nbytes;
    }
    char crc[9], *crc_list = NULL;
    lucid_status cst = lucid_st_checksum_strings(ctx, w->n, data, nbytes, crc, &crc_list);
    free(data);
    free(nbytes);
    if (cst != LUCID_OK) return cst;
    char *json = build_header(w, crc, crc_list);
    free(crc_list);
    if (!json)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "safetensors writer: out of memory building the header");
    size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
    unsigned char *hdr = malloc(8 + hl);
    if (!hdr) {
        cJSON_free(json);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors writer: out of memory");
    }
    for (int i = 0; i < 8; i++) hdr[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(hdr + 8, json, jl);
    memset(hdr + 8 + jl, ' ', hl - jl);
    cJSON_free(json);
    lucid_st_header_crc_fill(hdr, 8 + hl);
    *hdr_out = hdr;
    *hdr_len = 8 + hl;
    return LUCID_OK;
}

lucid_status lucid_st_writer_write_file(lucid_ctx *ctx, const lucid_st_writer *w,
                                        const unsigned char *hdr, size_t hdr_len,
                                        const char *path) {
    lucid_atomic_file *f = NULL;
    LUCID_TRY(lucid_atomic_file_open(ctx, path, &f));
    lucid_status st = lucid_atomic_file_write(ctx, f, hdr, hdr_len);
    for (int i = 0; st == LUCID_OK && i < w->n; i++)
        st = lucid_atomic_file_write(ctx, f, w->items[i].data, w->items[i].nbytes);
    if (st != LUCID_OK) {
        lucid_atomic_file_abort(f);
        return st;
    }
    return lucid_atomic_file_commit(ctx, f);
}

lucid_status lucid_st_writer_save(lucid_ctx *ctx, lucid_st_writer *w,
                                  const char *path) {
    unsigned char *hdr = NULL;
    size_t hl = 0;
    lucid_status st = lucid_st_writer_encode(ctx, w, &hdr, &hl);
    if (st != LUCID_OK) {
        /* name the file in the message (encode cannot know it) */
        char msg[sizeof ((lucid_ctx *)0)->errmsg];
        snprintf(msg, sizeof msg, "%s", lucid_ctx_error(ctx));
        return lucid_seterr(ctx, st, "%s: %s", path, msg);
    }
    st = lucid_st_writer_write_file(ctx, w, hdr, hl, path);
    free(hdr);
    return st;
}
