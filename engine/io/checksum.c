/*
 * checksum.c — CRC-32 of a safetensors data section (contract in
 * io/safetensors.h, "Checksums"). The CRC is zlib's crc32 (the CRC-32 of
 * zlib, gzip, PNG and Python's zlib.crc32), so a file can be checked
 * without lucid (Python):
 *     b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
 *     meta = json.loads(b[8:8 + n])["__metadata__"]
 *     assert "%08x" % zlib.crc32(b[8 + n:]) == meta["data_crc32"]
 *     h = meta["header_crc32"]; z = b[:8 + n].replace(
 *         b'"header_crc32":"' + h.encode() + b'"', b'"header_crc32":"00000000"')
 *     assert "%08x" % zlib.crc32(z) == h
 */
#include "io/safetensors.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

uint32_t lucid_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uLong c = crc;
    while (n > 0) { /* zlib's length is a uInt: 1 GiB chunks */
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

lucid_status lucid_st_checksum_strings(lucid_ctx *ctx, int n,
                                       const void *const *data,
                                       const size_t *nbytes, char whole[9],
                                       char **list) {
    *list = malloc(9 * (size_t)n + 1);
    if (!*list)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "safetensors writer: out of memory for %d checksums", n);
    uLong all = crc32(0L, Z_NULL, 0);
    char *s = *list;
    s[0] = '\0';
    for (int i = 0; i < n; i++) {
        uint32_t c = lucid_crc32(0, data[i], nbytes[i]);
        all = crc32_combine(all, c, (z_off_t)nbytes[i]);
        s += sprintf(s, i ? " %08x" : "%08x", (unsigned)c);
    }
    snprintf(whole, 9, "%08x", (unsigned)all);
    return LUCID_OK;
}

/* 8 lowercase or uppercase hex digits at s (exactly, when `exact`: nothing
 * may follow). Returns 0 and the value, or -1. */
static int parse_crc(const char *s, int exact, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = (v << 4) | (uint32_t)d;
    }
    if (exact && s[8]) return -1;
    *out = v;
    return 0;
}

int lucid_safetensors_checksummed(const lucid_safetensors *f) {
    return lucid_safetensors_metadata_get(f, LUCID_ST_CRC_KEY) != NULL ||
           lucid_safetensors_metadata_get(f, LUCID_ST_CRC_TENSORS_KEY) != NULL ||
           lucid_safetensors_metadata_get(f, LUCID_ST_HEADER_CRC_KEY) != NULL;
}

/* Offset of the 8 digits of "header_crc32":"XXXXXXXX" in the header
 * (the JSON at hdr[8 .. n)), or 0 when absent.  A JSON string escapes its
 * quotes, so the pattern can only be the key itself. */
static size_t header_crc_at(const unsigned char *hdr, size_t n) {
    static const char pat[] = "\"" LUCID_ST_HEADER_CRC_KEY "\":\"";
    size_t m = sizeof pat - 1;
    for (size_t i = 8; i + m + 9 <= n; i++)
        if (memcmp(hdr + i, pat, m) == 0 && hdr[i + m + 8] == '"') return i + m;
    return 0;
}

/* CRC-32 of the header with its header_crc32 digits (at `at`) read as zeros. */
static uint32_t header_crc(const unsigned char *hdr, size_t n, size_t at) {
    static const unsigned char zeros[8] = {'0', '0', '0', '0', '0', '0', '0', '0'};
    uint32_t c = lucid_crc32(0, hdr, at);
    c = lucid_crc32(c, zeros, 8);
    return lucid_crc32(c, hdr + at + 8, n - at - 8);
}

void lucid_st_header_crc_fill(unsigned char *hdr, size_t n) {
    size_t at = header_crc_at(hdr, n);
    if (!at) return;
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", (unsigned)header_crc(hdr, n, at));
    memcpy(hdr + at, hex, 8);
}

