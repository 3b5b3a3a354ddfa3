/*
 * hsv_pixel.h — private: RandomHSV per pixel (Ultralytics data/augment.py
 * RandomHSV, in OpenCV's 8-bit HSV), shared by the CPU augmentation
 * (augment.c), the CPU input reference (input.c) and the device input kernel
 * (cuda/input.cu), so the host and the device run the same source: a
 * CPU-HSV batch and a device-HSV batch are byte-identical.
 *
 * Contract
 *   - Tables of one image (gains r_h, r_s, r_v as double):
 *       lut_h[x] = (uint8) (int) ((x + r_h*180) mod 180)  (+180 when < 0)
 *       lut_s[x] = (uint8) (int) clip(x * (1 + r_s), 0, 255), lut_s[0] = 0
 *       lut_v[x] = (uint8) (int) clip(x * (1 + r_v), 0, 255)
 *     and OpenCV's RGB2HSV_b division tables (hsv_shift 12, hrange 180):
 *       sdiv[i] = round((255 << 12) / i), hdiv[i] = round((180 << 12) / (6 i)),
 *       both 0 at i = 0 (round to nearest even).
 *     Every double operation is written out once (no FMA contraction on the
 *     device: __dadd_rn / __dmul_rn / __ddiv_rn; the host C build is ISO C11,
 *     where GCC does not contract), so both sides compute the same bits.
 *   - Pixel: RGB -> HSV exactly as OpenCV's RGB2HSV_b (integer), the LUTs,
 *     HSV -> RGB with OpenCV's HSV2RGB_b sector table evaluated in exact
 *     integer arithmetic rounded to nearest (255 v (1 - s f) = V - V S f30 /
 *     (255*30), f30 = H mod 30), which can differ from OpenCV's float path by
 *     1 in rare ties. A gray pixel (r = g = b) maps to lut_v[r] (s = 0 stays 0).
 *   - Integer code only after the tables: no rounding-mode or compiler
 *     dependence.
 */
#ifndef LUCID_DATA_HSV_PIXEL_H
#define LUCID_DATA_HSV_PIXEL_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LUCID_HSV_FN static __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define LUCID_HSV_FN static inline __attribute__((always_inline))
#else
#define LUCID_HSV_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define LUCID_HSV_ADD(a, b) __dadd_rn((a), (b))
#define LUCID_HSV_MUL(a, b) __dmul_rn((a), (b))
#define LUCID_HSV_DIV(a, b) __ddiv_rn((a), (b))
#define LUCID_HSV_RINT(a) __double2int_rn(a)
#else
#define LUCID_HSV_ADD(a, b) ((a) + (b))
#define LUCID_HSV_MUL(a, b) ((a) * (b))
#define LUCID_HSV_DIV(a, b) ((a) / (b))
#define LUCID_HSV_RINT(a) ((int)lrint(a))
#endif

typedef struct lucid_hsv_tables {
    int sdiv[256], hdiv[256];
    uint8_t lut_h[256], lut_s[256], lut_v[256];
} lucid_hsv_tables;

/* Entry i of the three tables that do not depend on the gains. */
LUCID_HSV_FN int lucid_hsv_sdiv(int i) {
    return i == 0 ? 0 : LUCID_HSV_RINT(LUCID_HSV_DIV((double)(255 << 12), (double)i));
}
LUCID_HSV_FN int lucid_hsv_hdiv(int i) {
    return i == 0 ? 0
                  : LUCID_HSV_RINT(LUCID_HSV_DIV((double)(180 << 12),
                                                 LUCID_HSV_MUL(6.0, (double)i)));
}

