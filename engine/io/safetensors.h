/*
 * safetensors.h — safetensors checkpoints (reader, writer) and atomic file
 * writes (DESIGN.md decisions 7 and 8).
 *
 * Format (https://github.com/huggingface/safetensors): 8-byte little-endian
 * header length N; N bytes of UTF-8 JSON: an object mapping each tensor
 * name to {"dtype": "F32"|"F64"|"BF16"|"F16"|"U8"|"I32"|"I64", "shape":
 * [..], "data_offsets": [begin, end]} (offsets relative to the data
 * section, end exclusive) plus an optional "__metadata__" object of string
 * values; then the data section of raw little-endian bytes.
 *
 * Contract
 *   - The reader validates every field before any tensor is used: header
 *     length inside the file, JSON object, known dtype, integer shape
 *     (<= 8 dims, non-negative), offsets inside the data section,
 *     end - begin == numel * dtype size, no overlaps, no holes, no duplicate
 *     names, metadata values strings. Errors are LUCID_ERR_FORMAT (or
 *     LUCID_ERR_IO for open/read) and name the file and the tensor.
 *   - The writer snapshots tensors when they are added (copied to host
 *     memory, any device, contiguous) and saves through the atomic writer:
 *     a failed or interrupted save never replaces an existing good file.
 *     Tensors are laid out in the order added; the header is padded with
 *     spaces to a multiple of 8 bytes.
 *   - Little-endian hosts only (x86-64, aarch64).
 */
#ifndef LUCID_IO_SAFETENSORS_H
#define LUCID_IO_SAFETENSORS_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ atomic file */

typedef struct lucid_atomic_file lucid_atomic_file;

/* Temp file in the target's directory. */
lucid_status lucid_atomic_file_open(lucid_ctx *ctx, const char *path,
                                    lucid_atomic_file **out);
lucid_status lucid_atomic_file_write(lucid_ctx *ctx, lucid_atomic_file *f,
                                     const void *data, size_t n);
/* fsync, close, rename over the target, fsync the directory; frees f
 * (on failure too, removing the temp file). */
lucid_status lucid_atomic_file_commit(lucid_ctx *ctx, lucid_atomic_file *f);
/* Drop the temp file; the target is untouched. Frees f. */
void lucid_atomic_file_abort(lucid_atomic_file *f);
/* open + write + commit of one buffer. */
lucid_status lucid_atomic_write(lucid_ctx *ctx, const char *path,
                                const void *data, size_t n);
/* Remove the temporary files a killed writer left for `path`
 * ("<dir>/.<name>.tmp.XXXXXX", the names lucid_atomic_file_open makes);
 * *removed: how many.  Call it only while no write to `path` is in flight
 * (the trainer does at the start of a fit, after checkpoint.wait()).
 * Errors: LUCID_ERR_IO naming the folder or file (a missing folder is not
 * an error), LUCID_ERR_ARG for an empty path. */
lucid_status lucid_atomic_file_remove_stale(lucid_ctx *ctx, const char *path,
                                            int *removed);
/* Tests: hook asked before each stage ("open", "write", "fsync",
 * "rename") on the writing thread; non-zero fails it with the errno the
 * hook set (EIO if it left errno 0). NULL removes it. Process-wide; change
 * it only while no write is in flight. */
void lucid_atomic_file_set_fail_hook(int (*hook)(const char *stage, void *ud),
                                     void *ud);

/* ------------------------------------------------------------ reader */

typedef struct lucid_st_info {
    const char *name;
    lucid_dtype dtype;
    int ndim;
    int64_t shape[LUCID_MAX_DIMS];
    uint64_t begin, end;       /* byte offsets in the data section */
} lucid_st_info;

typedef struct lucid_safetensors lucid_safetensors;

/* Read and validate the whole file. */
lucid_status lucid_safetensors_open(lucid_ctx *ctx, const char *path,
                                    lucid_safetensors **out);
