/*
 * test_loss_topk_emu.cu — host emulation of the pose loss's spread top-k
 * (k_topk2, cuda/loss.cu) with its own pieces (cuda/loss_topk.cuh): needs
 * nvcc, not a GPU (runs in make test).
 *
 *   - rectangles: for every level and every cell, "inside the rectangle of
 *     tk_bound" equals the assigner's inside test (loss.cu inside(), the
 *     same float expressions), for random boxes, boxes whose sides sit on
 *     cell centres, one ulp either side of them and 1e-9 off, zero-size,
 *     off-image, huge, infinite and NaN sides, odd strides and level sizes
 *     (and strides near 1e-9, where the test's threshold decides);
 *   - tk_cell_anchor walks the rectangles' cells in index order and
 *     tk_outside gives the anchors outside them in index order (against a
 *     scan of all anchors);
 *   - the selection: k_topk2's slices (tk_slice over LPL_TK_BPG blocks of
 *     8 warps of 32 lanes per gt, the busy blocks only), per-lane lists
 *     (tk_insert / tk_pop), warp rounds, block merges and the last merge
 *     with the outside list, emulated lane by lane, give exactly the first k anchors of a sort of ALL
 *     anchors by (metric desc, index asc), for metrics with many exact ties
 *     (a few values, +0.0 on many candidates, denormals), k = 1 .. 16.
 */
#include "loss_topk.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#define TAP_HOST_SEED 0x5eed70f1c0ffee11ull
#include "tap_host.h"

/* k_topk2's shape (cuda/loss.cu) */
static const int BPG = 8, WPB = 8, W = BPG * WPB;

struct Level {
    int w, h;
    float s;
};

/* loss.cu inside(): the running minimum, NaN e never replacing d */
static bool inside_ref(const float *cd, float px, float py) {
    float d = px - cd[0], e;
    if ((e = py - cd[1]) < d) d = e;
    if ((e = cd[2] - px) < d) d = e;
    if ((e = cd[3] - py) < d) d = e;
    return d > 1e-9f;
}

static TkRects make_rects(const std::vector<Level> &L, const float *cd) {
    TkRects R;
    memset(&R, 0, sizeof R);
    R.nlev = (int)L.size();
    int off = 0;
    for (int l = 0; l < R.nlev; l++) {
        R.off[l] = off;
        R.w[l] = L[l].w;
        R.j0[l] = tk_bound(0, cd, L[l].w, L[l].h, L[l].s);
        R.i0[l] = tk_bound(1, cd, L[l].w, L[l].h, L[l].s);
        R.j1[l] = tk_bound(2, cd, L[l].w, L[l].h, L[l].s);
        R.i1[l] = tk_bound(3, cd, L[l].w, L[l].h, L[l].s);
        R.n[l] = tk_rect_cells(R.i0[l], R.i1[l], R.j0[l], R.j1[l]);
        off += L[l].w * L[l].h;
    }
    for (int l = R.nlev; l <= TK_MAX_LEVELS; l++) R.off[l] = off;
    return R;
}

/* candidate flags of every anchor by the inside test */
static std::vector<char> cand_ref(const std::vector<Level> &L, const float *cd) {
    std::vector<char> c;
    for (const Level &v : L)
        for (int i = 0; i < v.h; i++)
            for (int j = 0; j < v.w; j++)
                c.push_back(inside_ref(cd, tk_mul((float)j + 0.5f, v.s),
                                       tk_mul((float)i + 0.5f, v.s)));
    return c;
}

static float nudge(float x, int ulps) {
    for (; ulps > 0; ulps--) x = nextafterf(x, INFINITY);
    for (; ulps < 0; ulps++) x = nextafterf(x, -INFINITY);
    return x;
}

