/*
 * test_safetensors.c — safetensors round trip (all seven dtypes, metadata,
 * a 0-d and an empty tensor), byte-exact layout of a written file (with
 * its checksum entries), corrupt and truncated files (clear errors naming
 * file and tensor), and atomic writes: a failed save (injected at every
 * stage, or into a read-only directory) never replaces the good file and
 * leaves no temp. Checksums: test_st_checksum.c.
 */
#include "test.h"
#include "io/safetensors.h"
#include <dirent.h>
#include <zlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static lucid_tensor *mk(lucid_ctx *ctx, lucid_dtype dt, int nd, const int64_t *sh) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *t = NULL;
    lucid_tensor_empty(ctx, cpu, dt, nd, sh, &t);
    unsigned char *p = lucid_tensor_data(t);
    for (size_t i = 0; i < lucid_tensor_nbytes(t); i++) p[i] = (unsigned char)(i * 37 + dt);
    if (dt == LUCID_F32)
        for (int64_t i = 0; i < lucid_tensor_numel(t); i++) ((float *)p)[i] = 0.5f * (float)i - 3.0f;
    return t;
}

static void write_bytes(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(d, 1, n, f);
    fclose(f);
}

static size_t read_bytes(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static int temps_left(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* Hand-built file with a header and two tensors. */
static void raw_file(const char *path, const char *json, const void *data, size_t dn) {
    size_t jl = strlen(json);
    unsigned char buf[4096];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(buf + 8, json, jl);
    memcpy(buf + 8 + jl, data, dn);
    write_bytes(path, buf, 8 + jl + dn);
}

static void expect_format_error(lucid_ctx *ctx, const char *name, const char *path,
                                const char *needle) {
    lucid_safetensors *f = NULL;
    lucid_status st = lucid_safetensors_open(ctx, path, &f);
    CHECK(name, st == LUCID_ERR_FORMAT && strstr(lucid_ctx_error(ctx), path) &&
          (!needle || strstr(lucid_ctx_error(ctx), needle)),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_safetensors_close(f);
}

static void test_roundtrip(lucid_ctx *ctx, const char *path) {
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    const lucid_dtype dts[7] = {LUCID_F32, LUCID_F64, LUCID_BF16, LUCID_F16,
                                LUCID_U8, LUCID_I32, LUCID_I64};
    lucid_tensor *ts[7];
    int64_t sh[3] = {2, 3, 5};
    char name[64];
    for (int i = 0; i < 7; i++) {
        ts[i] = mk(ctx, dts[i], 3, sh);
        snprintf(name, sizeof name, "model.%d.weight", i);
        lucid_st_writer_add(ctx, w, name, ts[i]);
    }
    lucid_tensor *scalar = mk(ctx, LUCID_F32, 0, NULL);
    int64_t z[2] = {0, 4};
    lucid_tensor *empty = mk(ctx, LUCID_F32, 2, z);
    lucid_st_writer_add(ctx, w, "scalar", scalar);
    lucid_st_writer_add(ctx, w, "empty", empty);
    lucid_st_writer_set_metadata(ctx, w, "epoch", "3");
    lucid_st_writer_set_metadata(ctx, w, "recipe", "{\"lr0\": 0.01, \"name\": \"pose \\\"nano\\\"\"}");
    lucid_st_writer_set_metadata(ctx, w, "epoch", "4");
    lucid_status dup = lucid_st_writer_add(ctx, w, "scalar", scalar);
    CHECK("writer refuses a duplicate name", dup == LUCID_ERR_ARG, "status %d", dup);
    CHECK_STATUS("save round-trip file", ctx, lucid_st_writer_save(ctx, w, path));
    lucid_st_writer_free(w);

    lucid_safetensors *f = NULL;
    CHECK_STATUS("open round-trip file", ctx, lucid_safetensors_open(ctx, path, &f));
    if (!f) return;
    CHECK("round trip: 9 tensors", lucid_safetensors_count(f) == 9, "%d",
          lucid_safetensors_count(f));
    int same = 1;
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof name, "model.%d.weight", i);
        int k = lucid_safetensors_find(f, name);
        const lucid_st_info *in = lucid_safetensors_info(f, k);
        if (k < 0 || in->dtype != dts[i] || in->ndim != 3 || in->shape[2] != 5 ||
            memcmp(lucid_safetensors_bytes(f, k), lucid_tensor_data(ts[i]),
                   lucid_tensor_nbytes(ts[i])) != 0)
            same = 0;
    }
    CHECK("round trip: every dtype, shape and byte preserved", same, "mismatch");
    const lucid_st_info *si = lucid_safetensors_info(f, lucid_safetensors_find(f, "scalar"));
    const lucid_st_info *ei = lucid_safetensors_info(f, lucid_safetensors_find(f, "empty"));
    CHECK("round trip: 0-d and empty tensors", si && si->ndim == 0 && ei && ei->ndim == 2 &&
          ei->shape[0] == 0 && ei->begin == ei->end, "bad");
    const char *ep = lucid_safetensors_metadata_get(f, "epoch");
    const char *rp = lucid_safetensors_metadata_get(f, "recipe");
    CHECK("round trip: metadata (replaced value, escaped JSON string)",
          ep && strcmp(ep, "4") == 0 && rp &&
          strcmp(rp, "{\"lr0\": 0.01, \"name\": \"pose \\\"nano\\\"\"}") == 0 &&
          lucid_safetensors_metadata_count(f) == 5 && lucid_safetensors_checksummed(f),
          "epoch %s recipe %s (the three checksum entries make 5)", ep, rp);
    /* load into a tensor with conversion f32 -> f64 */
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *d = NULL;
    lucid_tensor_empty(ctx, cpu, LUCID_F64, 3, sh, &d);
    CHECK_STATUS("load f32 tensor into f64", ctx,
                 lucid_safetensors_load(ctx, f, "model.0.weight", d));
    CHECK("load converts values", ((double *)lucid_tensor_data(d))[7] == 0.5,
          "%g", ((double *)lucid_tensor_data(d))[7]);
    int64_t bad[2] = {5, 5};
    lucid_tensor *d2 = NULL;
    lucid_tensor_empty(ctx, cpu, LUCID_F32, 2, bad, &d2);
    lucid_status st = lucid_safetensors_load(ctx, f, "model.0.weight", d2);
    CHECK("load refuses a shape mismatch naming the tensor",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "model.0.weight"),
          "%s", lucid_ctx_error(ctx));
    st = lucid_safetensors_load(ctx, f, "nope", d2);
    CHECK("load of a missing name is a clear error",
          st != LUCID_OK && strstr(lucid_ctx_error(ctx), "nope"), "%s", lucid_ctx_error(ctx));
    lucid_tensor_release(d);
    lucid_tensor_release(d2);
    lucid_safetensors_close(f);
    for (int i = 0; i < 7; i++) lucid_tensor_release(ts[i]);
    lucid_tensor_release(scalar);
    lucid_tensor_release(empty);
}