void lucid_safetensors_close(lucid_safetensors *f);
const char *lucid_safetensors_path(const lucid_safetensors *f);
int lucid_safetensors_count(const lucid_safetensors *f);
/* Tensors in data-offset order. */
const lucid_st_info *lucid_safetensors_info(const lucid_safetensors *f, int i);
/* Index of a tensor name, or -1. */
int lucid_safetensors_find(const lucid_safetensors *f, const char *name);
/* File offset of the data section (8 + header length): tensor i's bytes
 * are at file offsets [data_offset + begin, data_offset + end). */
uint64_t lucid_safetensors_data_offset(const lucid_safetensors *f);
/* The whole file as read (size: data offset + data section). */
const unsigned char *lucid_safetensors_buffer(const lucid_safetensors *f);
/* Writer side of header_crc32: given the encoded header (8-byte length,
 * JSON, padding; n bytes) holding "header_crc32":"00000000", writes the
 * CRC-32 of those bytes into the 8 digits. */
void lucid_st_header_crc_fill(unsigned char *hdr, size_t n);
/* Raw bytes of tensor i (end - begin bytes; may be unaligned). */
const void *lucid_safetensors_bytes(const lucid_safetensors *f, int i);
/* Copy tensor `name` into dst (any device; dst's shape must equal the
 * stored shape, or both be contiguous with equal numel; float dtypes are
 * converted, other dtypes must match). Errors name the file and tensor. */
lucid_status lucid_safetensors_load(lucid_ctx *ctx, lucid_safetensors *f,
                                    const char *name, lucid_tensor *dst);
/* Metadata map. */
int lucid_safetensors_metadata_count(const lucid_safetensors *f);
const char *lucid_safetensors_metadata_key(const lucid_safetensors *f, int i);
/* Value of key, or NULL. */
const char *lucid_safetensors_metadata_get(const lucid_safetensors *f,
                                           const char *key);

/* ------------------------------------------------------------ checksums
 *
 * The writer stores two __metadata__ entries (reserved: set_metadata
 * refuses them):
 *   data_crc32          the CRC-32 (zlib's; Python zlib.crc32) of the whole
 *                       data section, 8 lowercase hex digits
 *   data_crc32_tensors  the CRC-32 of each tensor's bytes, in data-offset
 *                       order, 8 hex digits each separated by one space
 *                       (so a mismatch names the tensor)
 * lucid_safetensors_open verifies them when present and fails with
 * LUCID_ERR_FORMAT naming the file, the first tensor whose bytes changed,
 * its byte range in the data section and in the file, and the two CRCs.
 * A file without them (PyTorch's safetensors, older lucid files) opens
 * unverified. header_crc32 (below) covers the header itself. */
#define LUCID_ST_CRC_KEY "data_crc32"
#define LUCID_ST_CRC_TENSORS_KEY "data_crc32_tensors"
/* header_crc32: the CRC-32 of the header (the 8-byte length, the JSON and
 * its padding) with these 8 digits read as "00000000": a changed metadata
 * value, tensor name, shape, dtype or offset is caught too.  Verified
 * when present, like the two above. */
#define LUCID_ST_HEADER_CRC_KEY "header_crc32"

/* CRC-32 of n bytes continuing `crc` (start with 0); any length. */
uint32_t lucid_crc32(uint32_t crc, const void *data, size_t n);
/* Check the stored checksums (done by lucid_safetensors_open); LUCID_OK
 * when they match or are absent. */
lucid_status lucid_safetensors_verify(lucid_ctx *ctx, const lucid_safetensors *f);
/* 1 when the file carries checksums (and, being open, matched them). */
int lucid_safetensors_checksummed(const lucid_safetensors *f);
/* The writer's two entries for n tensors of nbytes[i] bytes at data[i]:
 * whole = 8 hex digits + NUL, *list = malloc'd "xxxxxxxx xxxxxxxx ...". */
lucid_status lucid_st_checksum_strings(lucid_ctx *ctx, int n,
                                       const void *const *data,
                                       const size_t *nbytes, char whole[9],
                                       char **list);

/* ------------------------------------------------------------ writer */

typedef struct lucid_st_writer lucid_st_writer;