/* a box side: random, on a cell centre (+- ulps, +- 1e-9), or special */
static float side_value(const std::vector<Level> &L, int kind) {
    const Level &v = L[(int)urand(0, (double)L.size() - 1e-9)];
    const float ctr = tk_mul((float)(int)urand(-2, v.w + 2) + 0.5f, v.s);
    switch (kind) {
    case 0: return (float)urand(-40, 700);
    case 1: return ctr;
    case 2: return nudge(ctr, urand(0, 1) < 0.5 ? -1 : 1);
    case 3: return nudge(ctr, (int)urand(-3, 4));
    case 4: return ctr + (urand(0, 1) < 0.5 ? -1e-9f : 1e-9f);
    case 5: return std::numeric_limits<float>::quiet_NaN();
    case 6: return urand(0, 1) < 0.5 ? INFINITY : -INFINITY;
    default: return urand(0, 1) < 0.5 ? 3e38f : -3e38f;
    }
}

static void random_box(const std::vector<Level> &L, float *cd, int special) {
    for (int q = 0; q < 4; q++) {
        int kind = (int)urand(0, 5);
        if (special && urand(0, 1) < 0.15) kind = 5 + (int)urand(0, 3);
        cd[q] = side_value(L, kind);
    }
    if (urand(0, 1) < 0.7) { /* mostly proper boxes */
        if (cd[0] > cd[2]) std::swap(cd[0], cd[2]);
        if (cd[1] > cd[3]) std::swap(cd[1], cd[3]);
    }
    if (urand(0, 1) < 0.05) cd[2] = cd[0], cd[3] = cd[1]; /* zero size */
}

static std::vector<std::vector<Level>> level_sets() {
    return {{{80, 80, 8.0f}, {40, 40, 16.0f}, {20, 20, 32.0f}},
            {{8, 8, 8.0f}, {4, 4, 16.0f}, {2, 2, 32.0f}},
            {{13, 7, 7.3f}, {7, 4, 14.6f}},
            {{1, 1, 8.0f}},
            {{6, 5, 4e-10f}, {3, 3, 8e-10f}}, /* the 1e-9 threshold matters */
            {{40, 24, 8.0f}, {20, 12, 16.0f}, {10, 6, 32.0f}, {5, 3, 64.0f}}};
}

/* ---------------------------------------------------------------- rects */

static void test_rects(void) {
    auto sets = level_sets();
    long cells = 0, bad = 0, boxes = 0;
    char first[256] = "";
    for (size_t si = 0; si < sets.size(); si++) {
        const auto &L = sets[si];
        for (int it = 0; it < 4000; it++, boxes++) {
            float cd[4];
            random_box(L, cd, it % 3 == 0);
            const TkRects R = make_rects(L, cd);
            const std::vector<char> c = cand_ref(L, cd);
            int a = 0;
            for (int l = 0; l < R.nlev; l++)
                for (int i = 0; i < L[l].h; i++)
                    for (int j = 0; j < L[l].w; j++, a++, cells++) {
                        const bool in = R.n[l] > 0 && i >= R.i0[l] &&
                                        i <= R.i1[l] && j >= R.j0[l] &&
                                        j <= R.j1[l];
                        if (in != (bool)c[a] && !bad++)
                            snprintf(first, sizeof first,
                                     "set %zu box (%.9g %.9g %.9g %.9g) level %d "
                                     "cell (%d, %d): rect %d test %d",
                                     si, cd[0], cd[1], cd[2], cd[3], l, i, j,
                                     in, c[a]);
                    }
        }
    }
    ok(bad == 0, NAME("rectangles = inside test (%ld boxes, %ld cells)", boxes, cells),
       WHY("%ld cells differ; first: %s", bad, first));
}

/* ------------------------------------------------- cell and outside walks */

static void test_walks(void) {
    auto sets = level_sets();
    long bad_cell = 0, bad_out = 0, n = 0;
    for (const auto &L : sets)
        for (int it = 0; it < 1500; it++, n++) {
            float cd[4];
            random_box(L, cd, it % 4 == 0);
            const TkRects R = make_rects(L, cd);
            std::vector<int> in, out;
            int a = 0;
            for (int l = 0; l < R.nlev; l++)
                for (int i = 0; i < L[l].h; i++)
                    for (int j = 0; j < L[l].w; j++, a++) {
                        const bool r = R.n[l] > 0 && i >= R.i0[l] &&
                                       i <= R.i1[l] && j >= R.j0[l] &&
                                       j <= R.j1[l];
                        (r ? in : out).push_back(a);
                    }
            for (size_t e = 0; e <= in.size(); e++)
                bad_cell += tk_cell_anchor(R, (int)e) !=
                            (e < in.size() ? in[e] : -1);
            for (size_t t = 0; t <= out.size() && t < 80; t++)
                bad_out += tk_outside(R, (int)t) !=
                           (t < out.size() ? out[t] : -1);
        }
    ok(bad_cell == 0, NAME("tk_cell_anchor walks the rectangles in index order (%ld boxes)", n),
       WHY("%ld cells wrong", bad_cell));
    ok(bad_out == 0, NAME("tk_outside lists the other anchors in index order (%ld boxes)", n),
       WHY("%ld anchors wrong", bad_out));
}