/* Entry x of the gain LUTs. */
LUCID_HSV_FN uint8_t lucid_hsv_lut_h(int x, double rh) {
    double h = fmod(LUCID_HSV_ADD((double)x, LUCID_HSV_MUL(rh, 180.0)), 180.0);
    if (h < 0) h = LUCID_HSV_ADD(h, 180.0);
    return (uint8_t)(int)h;
}
/* lut_s (with x = 0 -> 0, the sat[0] rule) and lut_v share the clip. */
LUCID_HSV_FN uint8_t lucid_hsv_lut_clip(int x, double r) {
    double v = LUCID_HSV_MUL((double)x, LUCID_HSV_ADD(1.0, r));
    return (uint8_t)(int)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

/* All tables for gains (rh, rs, rv) on the host. */
static inline void lucid_hsv_tables_init(lucid_hsv_tables *t, double rh,
                                         double rs, double rv) {
    for (int x = 0; x < 256; x++) {
        t->sdiv[x] = lucid_hsv_sdiv(x);
        t->hdiv[x] = lucid_hsv_hdiv(x);
        t->lut_h[x] = lucid_hsv_lut_h(x, rh);
        t->lut_s[x] = lucid_hsv_lut_clip(x, rs);
        t->lut_v[x] = lucid_hsv_lut_clip(x, rv);
    }
    t->lut_s[0] = 0;
}

/* One pixel (see the top comment). The table pointers may be the fields of
 * one lucid_hsv_tables or arrays in device shared memory. */
LUCID_HSV_FN void lucid_hsv_pixel_t(const int *sdiv, const int *hdiv,
                                    const uint8_t *lut_h, const uint8_t *lut_s,
                                    const uint8_t *lut_v, int r, int g, int b,
                                    uint8_t *R, uint8_t *G, uint8_t *B) {
    if (r == g && g == b) { /* gray: s = 0 stays 0 (sat[0] = 0) */
        *R = *G = *B = lut_v[r];
        return;
    }
    int v = r > g ? r : g;
    v = v > b ? v : b;
    int vmin = r < g ? r : g;
    vmin = vmin < b ? vmin : b;
    int diff = v - vmin;
    int vr = v == r ? -1 : 0, vg = v == g ? -1 : 0;
    int s = (diff * sdiv[v] + (1 << 11)) >> 12;
    int h = (vr & (g - b)) +
            (~vr & ((vg & (b - r + 2 * diff)) + ((~vg) & (r - g + 4 * diff))));
    h = (h * hdiv[diff] + (1 << 11)) >> 12;
    h += h < 0 ? 180 : 0;
    int H = lut_h[h], S = lut_s[s], V = lut_v[v];
    if (S == 0) {
        *R = *G = *B = (uint8_t)V;
        return;
    }
    int f = (int)((unsigned)H % 30u);
    /* OpenCV sector_data {1,3,0},{1,0,2},{3,0,1},{0,2,1},{0,1,3},{2,1,0}:
     * b, g, r = tab[sd[0]], tab[sd[1]], tab[sd[2]] with tab = {V, t1, t2, t3};
     * here per sector the tab index of R | G << 2 | B << 4, six bits each
     * (branch-free: the sector is data-dependent, a switch mispredicts) */
    const uint64_t codes = 28ull | 18ull << 6 | 49ull << 12 | 9ull << 18 |
                           7ull << 24 | 36ull << 30;
    int c = (int)((codes >> (6u * ((unsigned)H / 30u % 6u))) & 63);
    int tab[4];
    tab[0] = V;
    tab[1] = (2 * V * (255 - S) + 255) / 510;
    tab[2] = (2 * V * (7650 - S * f) + 7650) / 15300;
    tab[3] = (2 * V * (7650 - S * (30 - f)) + 7650) / 15300;
#if defined(__CUDA_ARCH__)
    /* selects instead of a dynamically indexed (local-memory) array */
#define LUCID_HSV_SEL(i) ((i) == 0 ? tab[0] : (i) == 1 ? tab[1] : (i) == 2 ? tab[2] : tab[3])
    *R = (uint8_t)LUCID_HSV_SEL(c & 3);
    *G = (uint8_t)LUCID_HSV_SEL((c >> 2) & 3);
    *B = (uint8_t)LUCID_HSV_SEL(c >> 4);
#undef LUCID_HSV_SEL
#else
    *R = (uint8_t)tab[c & 3];
    *G = (uint8_t)tab[(c >> 2) & 3];
    *B = (uint8_t)tab[c >> 4];
#endif
}

LUCID_HSV_FN void lucid_hsv_pixel(const lucid_hsv_tables *t, int r, int g,
                                  int b, uint8_t *R, uint8_t *G, uint8_t *B) {
    lucid_hsv_pixel_t(t->sdiv, t->hdiv, t->lut_h, t->lut_s, t->lut_v, r, g, b,
                      R, G, B);
}

#endif /* LUCID_DATA_HSV_PIXEL_H */