lucid_status lucid_st_writer_create(lucid_ctx *ctx, lucid_st_writer **out);
void lucid_st_writer_free(lucid_st_writer *w);
/* Snapshot t (any device/dtype of the seven; copied now). Names must be
 * unique, non-empty and not "__metadata__". */
lucid_status lucid_st_writer_add(lucid_ctx *ctx, lucid_st_writer *w,
                                 const char *name, const lucid_tensor *t);
/* Raw little-endian bytes of a tensor (copied). */
lucid_status lucid_st_writer_add_raw(lucid_ctx *ctx, lucid_st_writer *w,
                                     const char *name, lucid_dtype dt,
                                     int ndim, const int64_t *shape,
                                     const void *data);
/* Set (or replace) one metadata string; the checksum keys are reserved
 * (LUCID_ERR_ARG): the writer fills them at save. */
lucid_status lucid_st_writer_set_metadata(lucid_ctx *ctx, lucid_st_writer *w,
                                          const char *key, const char *value);
/* Write everything atomically to path. The writer stays usable.
 * = lucid_st_writer_encode + lucid_st_writer_write_file. */
lucid_status lucid_st_writer_save(lucid_ctx *ctx, lucid_st_writer *w,
                                  const char *path);
/* The file's first bytes: the 8-byte length, the JSON header (metadata with
 * the two checksum entries, computed here over every tensor's bytes: the
 * CPU-heavy part of a save) padded with spaces to a multiple of 8.
 * *hdr is malloc'd (the caller frees it), *hdr_len its size in bytes.
 * Errors: LUCID_ERR_OOM. Touches no file and no device. */
lucid_status lucid_st_writer_encode(lucid_ctx *ctx, const lucid_st_writer *w,
                                    unsigned char **hdr, size_t *hdr_len);
/* Write hdr (from lucid_st_writer_encode of the same writer) and the data
 * section to path through the atomic writer (temporary file, fsync,
 * rename, directory fsync). Calling it for several paths with one encoded
 * header gives byte-identical, independent files. Errors: LUCID_ERR_IO
 * naming path and the failing call; the previous file stays intact. */
lucid_status lucid_st_writer_write_file(lucid_ctx *ctx, const lucid_st_writer *w,
                                        const unsigned char *hdr, size_t hdr_len,
                                        const char *path);
/* Sum of the tensors' byte sizes (the data section). */
size_t lucid_st_writer_data_bytes(const lucid_st_writer *w);

/* Snapshot blocks (engine/io/st_snapshot.c): the writer takes ownership of
 * a malloc'd block (freed with the writer; freed at once if this fails), and
 * a tensor whose bytes lie inside an adopted block can be added without a
 * copy (the same checks as add_raw). */
lucid_status lucid_st_writer_adopt_block(lucid_ctx *ctx, lucid_st_writer *w,
                                         void *block);
lucid_status lucid_st_writer_add_borrowed(lucid_ctx *ctx, lucid_st_writer *w,
                                          const char *name, lucid_dtype dt,
                                          int ndim, const int64_t *shape,
                                          const void *data);
/* Snapshot n tensors (any devices, any dtypes of the seven) under names,
 * in that order, with as few device->host copies as possible: contiguous
 * tensors that share a storage and lie close together (gaps <= 64 KiB) are
 * copied as one byte range into one block; the others one by one
 * (lucid_st_writer_add). When it returns LUCID_OK the writer holds host
 * copies of every tensor (the device is synchronized) and the tensors may
 * change. Errors: as lucid_st_writer_add (name checks, device copy, OOM);
 * on failure the writer holds a prefix of the tensors (free it). */
lucid_status lucid_st_writer_add_tensors(lucid_ctx *ctx, lucid_st_writer *w,
                                         int n, const char *const *names,
                                         const lucid_tensor *const *tensors);

/* "F32", "F64", "BF16", "F16", "U8", "I32", "I64"; parse returns 0 / -1. */
const char *lucid_st_dtype_name(lucid_dtype dt);
int lucid_st_dtype_parse(const char *s, lucid_dtype *out);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_IO_SAFETENSORS_H */
