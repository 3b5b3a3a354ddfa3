/*
 * dtype.c — element types: sizes, names, parsing and scalar conversions.
 *
 * bf16 is the top half of an IEEE binary32; f16 is IEEE 754-2008 binary16.
 * Both conversions from f32 round to nearest even, keep NaN a (quiet) NaN
 * and overflow to Inf, as CUDA's __float2bfloat16_rn / __float2half_rn do,
 * so the CPU reference and the GPU agree bit for bit.
 */
#include "internal.h"
#include <string.h>

size_t lucid_dtype_size(lucid_dtype dt) {
    switch (dt) {
    case LUCID_F32: return 4;
    case LUCID_F64: return 8;
    case LUCID_BF16: return 2;
    case LUCID_F16: return 2;
    case LUCID_U8: return 1;
    case LUCID_I32: return 4;
    case LUCID_I64: return 8;
    default: return 0;
    }
}

const char *lucid_dtype_name(lucid_dtype dt) {
    switch (dt) {
    case LUCID_F32: return "f32";
    case LUCID_F64: return "f64";
    case LUCID_BF16: return "bf16";
    case LUCID_F16: return "f16";
    case LUCID_U8: return "u8";
    case LUCID_I32: return "i32";
    case LUCID_I64: return "i64";
    default: return "?";
    }
}

int lucid_dtype_is_float(lucid_dtype dt) {
    return dt == LUCID_F32 || dt == LUCID_F64 || dt == LUCID_BF16 ||
           dt == LUCID_F16;
}

int lucid_dtype_parse(const char *name, lucid_dtype *out) {
    static const struct { const char *name; lucid_dtype dt; } names[] = {
        {"f32", LUCID_F32},      {"float32", LUCID_F32}, {"float", LUCID_F32},
        {"f64", LUCID_F64},      {"float64", LUCID_F64}, {"double", LUCID_F64},
        {"bf16", LUCID_BF16},    {"bfloat16", LUCID_BF16},
        {"f16", LUCID_F16},      {"float16", LUCID_F16}, {"half", LUCID_F16},
        {"u8", LUCID_U8},        {"uint8", LUCID_U8},
        {"i32", LUCID_I32},      {"int32", LUCID_I32},
        {"i64", LUCID_I64},      {"int64", LUCID_I64},
    };
    if (!name) return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].dt;
            return 0;
        }
    return -1;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t lucid_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

float lucid_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t lucid_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: Inf */
    if (absu < 0x38800000u) {                  /* below 2^-14: subnormal or 0 */
        if (absu < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = absu >> 23;               /* biased exponent 102..112 */
        uint32_t m = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;             /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits */
    uint32_t r = absu - 0x38000000u;           /* subtract (127-15) << 23 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

float lucid_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        /* subnormal: m * 2^-24 */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
