/* Kernels of the sparse statistics engine (pythia_probe/stats/sparse/).
 *
 * Plain C (no Python.h), loaded through ctypes by pythia_probe/stats/native/sparsecount.py.
 * Pass 1 and the products have numpy / scipy twins in stats/sparse/ and stats/factors.py (the
 * fallback; tests compare); pass 2 exists only here (its numpy specification is the tests'
 * oracle, tests/sparse_pass2_oracle.py).
 * A batch is tokens [n, L] with lengths[i] valid tokens per row (2 <= lengths[i] <= L);
 * position t (0-based) predicts y_t = x_{t+1} from x_0..x_t, for t < lengths[i] - 1.
 *
 * Pass 1 (exact integers):
 *   sc_pairs   every context pair (target y_t, context x_m), m <= t, as one int64
 *              ((x_m * V + y_t) << tbits) | t  (context-major key, position in the low bits),
 *              except pairs of two head tokens, summed into a dense block (sc_drain);
 *   sc_reduce  a sorted run of such codes -> unique keys and the sum of w[t] per key;
 *   sc_merge   two sorted tables of fixed-point sums (hi, lo) -> one, carried to 0 <= lo < 2^F.
 * Compositions: sc_spmm, out = (A X - u v^T) * scale for a CSR matrix A and a dense row-major
 *   X (blocks of 32 columns packed, kept in registers; each output entry summed in the order
 *   of A's entries, then corrected: the sparse-minus-rank-one products in one pass).
 * sc_spgemm_dense, out[r, :] = -u[r] v + sum_p A[r, p] B[p, :] for CSR matrices A (int64
 *   columns) and B (int32 columns) into a dense row-major block: GbarHead's tiles (C[tile, :] W,
 *   the bigrams of the tile's tokens times the W rows of their next tokens), each output entry
 *   summed in the order of A's entries, then B's.
 * Pass 2 by column tiles of Gbar (context tokens a of one tile, Gc^T [w, V] row-major); Qbar
 * of a tile is a dense block B [w, side] (row = the key's place in the tile, column = the
 * query's row r(x_t)), never a V x V array:
 *   sc_sweep        for every context occurrence (s, k) of a tile token and every t >= k:
 *                   M = Gc[y_t, x_k]; S[s, t] += M; q = M / (t+1); Delta[t - k] += q;
 *                   B[col(x_k), r(x_t)] += q and its bit set in `touched`, a bitmap of
 *                   the block (64 entries a word; skipped when either is the
 *                   dummy row of a restricted vocabulary);
 *   sc_centre_tile  once S is complete, the centring term of Q on the same pairs (the
 *                   tile's kept entries put back into the block and read out again):
 *                   B[col(x_k), r(x_t)] -= c_t, c_t = S[s, t] / (t+1)^2;
 *                   both walk the pairs in one loop (walk_tile);
 *   sc_centre       its part in Delta: c_t subtracted from Delta[r] for every r <= t;
 *   sc_touched, sc_compact  the entries a tile's pairs reached, taken out of the block (and
 *                   the block cleared there) in place order.
 *
 * Delta is a small difference of the two large sums (M / (t+1) and S_t / (t+1)^2): both are
 * kept as compensated (Neumaier) sums, Delta[r] + Dc[r], so the split costs no accuracy.
 *
 * Build with -ffp-contract=off: fused multiply-adds would change the rounding. The vector
 * clones of sc_spmm compute the same per-entry sums in the same order (no reassociation).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SC_OK 0
#define SC_BAD_LENGTH -1
#define SC_BAD_TOKEN -2
#define SC_NO_MEMORY -3

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
#define SC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SC_CLONES
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SC_PREFETCH(p) __builtin_prefetch(p)
#else
#define SC_PREFETCH(p) ((void)(p))
#endif

static int check_batch(const int64_t *tokens, int64_t n, int64_t L, const int64_t *lengths,
                       int64_t V) {
    for (int64_t i = 0; i < n; ++i) {
        const int64_t len = lengths[i];
        if (len < 2 || len > L) return SC_BAD_LENGTH;
        const int64_t *x = tokens + i * L;
        for (int64_t j = 0; j < len; ++j)
            if (x[j] < 0 || x[j] >= V) return SC_BAD_TOKEN;
    }
    return SC_OK;
}

/* Codes of every context pair of the batch, in (sequence, t, m) order; returns their number
 * (or a negative error). `out` holds at least sum_i (len_i - 1) len_i / 2 entries.
 * With a head set (head_of[v] = its index among the H head tokens, or -1; NULL: none), a pair
 * whose target and context are both head tokens adds w[t] to block[head_of[y] * H +
 * head_of[a]] instead (a dense int64 block: the most frequent pairs skip the sort). */