static void test_header_layout(lucid_ctx *ctx, const char *path) {
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    float v[2] = {1.0f, 2.0f};
    int64_t sh = 2;
    lucid_st_writer_add_raw(ctx, w, "a", LUCID_F32, 1, &sh, v);
    lucid_st_writer_save(ctx, w, path);
    lucid_st_writer_free(w);
    unsigned char buf[256];
    size_t n = read_bytes(path, buf, sizeof buf);
    /* the CRC-32 computed here by zlib itself, not by lucid_crc32 */
    unsigned crc = (unsigned)crc32(0L, (const unsigned char *)v, 8);
    char want[256];
    /* header_crc32: zlib's CRC-32 of the header (length, JSON, padding)
     * with its own 8 digits as zeros */
    const char *fmt = "{\"__metadata__\":{\"data_crc32\":\"%08x\",\"data_crc32_tensors\":\"%08x\","
                      "\"header_crc32\":\"%s\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    unsigned char z[256];
    snprintf(want, sizeof want, fmt, crc, crc, "00000000");
    size_t wl = strlen(want);
    if (hl < wl || 8 + hl > sizeof z) hl = 0; /* fails below */
    memcpy(z, buf, 8);
    memcpy(z + 8, want, wl);
    memset(z + 8 + wl, ' ', hl > wl ? hl - wl : 0);
    char hc[9];
    snprintf(hc, sizeof hc, "%08x", (unsigned)crc32(0L, z, (uInt)(8 + hl)));
    snprintf(want, sizeof want, fmt, crc, crc, hc);
    CHECK("writer: exact header bytes, padded to 8 with spaces",
          hl % 8 == 0 && memcmp(buf + 8, want, strlen(want)) == 0 &&
          buf[8 + hl - 1] == ' ' && n == 8 + hl + 8 &&
          memcmp(buf + 8 + hl, v, 8) == 0,
          "hl %llu n %zu", (unsigned long long)hl, n);
}

