/*
 * test_st_checksum.c — the CRC-32 of a safetensors data section
 * (io/safetensors.h, "Checksums"): a written file carries data_crc32 and
 * data_crc32_tensors and opens verified; one flipped bit anywhere in the
 * data section fails the open with an error naming the file, the tensor,
 * its byte ranges and both CRCs; a file without checksums (as PyTorch
 * writes them) opens unverified; malformed or inconsistent checksum
 * entries are format errors; the writer refuses the reserved keys.
 */
#include "test.h"
#include "io/safetensors.h"
#include <unistd.h>
#include <zlib.h>

static char dir[256];

static size_t read_all(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void write_all(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(d, 1, n, f);
    fclose(f);
}

/* A file with a hand-written header (8-byte length + json) and data. */
static void raw_file(const char *path, const char *json, const void *data, size_t dn) {
    size_t jl = strlen(json);
    unsigned char buf[4096];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(buf + 8, json, jl);
    memcpy(buf + 8 + jl, data, dn);
    write_all(path, buf, 8 + jl + dn);
}

static uint64_t header_len(const unsigned char *b) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    return hl;
}

/* Three tensors: a [4] f32 (16 B), b [2,3] i32 (24 B), c [8] u8 (8 B). */
static void write_three(lucid_ctx *ctx, const char *path) {
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    float a[4] = {1, 2, 3, 4};
    int32_t b[6] = {-1, 0, 1, 2, 3, 4};
    uint8_t c[8] = {9, 8, 7, 6, 5, 4, 3, 2};
    int64_t sa = 4, sb[2] = {2, 3}, sc = 8;
    lucid_st_writer_add_raw(ctx, w, "a", LUCID_F32, 1, &sa, a);
    lucid_st_writer_add_raw(ctx, w, "b", LUCID_I32, 2, sb, b);
    lucid_st_writer_add_raw(ctx, w, "c", LUCID_U8, 1, &sc, c);
    lucid_st_writer_set_metadata(ctx, w, "epoch", "2");
    lucid_status st = lucid_st_writer_save(ctx, w, path);
    if (st != LUCID_OK) printf("# save failed: %s\n", lucid_ctx_error(ctx));
    lucid_st_writer_free(w);
}

static void test_written_file(lucid_ctx *ctx, const char *path) {
    write_three(ctx, path);
    lucid_safetensors *f = NULL;
    CHECK_STATUS("a written file opens (checksums match)", ctx,
                 lucid_safetensors_open(ctx, path, &f));
    if (!f) return;
    CHECK("it carries checksums", lucid_safetensors_checksummed(f), "no");
    /* data_crc32 is zlib's CRC-32 of the whole data section */
    unsigned char buf[4096];
    size_t n = read_all(path, buf, sizeof buf);
    uint64_t off = 8 + header_len(buf);
    char want[9];
    snprintf(want, sizeof want, "%08lx", crc32(0L, buf + off, (uInt)(n - off)));
    const char *got = lucid_safetensors_metadata_get(f, "data_crc32");
    CHECK("data_crc32 = zlib crc32 of the data section", got && strcmp(got, want) == 0,
          "%s vs %s", got ? got : "(none)", want);
    const char *list = lucid_safetensors_metadata_get(f, "data_crc32_tensors");
    char wl[64];
    snprintf(wl, sizeof wl, "%08lx %08lx %08lx", crc32(0L, buf + off, 16),
             crc32(0L, buf + off + 16, 24), crc32(0L, buf + off + 40, 8));
    CHECK("data_crc32_tensors: one CRC per tensor in data order",
          list && strcmp(list, wl) == 0, "%s vs %s", list ? list : "(none)", wl);
    CHECK("data_offset is 8 + header length",
          lucid_safetensors_data_offset(f) == off, "%llu",
          (unsigned long long)lucid_safetensors_data_offset(f));
    lucid_safetensors_close(f);
}

/* Flip one bit at data byte k; the open must fail naming `tensor` and the
 * range; the good bytes are put back afterwards. */
static void expect_flip_caught(lucid_ctx *ctx, const char *path, size_t k,
                               const char *tensor, const char *range) {
    unsigned char buf[4096];
    size_t n = read_all(path, buf, sizeof buf);
    uint64_t off = 8 + header_len(buf);
    buf[off + k] ^= 0x10;
    char bad[300];
    snprintf(bad, sizeof bad, "%s/flipped.safetensors", dir);
    write_all(bad, buf, n);
    lucid_safetensors *f = NULL;
    lucid_status st = lucid_safetensors_open(ctx, bad, &f);
    const char *e = lucid_ctx_error(ctx);
    char name[128], quoted[32];
    snprintf(name, sizeof name, "bit flip in data byte %zu is caught, naming '%s' %s", k,
             tensor, range);
    snprintf(quoted, sizeof quoted, "'%s'", tensor);
    CHECK(name, st == LUCID_ERR_FORMAT && f == NULL && strstr(e, bad) &&
          strstr(e, "checksum mismatch") && strstr(e, quoted) && strstr(e, range),
          "status %s: %s", lucid_status_name(st), e);
    lucid_safetensors_close(f);
}