/* ------------------------------------------------------------ selection */

/* warp_max_key over 32 lanes */
static tk_key_t wmax(const tk_key_t *v) {
    tk_key_t m = 0;
    for (int l = 0; l < 32; l++) m = std::max(m, v[l]);
    return m;
}

/* tk_merge: nl lists of stride k, lane l owning list l; out[r], r < k */
static void merge(const tk_key_t *lst, int nl, int k, tk_key_t *out) {
    int h[32] = {0};
    tk_key_t cur[32];
    for (int l = 0; l < 32; l++) cur[l] = l < nl ? lst[l * k] : 0;
    for (int r = 0; r < 32; r++) out[r] = 0;
    for (int r = 0; r < k; r++) {
        const tk_key_t m = wmax(cur);
        if (m == 0) break;
        out[r] = m;
        for (int l = 0; l < 32; l++)
            if (cur[l] == m) cur[l] = ++h[l] < k ? lst[l * k + h[l]] : 0;
    }
}

static long multi_block = 0; /* emulated gts with several busy blocks */

/* k_topk2 for one gt, lane by lane: returns the top-k anchors (-1: none) */
static std::vector<int> topk2_emu(const TkRects &R, const std::vector<float> &al,
                                  int k) {
    int N = 0;
    for (int l = 0; l < TK_MAX_LEVELS; l++) N += R.n[l];
    const int sw = tk_slice(N, W);
    const int nb = (N + WPB * sw - 1) / (WPB * sw); /* busy blocks */
    const int nl = nb > 1 ? nb : 1;
    multi_block += nb > 1;
    std::vector<tk_key_t> blk(nl * k);
    for (int c = 0; c < nl; c++) {
        std::vector<tk_key_t> wl(WPB * k);
        for (int wid = 0; wid < WPB; wid++) {
            const int e0 = (c * WPB + wid) * sw;
            const int e1 = std::min(N, e0 + sw);
            tk_key_t L[32][TK_KR] = {{0}};
            for (int lane = 0; lane < 32; lane++)
                for (int e = e0 + lane; e < e1; e += 32) {
                    const int a = tk_cell_anchor(R, e);
                    tk_insert(L[lane], tk_key(al[a], a));
                }
            tk_key_t mine[32] = {0};
            for (int r = 0; r < k; r++) {
                tk_key_t head[32];
                for (int l = 0; l < 32; l++) head[l] = L[l][0];
                const tk_key_t m = wmax(head);
                if (m == 0) break;
                mine[r] = m;
                for (int l = 0; l < 32; l++)
                    if (L[l][0] == m) tk_pop(L[l]);
            }
            for (int r = 0; r < k; r++) wl[wid * k + r] = mine[r];
        }
        tk_key_t out[32];
        merge(wl.data(), WPB, k, out);
        for (int r = 0; r < k; r++) blk[c * k + r] = out[r];
    }
    std::vector<tk_key_t> fin(blk);
    for (int t = 0; t < k; t++) {
        const int a = tk_outside(R, t);
        fin.push_back(a >= 0 ? tk_key(0.0f, a) : 0);
    }
    tk_key_t out[32];
    merge(fin.data(), nl + 1, k, out);
    std::vector<int> sel(k);
    for (int r = 0; r < k; r++) sel[r] = out[r] ? tk_anchor(out[r]) : -1;
    return sel;
}