static void test_corrupt(lucid_ctx *ctx) {
    char p[300];
    float data[4] = {1, 2, 3, 4};
    snprintf(p, sizeof p, "%s/bad.safetensors", dir);
    write_bytes(p, "abc", 3);
    expect_format_error(ctx, "file shorter than 8 bytes", p, "too short");
    unsigned char big[16] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, '{', '}'};
    write_bytes(p, big, 10);
    expect_format_error(ctx, "header length beyond the file", p, "header length");
    raw_file(p, "[1,2]", data, 0);
    expect_format_error(ctx, "header not an object", p, NULL);
    raw_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", data, 8);
    expect_format_error(ctx, "malformed JSON", p, "malformed");
    raw_file(p, "{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8);
    expect_format_error(ctx, "unknown dtype names the tensor", p, "'w'");
    raw_file(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8);
    expect_format_error(ctx, "shape/dtype disagree with offsets", p, "'w'");
    raw_file(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data, 8);
    expect_format_error(ctx, "negative dim", p, "shape[0]");
    raw_file(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 8);
    expect_format_error(ctx, "offsets past the data (truncated) name the tensor", p, "'w'");
    raw_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data, 12);
    expect_format_error(ctx, "overlapping tensors", p, "overlaps");
    raw_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data, 8);
    expect_format_error(ctx, "hole in the data section", p, "hole");
    raw_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 8);
    expect_format_error(ctx, "trailing bytes after the last tensor", p, "cover");
    raw_file(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data, 8);
    expect_format_error(ctx, "duplicate tensor name", p, "twice");
    raw_file(p, "{\"__metadata__\":{\"k\":3},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                "\"data_offsets\":[0,4]}}", data, 4);
    expect_format_error(ctx, "non-string metadata value", p, "'k'");
    /* an empty tensor whose sizes cannot be strided in int64 (0 bytes, so
     * the offsets agree): a named format error, not a tensor later */
    raw_file(p, "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,9007199254740992,"
                "9007199254740992],\"data_offsets\":[0,0]}}", data, 0);
    expect_format_error(ctx, "header shape whose strides overflow int64", p,
                        "tensor size overflows");
    /* negative control: the same with sizes that fit opens */
    raw_file(p, "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,1024,1024],"
                "\"data_offsets\":[0,0]}}", data, 0);
    {
        lucid_safetensors *zf = NULL;
        lucid_status zs = lucid_safetensors_open(ctx, p, &zf);
        CHECK("header: empty tensor with sizes that fit opens", zs == LUCID_OK,
              "%s", lucid_ctx_error(ctx));
        lucid_safetensors_close(zf);
    }
    /* truncation of a good file at every length gives an error, never OK */
    char good[300];
    snprintf(good, sizeof good, "%s/rt.safetensors", dir);
    unsigned char buf[8192];
    size_t n = read_bytes(good, buf, sizeof buf);
    int all = 1;
    for (size_t cut = 0; cut < n; cut += 7) {
        write_bytes(p, buf, cut);
        lucid_safetensors *f = NULL;
        lucid_status st = lucid_safetensors_open(ctx, p, &f);
        if (st == LUCID_OK || !strstr(lucid_ctx_error(ctx), p)) all = 0;
        lucid_safetensors_close(f);
    }
    CHECK("every truncation of a good file is a clear format error", all, "one opened");
    lucid_safetensors *f = NULL;
    snprintf(p, sizeof p, "%s/missing.safetensors", dir);
    lucid_status st = lucid_safetensors_open(ctx, p, &f);
    CHECK("missing file is an I/O error naming it",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), "missing.safetensors"),
          "%s", lucid_ctx_error(ctx));
}