int64_t sc_pairs(const int64_t *tokens, int64_t n, int64_t L, const int64_t *lengths,
                 int64_t V, int64_t tbits, const int64_t *head_of, int64_t H,
                 const int64_t *w, int64_t *block, int64_t *out) {
    const int rc = check_batch(tokens, n, L, lengths, V);
    if (rc != SC_OK) return rc;
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t *x = tokens + i * L;
        for (int64_t t = 0; t < lengths[i] - 1; ++t) {
            const int64_t y = x[t + 1];
            const int64_t hy = head_of ? head_of[y] : -1;
            if (hy < 0) {
                for (int64_t m = 0; m <= t; ++m) out[c++] = ((x[m] * V + y) << tbits) | t;
                continue;
            }
            uint64_t *row = (uint64_t *)(block + hy * H);  /* wraps like int64 sums in torch */
            const uint64_t wt = (uint64_t)w[t];
            for (int64_t m = 0; m <= t; ++m) {
                const int64_t ha = head_of[x[m]];
                if (ha >= 0) row[ha] += wt;
                else out[c++] = ((x[m] * V + y) << tbits) | t;
            }
        }
    }
    return c;
}

/* Non-zero entries of the head block in key order (context-major; head_ids ascending), as
 * keys a * V + y and raw sums lo; the block is zeroed. Returns their number. */
int64_t sc_drain(int64_t *block, int64_t H, const int64_t *head_ids, int64_t V,
                 int64_t *keys, int64_t *lo) {
    int64_t c = 0;
    for (int64_t ha = 0; ha < H; ++ha)
        for (int64_t hy = 0; hy < H; ++hy) {
            int64_t *b = block + hy * H + ha;
            if (*b) {
                keys[c] = head_ids[ha] * V + head_ids[hy];
                lo[c++] = *b;
                *b = 0;
            }
        }
    return c;
}

/* Sorted codes -> unique keys (code >> tbits) and lo[u] = sum of w[code & mask] over each key's
 * codes. keys may alias codes (it is written behind the read position). Returns the count. */
int64_t sc_reduce(const int64_t *codes, int64_t n, int64_t tbits, const int64_t *w,
                  int64_t *keys, int64_t *lo) {
    const int64_t mask = ((int64_t)1 << tbits) - 1;
    int64_t u = -1, prev = -1;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t k = codes[i] >> tbits, add = w[codes[i] & mask];
        if (u < 0 || k != prev) {
            ++u;
            keys[u] = k;
            lo[u] = add;
            prev = k;
        } else {
            lo[u] += add;
        }
    }
    return u + 1;
}

/* Merge two tables sorted by unique key; fixed-point values hi + lo 2^-F summed exactly and
 * carried so that 0 <= lo < 2^F (inputs need lo >= 0 and lo_a + lo_b < 2^63; hb NULL: 0). */
int64_t sc_merge(const int64_t *ka, const int64_t *ha, const int64_t *la, int64_t na,
                 const int64_t *kb, const int64_t *hb, const int64_t *lb, int64_t nb,
                 int64_t frac_bits, int64_t *ko, int64_t *ho, int64_t *lo) {
    const int64_t mask = ((int64_t)1 << frac_bits) - 1;
    int64_t i = 0, j = 0, o = 0;
    while (i < na || j < nb) {
        int64_t k, h, l;
        if (j >= nb || (i < na && ka[i] < kb[j])) {
            k = ka[i]; h = ha[i]; l = la[i]; ++i;
        } else if (i >= na || kb[j] < ka[i]) {
            k = kb[j]; h = hb ? hb[j] : 0; l = lb[j]; ++j;
        } else {
            k = ka[i]; h = ha[i] + (hb ? hb[j] : 0); l = la[i] + lb[j]; ++i; ++j;
        }
        ko[o] = k;
        ho[o] = h + (l >> frac_bits);
        lo[o] = l & mask;
        ++o;
    }
    return o;
}