/* the reference: all anchors sorted by (metric desc, index asc) */
static std::vector<int> topk_ref(const std::vector<float> &al, int k) {
    std::vector<int> idx(al.size());
    for (size_t a = 0; a < al.size(); a++) idx[a] = (int)a;
    std::stable_sort(idx.begin(), idx.end(),
                     [&](int x, int y) { return al[x] > al[y]; });
    std::vector<int> sel(k, -1);
    for (int r = 0; r < k && r < (int)idx.size(); r++) sel[r] = idx[r];
    return sel;
}

static void test_selection(void) {
    auto sets = level_sets();
    const float vals[] = {0.0f, 0.0f, 0.0f, 1e-40f, 0.125f, 0.125f, 0.5f,
                          0.5f, 1.0f, 0.3f};
    long runs = 0, bad = 0;
    char first[512] = "";
    for (size_t si = 0; si < sets.size(); si++) {
        const auto &L = sets[si];
        for (int it = 0; it < 700; it++) {
            float cd[4];
            random_box(L, cd, it % 5 == 0);
            if (it % 7 == 0) { /* a big box: many candidates */
                cd[0] = (float)urand(-50, 60), cd[1] = (float)urand(-50, 60);
                cd[2] = (float)urand(300, 700), cd[3] = (float)urand(300, 700);
            }
            const TkRects R = make_rects(L, cd);
            const std::vector<char> c = cand_ref(L, cd);
            const int mode = it % 4; /* 0 ties, 1 zeros, 2 distinct, 3 few */
            std::vector<float> al(c.size(), 0.0f);
            for (size_t a = 0; a < c.size(); a++) {
                if (!c[a]) continue; /* pair(): +0.0 off the candidates */
                if (mode == 1) continue;
                if (mode == 3 && urand(0, 1) < 0.9) continue;
                al[a] = mode == 2 ? (float)urand(0, 1)
                                  : vals[(int)urand(0, 10 - 1e-9)];
            }
            for (int k = 1; k <= TK_KR; k += (k < 4 ? 1 : 3)) {
                if (k > (int)al.size()) break; /* plan_create: topk <= A */
                runs++;
                const std::vector<int> got = topk2_emu(R, al, k),
                                       want = topk_ref(al, k);
                if (got != want && !bad++) {
                    int r = 0;
                    while (got[r] == want[r]) r++;
                    snprintf(first, sizeof first,
                             "set %zu box (%.9g %.9g %.9g %.9g) mode %d k %d: "
                             "rank %d got anchor %d want %d",
                             si, cd[0], cd[1], cd[2], cd[3], mode, k, r,
                             got[r], want[r]);
                }
            }
        }
    }
    ok(bad == 0 && multi_block > runs / 20,
       NAME("spread top-k = sort of all anchors (%ld gts x k, %ld over "
            "several blocks)", runs, multi_block),
       WHY("%ld differ; first: %s", bad, first));

    /* the key order itself: larger metric first, then lower index */
    bool keys = tk_key(0.0f, 0) > tk_key(0.0f, 1) &&
                tk_key(1e-45f, 100000) > tk_key(0.0f, 0) &&
                tk_key(1.0f, 5) > tk_key(0.99999994f, 0) &&
                tk_key(0.0f, 0x7ffffffe) > 0 && tk_anchor(tk_key(0.5f, 8399)) == 8399;
    ok(keys, "tk_key orders (metric desc, index asc) and is never 0",
       "a key comparison is wrong");
    /* tk_insert keeps the top TK_KR, tk_pop drops the head */
    tk_key_t Lst[TK_KR] = {0};
    std::vector<tk_key_t> all;
    for (int j = 0; j < 40; j++) {
        const tk_key_t x = tk_key(vals[j % 10], 1000 - j);
        tk_insert(Lst, x);
        all.push_back(x);
    }
    std::sort(all.rbegin(), all.rend());
    bool lst = true;
    for (int q = 0; q < TK_KR; q++) lst &= Lst[q] == all[q];
    tk_pop(Lst);
    for (int q = 0; q + 1 < TK_KR; q++) lst &= Lst[q] == all[q + 1];
    lst &= Lst[TK_KR - 1] == 0;
    ok(lst, "tk_insert keeps the top 16 in order, tk_pop drops the head",
       "list wrong");
}

int main(void) {
    test_rects();
    test_walks();
    test_selection();
    return failures ? 1 : 0;
}