lucid_status lucid_safetensors_verify(lucid_ctx *ctx, const lucid_safetensors *f) {
    const char *path = lucid_safetensors_path(f);
    const char *whole_s = lucid_safetensors_metadata_get(f, LUCID_ST_CRC_KEY);
    const char *list = lucid_safetensors_metadata_get(f, LUCID_ST_CRC_TENSORS_KEY);
    const char *hcrc_s = lucid_safetensors_metadata_get(f, LUCID_ST_HEADER_CRC_KEY);
    if (hcrc_s) {
        uint32_t want_h = 0;
        const unsigned char *hdr = lucid_safetensors_buffer(f);
        size_t hn = (size_t)lucid_safetensors_data_offset(f);
        size_t at = header_crc_at(hdr, hn);
        if (parse_crc(hcrc_s, 1, &want_h) || !at)
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: __metadata__ %s = \"%.40s\" is not a CRC-32 "
                                "(8 hex digits)",
                                path, LUCID_ST_HEADER_CRC_KEY, hcrc_s);
        uint32_t got_h = header_crc(hdr, hn, at);
        if (got_h != want_h)
            return lucid_seterr(
                ctx, LUCID_ERR_FORMAT,
                "%s: checksum mismatch: the header (file offsets [0, %llu): the "
                "metadata and the tensor table) has CRC-32 %08x, %s records %08x: "
                "the file is corrupt (changed on disk or in a copy); use another copy",
                path, (unsigned long long)lucid_safetensors_data_offset(f),
                (unsigned)got_h, LUCID_ST_HEADER_CRC_KEY, (unsigned)want_h);
    }
    if (!whole_s && !list) return LUCID_OK; /* written without data checksums */
    uint32_t want_all = 0;
    if (whole_s && parse_crc(whole_s, 1, &want_all))
        return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                            "%s: __metadata__ %s = \"%.40s\" is not a CRC-32 "
                            "(8 hex digits)",
                            path, LUCID_ST_CRC_KEY, whole_s);
    int n = lucid_safetensors_count(f);
    uLong all = crc32(0L, Z_NULL, 0);
    uint64_t size = 0;
    int bad = 0, first_bad = -1;
    uint32_t first_got = 0, first_want = 0;
    const char *p = list;
    for (int i = 0; i < n; i++) {
        const lucid_st_info *in = lucid_safetensors_info(f, i);
        size_t nb = (size_t)(in->end - in->begin);
        uint32_t c = lucid_crc32(0, lucid_safetensors_bytes(f, i), nb);
        all = crc32_combine(all, c, (z_off_t)nb);
        size = in->end;
        if (!list) continue;
        uint32_t want;
        if (parse_crc(p, 0, &want) || (p[8] != ' ' && p[8] != '\0') ||
            (p[8] == '\0' && i != n - 1))
            return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                                "%s: __metadata__ %s must hold %d CRC-32s (8 "
                                "hex digits each, separated by spaces, in "
                                "data-offset order); entry %d is malformed "
                                "or missing",
                                path, LUCID_ST_CRC_TENSORS_KEY, n, i + 1);
        p += p[8] ? 9 : 8;
        if (c != want && bad++ == 0) {
            first_bad = i;
            first_got = c;
            first_want = want;
        }
    }
    if (list && *p)
        return lucid_seterr(ctx, LUCID_ERR_FORMAT,
                            "%s: __metadata__ %s holds more than the %d "
                            "CRC-32s of the file's tensors",
                            path, LUCID_ST_CRC_TENSORS_KEY, n);
    if (bad) {
        const lucid_st_info *in = lucid_safetensors_info(f, first_bad);
        char more[64] = "";
        if (bad > 1) snprintf(more, sizeof more, " (and %d more tensors)", bad - 1);
        return lucid_seterr(
            ctx, LUCID_ERR_FORMAT,
            "%s: checksum mismatch: tensor '%s' (bytes [%llu, %llu) of the "
            "data section, file offsets [%llu, %llu)) has CRC-32 %08x, the "
            "header records %08x%s: the file is corrupt (changed on disk or "
            "in a copy); use another copy",
            path, in->name, (unsigned long long)in->begin,
            (unsigned long long)in->end,
            (unsigned long long)(lucid_safetensors_data_offset(f) + in->begin),
            (unsigned long long)(lucid_safetensors_data_offset(f) + in->end),
            (unsigned)first_got, (unsigned)first_want, more);
    }
    if (whole_s && (uint32_t)all != want_all)
        return lucid_seterr(
            ctx, LUCID_ERR_FORMAT,
            "%s: checksum mismatch: the data section (bytes [0, %llu), file "
            "offsets [%llu, %llu)) has CRC-32 %08x, the header records %08x "
            "(%s): the file is corrupt (changed on disk or in a copy); use "
            "another copy",
            path, (unsigned long long)size,
            (unsigned long long)lucid_safetensors_data_offset(f),
            (unsigned long long)(lucid_safetensors_data_offset(f) + size),
            (unsigned)all, (unsigned)want_all,
            list ? "every tensor matches its own CRC-32: the header's "
                   "checksums disagree"
                 : "no per-tensor checksums to narrow it down");
    return LUCID_OK;
}