static void test_bit_flips(lucid_ctx *ctx, const char *path) {
    expect_flip_caught(ctx, path, 0, "a", "bytes [0, 16)");
    expect_flip_caught(ctx, path, 15, "a", "bytes [0, 16)");
    expect_flip_caught(ctx, path, 20, "b", "bytes [16, 40)");
    expect_flip_caught(ctx, path, 47, "c", "bytes [40, 48)");
    /* the error also gives the file offsets of the tensor */
    unsigned char buf[4096];
    read_all(path, buf, sizeof buf);
    char range[64];
    uint64_t off = 8 + header_len(buf);
    snprintf(range, sizeof range, "file offsets [%llu, %llu)",
             (unsigned long long)(off + 16), (unsigned long long)(off + 40));
    expect_flip_caught(ctx, path, 17, "b", range);
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

static void test_hand_built(lucid_ctx *ctx) {
    char p[300], json[512];
    snprintf(p, sizeof p, "%s/hand.safetensors", dir);
    float d[2] = {1.5f, -2.0f};
    unsigned c = (unsigned)crc32(0L, (const unsigned char *)d, 8);
    unsigned c0 = (unsigned)crc32(0L, (const unsigned char *)d, 4);
    unsigned c1 = (unsigned)crc32(0L, (const unsigned char *)d + 4, 4);
    const char *tensors = "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}";

    /* no checksum (PyTorch's safetensors writes none): opens unverified */
    snprintf(json, sizeof json, "{\"__metadata__\":{\"format\":\"pt\"},%s}", tensors);
    raw_file(p, json, d, 8);
    lucid_safetensors *f = NULL;
    lucid_status st = lucid_safetensors_open(ctx, p, &f);
    CHECK("a file without checksums opens, unverified", st == LUCID_OK && f &&
          !lucid_safetensors_checksummed(f), "%s", lucid_ctx_error(ctx));
    lucid_safetensors_close(f);

    /* only the whole-section CRC: verified; a mismatch names the range */
    snprintf(json, sizeof json, "{\"__metadata__\":{\"data_crc32\":\"%08X\"},%s}", c, tensors);
    raw_file(p, json, d, 8);
    f = NULL;
    st = lucid_safetensors_open(ctx, p, &f);
    CHECK("data_crc32 alone (upper-case hex) verifies", st == LUCID_OK && f &&
          lucid_safetensors_checksummed(f), "%s", lucid_ctx_error(ctx));
    lucid_safetensors_close(f);
    snprintf(json, sizeof json, "{\"__metadata__\":{\"data_crc32\":\"%08x\"},%s}", c ^ 1u, tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "data_crc32 alone: a mismatch names the data-section range", p,
                        "the data section (bytes [0, 8)");

    /* per-tensor list: wrong count, malformed entry, list/whole disagree */
    snprintf(json, sizeof json, "{\"__metadata__\":{\"data_crc32_tensors\":\"%08x\"},%s}", c0, tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "too few per-tensor CRCs", p, "must hold 2 CRC-32s");
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"data_crc32_tensors\":\"%08x %08x %08x\"},%s}", c0, c1, c1,
             tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "too many per-tensor CRCs", p, "more than the 2");
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"data_crc32_tensors\":\"%08x zz\"},%s}", c0, tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "a malformed per-tensor CRC", p, "entry 2");
    snprintf(json, sizeof json, "{\"__metadata__\":{\"data_crc32\":\"12345\"},%s}", tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "a malformed data_crc32", p, "not a CRC-32");
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"data_crc32\":\"%08x\",\"data_crc32_tensors\":\"%08x %08x\"},%s}",
             c ^ 4u, c0, c1, tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "per-tensor CRCs match but data_crc32 does not", p,
                        "the header's checksums disagree");
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"data_crc32\":\"%08x\",\"data_crc32_tensors\":\"%08x %08x\"},%s}",
             c, c0, c1 ^ 2u, tensors);
    raw_file(p, json, d, 8);
    expect_format_error(ctx, "a per-tensor mismatch names the tensor", p, "tensor 'y'");
}

static void test_reserved(lucid_ctx *ctx) {
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    lucid_status a = lucid_st_writer_set_metadata(ctx, w, "data_crc32", "00000000");
    lucid_status b = lucid_st_writer_set_metadata(ctx, w, "data_crc32_tensors", "");
    CHECK("the writer refuses the reserved checksum keys",
          a == LUCID_ERR_ARG && b == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "reserved"),
          "%d %d %s", a, b, lucid_ctx_error(ctx));
    /* an empty file (no tensors) still gets a checksum (of zero bytes) */
    char p[300];
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    lucid_status st = lucid_st_writer_save(ctx, w, p);
    lucid_safetensors *f = NULL;
    if (st == LUCID_OK) st = lucid_safetensors_open(ctx, p, &f);
    const char *crc = f ? lucid_safetensors_metadata_get(f, "data_crc32") : NULL;
    CHECK("a file with no tensors has data_crc32 00000000", st == LUCID_OK && crc &&
          strcmp(crc, "00000000") == 0, "%s", crc ? crc : lucid_ctx_error(ctx));
    lucid_safetensors_close(f);
    lucid_st_writer_free(w);
    /* lucid_crc32 is chunk-invariant and equals zlib's */
    unsigned char big[3000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 131 + 7);
    uint32_t one = lucid_crc32(0, big, sizeof big);
    uint32_t two = lucid_crc32(lucid_crc32(0, big, 1000), big + 1000, 2000);
    CHECK("lucid_crc32 continues across chunks and equals zlib crc32",
          one == two && one == (uint32_t)crc32(0L, big, sizeof big), "%08x %08x", one, two);
}

int main(void) {
    if (!test_tmpdir(dir, sizeof dir, "lucid_crc")) return 1;
    lucid_ctx *ctx = test_cpu_ctx();
    if (!ctx) return 1;
    char p[300];
    snprintf(p, sizeof p, "%s/three.safetensors", dir);
    test_written_file(ctx, p);
    test_bit_flips(ctx, p);
    test_hand_built(ctx);
    test_reserved(ctx);
    lucid_ctx_release(ctx);
    test_rmdir(dir);
    return test_exit();
}