/* out = (A X - u v^T) * scale for a CSR matrix A (rows, indptr, col, val) and X [nx, w]
 * row-major; u NULL counts as all ones, v NULL as no correction. Only the columns
 * c0 <= c < c1 (c0 a multiple of 32) are computed, so threads can split the columns. Each
 * block of 32 columns of X is first copied into `pack` ([nx, 32], contiguous: the random row
 * reads then stay within a few MB). out is [rows, w] row-major, or [w, rows] when
 * `transposed`; `x_transposed`: X is given as its transpose [w, nx] row-major (the same
 * numbers packed). Per entry: the sum in A's order, then (sum - u[r] * v[c]) * scale.
 * The packed rows are read in A's column order, i.e. at random: each is prefetched AHEAD
 * entries before it is needed (twice the speed at Pythia's 50,277 ids; no change to any sum). */
SC_CLONES
void sc_spmm(int64_t rows, const int64_t *indptr, const int64_t *col, const double *val,
             const double *X, int64_t nx, int64_t w, int64_t c0, int64_t c1, double *pack,
             double *out, int64_t transposed, const double *u, const double *v,
             double scale, int64_t x_transposed) {
    enum { B = 32, AHEAD = 12 };
    const int64_t nnz = indptr[rows];
    for (int64_t b0 = c0; b0 < c1; b0 += B) {
        const int64_t cw = c1 - b0 < B ? c1 - b0 : B;
        if (x_transposed) {  /* X given as its transpose [w, nx]: cw rows read side by side */
            for (int64_t j = 0; j < nx; ++j) {
                for (int64_t k = 0; k < cw; ++k) pack[j * B + k] = X[(b0 + k) * nx + j];
                for (int64_t k = cw; k < B; ++k) pack[j * B + k] = 0.0;
            }
        } else {
            for (int64_t j = 0; j < nx; ++j) {
                for (int64_t k = 0; k < cw; ++k) pack[j * B + k] = X[j * w + b0 + k];
                for (int64_t k = cw; k < B; ++k) pack[j * B + k] = 0.0;
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
            double acc[B];
            for (int k = 0; k < B; ++k) acc[k] = 0.0;
            for (int64_t p = indptr[r]; p < indptr[r + 1]; ++p) {
                if (p + AHEAD < nnz) {  /* the packed row AHEAD entries on: 4 cache lines */
                    const double *next = pack + col[p + AHEAD] * B;
                    for (int k = 0; k < B; k += 8) SC_PREFETCH(next + k);
                }
                const double a = val[p];
                const double *x = pack + col[p] * B;
                for (int k = 0; k < B; ++k) acc[k] += a * x[k];
            }
            if (v) {
                const double ur = u ? u[r] : 1.0;
                for (int64_t k = 0; k < cw; ++k) acc[k] = acc[k] - ur * v[b0 + k];
            }
            if (scale != 1.0)
                for (int64_t k = 0; k < cw; ++k) acc[k] *= scale;
            if (transposed)
                for (int64_t k = 0; k < cw; ++k) out[(b0 + k) * rows + r] = acc[k];
            else
                memcpy(out + r * w + b0, acc, (size_t)cw * sizeof(double));
        }
    }
}

/* Neumaier's compensated sum: *sum + *comp holds the exact sum to within one rounding. */
static inline void kahan_add(double *sum, double *comp, double x) {
    const double t = *sum + x;
    if ((*sum >= 0 ? *sum : -*sum) >= (x >= 0 ? x : -x)) *comp += (*sum - t) + x;
    else *comp += (x - t) + *sum;
    *sum = t;
}

/* Row of the statistics' Qbar for token v: row_of[v] (restricted) or v itself. */
static inline int64_t qrow(const int64_t *row_of, int64_t v) { return row_of ? row_of[v] : v; }

/* Pass 2's walk over one tile's pairs (the sweep and the centring share it): occ are flat
 * positions s * L + k (context occurrences of the tile's tokens, k <= lengths[s] - 2); col_of
 * maps a token to its row of GcT [w, V] and of the tile's Qbar block B [w, side]. T = L - 1.
 * For every occurrence (s, k) of a key a = x_k and every t >= k, with r = r(x_t):
 *   centre == 0 (sc_sweep): M = Gc[y_t, a]; S[s, t] += M; q = M / (t+1); Delta[t - k] += q;
 *                B[col(a), r] += q and its bit in `touched` set (skipped for a dummy a or r);
 *   centre == 1 (sc_centre_tile): B[col(a), r] -= S[s, t] / (t+1)^2 (skipped likewise).
 * `centre` is a constant at both call sites: the compiler makes two specialised loops. */
static inline int walk_tile(const int centre, const int32_t *tokens, int64_t n, int64_t L,
                            const int64_t *lengths, const int64_t *occ, int64_t n_occ,
                            const int64_t *col_of, const double *GcT, int64_t V,
                            const int64_t *row_of, int64_t side, int64_t dummy, double *S,
                            double *Delta, double *Dc, double *B, uint64_t *touched) {
    const int64_t T = L - 1;
    for (int64_t o = 0; o < n_occ; ++o) {
        const int64_t s = occ[o] / L, k = occ[o] % L;
        if (s < 0 || s >= n || k > lengths[s] - 2) return SC_BAD_LENGTH;
        const int32_t *x = tokens + s * L;
        const int64_t a = x[k];
        if (a < 0 || a >= V || col_of[a] < 0) return SC_BAD_TOKEN;
        const int keyed = qrow(row_of, a) != dummy;
        if (centre && !keyed) continue;
        const double *g = centre ? NULL : GcT + col_of[a] * V;
        double *Ss = S + s * T, *qa = B + col_of[a] * side;
        const int64_t row0 = col_of[a] * side;
        const int64_t stop = lengths[s] - 1;
        for (int64_t t = k; t < stop; ++t) {
            if (centre) {
                const int64_t rt = qrow(row_of, x[t]);
                if (rt == dummy) continue;
                const double inv = 1.0 / (double)(t + 1);
                qa[rt] -= Ss[t] * (inv * inv);
                continue;
            }
            const double M = g[x[t + 1]];
            Ss[t] += M;
            const double q = M * (1.0 / (double)(t + 1));
            kahan_add(Delta + (t - k), Dc + (t - k), q);
            if (keyed) {
                const int64_t rt = qrow(row_of, x[t]);
                if (rt != dummy) {
                    const int64_t j = row0 + rt;
                    qa[rt] += q;
                    touched[j >> 6] |= (uint64_t)1 << (j & 63);
                }
            }
        }
    }
    return SC_OK;
}

/* Pass 2, one tile: S, Delta (+ Dc) and the tile's Qbar block from its Gbar columns. */
int sc_sweep(const int32_t *tokens, int64_t n, int64_t L, const int64_t *lengths,
             const int64_t *occ, int64_t n_occ, const int64_t *col_of, const double *GcT,
             int64_t V, const int64_t *row_of, int64_t side, int64_t dummy, double *S,
             double *Delta, double *Dc, double *B, uint64_t *touched) {
    return walk_tile(0, tokens, n, L, lengths, occ, n_occ, col_of, GcT, V, row_of, side,
                     dummy, S, Delta, Dc, B, touched);
}

/* Pass 2, centring term of one tile's pairs (S complete): the tile's kept entries (places
 * flat[i], ascending, values vals[i]) are put into the cleared block B, B[col(x_k), r(x_t)]
 * -= S[s, t] / (t+1)^2 for every occurrence (s, k) of a tile token and t >= k, and the
 * entries are read back into vals (B cleared there again). */
int sc_centre_tile(const int32_t *tokens, int64_t n, int64_t L, const int64_t *lengths,
                   const int64_t *occ, int64_t n_occ, const int64_t *col_of, int64_t V,
                   const int64_t *row_of, int64_t side, int64_t dummy, const double *S,
                   double *B, const int32_t *flat, double *vals, int64_t n_flat) {
    for (int64_t i = 0; i < n_flat; ++i) B[flat[i]] = vals[i];
    const int rc = walk_tile(1, tokens, n, L, lengths, occ, n_occ, col_of, NULL, V, row_of,
                             side, dummy, (double *)S, NULL, NULL, B, NULL);
    for (int64_t i = 0; i < n_flat; ++i) {
        vals[i] = B[flat[i]];
        B[flat[i]] = 0.0;
    }
    return rc;
}

/* Pass 2, centring term in Delta for sequences s0 <= s < s1: Delta[r] -= sum over positions
 * t >= r of c_t = S[s, t] / (t+1)^2 (compensated). */
int sc_centre(const int32_t *tokens, int64_t s0, int64_t s1, int64_t L,
              const int64_t *lengths, const double *S, double *Delta, double *Dc) {
    const int64_t T = L - 1;
    double *csum = (double *)calloc((size_t)(2 * T + 1), sizeof(double));
    if (!csum) return SC_NO_MEMORY;
    double *ccomp = csum + T;
    (void)tokens;
    for (int64_t s = s0; s < s1; ++s) {
        if (lengths[s] < 2 || lengths[s] > L) {
            free(csum);
            return SC_BAD_LENGTH;
        }
        for (int64_t t = 0; t < lengths[s] - 1; ++t) {
            const double inv = 1.0 / (double)(t + 1);
            kahan_add(csum + t, ccomp + t, S[s * T + t] * (inv * inv));
        }
    }
    double run = 0.0, run_c = 0.0;
    for (int64_t r = T - 1; r >= 0; --r) {  /* Delta[r] -= sum over positions t >= r of c_t */
        kahan_add(&run, &run_c, csum[r]);
        kahan_add(&run, &run_c, ccomp[r]);
        kahan_add(Delta + r, Dc + r, -run);
        kahan_add(Delta + r, Dc + r, -run_c);
    }
    free(csum);
    return SC_OK;
}

#if defined(__GNUC__)
#define SC_POPCOUNT(m) __builtin_popcountll(m)
#define SC_CTZ(m) __builtin_ctzll(m)
#else
static inline int SC_POPCOUNT(uint64_t m) { int c = 0; for (; m; m &= m - 1) ++c; return c; }
static inline int SC_CTZ(uint64_t m) { int c = 0; for (; !(m & 1); m >>= 1) ++c; return c; }
#endif

/* How many entries of a tile's block the pairs reached (bits set in the bitmap `touched` of
 * n_words words). */
int64_t sc_touched(const uint64_t *touched, int64_t n_words) {
    int64_t c = 0;
    for (int64_t i = 0; i < n_words; ++i)
        if (touched[i]) c += SC_POPCOUNT(touched[i]);
    return c;
}

/* The entries a tile's pairs reached (bit j of the bitmap `touched`: entry j of the block),
 * in place order: flat[c] = place, vals[c] = block value; both are cleared there for the
 * next tile (the block holds n entries). Returns the count. */
int64_t sc_compact(double *block, uint64_t *touched, int64_t n, int32_t *flat, double *vals) {
    int64_t c = 0;
    const int64_t n_words = (n + 63) / 64;
    for (int64_t i = 0; i < n_words; ++i) {
        uint64_t m = touched[i];
        if (!m) continue;
        touched[i] = 0;
        for (; m; m &= m - 1) {
            const int64_t j = i * 64 + SC_CTZ(m);
            flat[c] = (int32_t)j;
            vals[c++] = block[j];
            block[j] = 0.0;
        }
    }
    return c;
}

/* Version of this ABI (checked by the binding). */
/* Rows r0..r1 of A (CSR: a_indptr, int64 a_col, a_val) times B (CSR over A's columns:
 * b_indptr, int32 b_col < ncols, b_val) into out [rows of A, ncols] row-major, each row first
 * set to -u[r] v (u, v NULL: 0). */
void sc_spgemm_dense(int64_t r0, int64_t r1, const int64_t *a_indptr, const int64_t *a_col,
                     const double *a_val, const int64_t *b_indptr, const int32_t *b_col,
                     const double *b_val, int64_t ncols, double *out, const double *u,
                     const double *v) {
    for (int64_t r = r0; r < r1; ++r) {
        double *o = out + r * ncols;
        if (v)
            for (int64_t a = 0; a < ncols; ++a) o[a] = -(u[r] * v[a]);
        else
            memset(o, 0, (size_t)ncols * sizeof(double));
        for (int64_t p = a_indptr[r]; p < a_indptr[r + 1]; ++p) {
            const double a = a_val[p];
            const int64_t y = a_col[p];
            for (int64_t q = b_indptr[y]; q < b_indptr[y + 1]; ++q) o[b_col[q]] += a * b_val[q];
        }
    }
}

int64_t sc_abi_version(void) { return 10; }