static const char *fail_stage;
static int hook(const char *stage, void *ud) {
    return fail_stage && strcmp(stage, fail_stage) == 0;
}

static void test_atomic(lucid_ctx *ctx) {
    char p[300];
    snprintf(p, sizeof p, "%s/last.safetensors", dir);
    float v1[3] = {1, 2, 3}, v2[3] = {9, 9, 9};
    int64_t sh = 3;
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    lucid_st_writer_add_raw(ctx, w, "w", LUCID_F32, 1, &sh, v1);
    lucid_st_writer_save(ctx, w, p);
    lucid_st_writer_free(w);
    unsigned char good[512], now[512];
    size_t gn = read_bytes(p, good, sizeof good);
    lucid_st_writer_create(ctx, &w);
    lucid_st_writer_add_raw(ctx, w, "w", LUCID_F32, 1, &sh, v2);
    lucid_atomic_file_set_fail_hook(hook, NULL);
    const char *stages[4] = {"open", "write", "fsync", "rename"};
    for (int i = 0; i < 4; i++) {
        fail_stage = stages[i];
        lucid_status st = lucid_st_writer_save(ctx, w, p);
        size_t nn = read_bytes(p, now, sizeof now);
        char nm[128];
        snprintf(nm, sizeof nm, "atomic save failing at %s keeps the old file, no temp left",
                 stages[i]);
        CHECK(nm, st == LUCID_ERR_IO && nn == gn && memcmp(now, good, gn) == 0 &&
              temps_left() == 0 && strstr(lucid_ctx_error(ctx), p),
              "status %d temps %d: %s", st, temps_left(), lucid_ctx_error(ctx));
    }
    fail_stage = NULL;
    lucid_atomic_file_set_fail_hook(NULL, NULL);
    CHECK_STATUS("atomic save succeeds without injection", ctx, lucid_st_writer_save(ctx, w, p));
    lucid_safetensors *f = NULL;
    lucid_safetensors_open(ctx, p, &f);
    CHECK("the new file replaced the old one",
          f && memcmp(lucid_safetensors_bytes(f, 0), v2, sizeof v2) == 0, "old content");
    lucid_safetensors_close(f);
    /* read-only directory (skipped when running as root, which ignores it) */
    if (geteuid() != 0) {
        char ro[300], rp[340];
        snprintf(ro, sizeof ro, "%s/ro", dir);
        mkdir(ro, 0755);
        snprintf(rp, sizeof rp, "%s/best.safetensors", ro);
        lucid_st_writer_save(ctx, w, rp);
        chmod(ro, 0555);
        lucid_st_writer *w3 = NULL;
        lucid_st_writer_create(ctx, &w3);
        lucid_st_writer_add_raw(ctx, w3, "w", LUCID_F32, 1, &sh, v1);
        lucid_status st = lucid_st_writer_save(ctx, w3, rp);
        lucid_safetensors_open(ctx, rp, &f);
        CHECK("save into a read-only directory fails and keeps the old file",
              st == LUCID_ERR_IO && f &&
              memcmp(lucid_safetensors_bytes(f, 0), v2, sizeof v2) == 0,
              "status %d", st);
        lucid_safetensors_close(f);
        lucid_st_writer_free(w3);
        chmod(ro, 0755);
    } else {
        TEST_SKIP("save into a read-only directory", "running as root");
    }
    lucid_st_writer_free(w);
}

int main(void) {
    if (!test_tmpdir(dir, sizeof dir, "lucid_st")) return 1;
    lucid_ctx *ctx = test_cpu_ctx();
    if (!ctx) return 1;
    char p[300];
    snprintf(p, sizeof p, "%s/rt.safetensors", dir);
    test_roundtrip(ctx, p);
    snprintf(p, sizeof p, "%s/hdr.safetensors", dir);
    test_header_layout(ctx, p);
    test_corrupt(ctx);
    test_atomic(ctx);
    lucid_ctx_release(ctx);
    test_rmdir(dir);
    return test_exit();
}
