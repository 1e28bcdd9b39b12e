/* Row-local CPU kernels for the two counting passes of pythia_probe.stats (no Python.h).
 *
 * Loaded through ctypes by pythia_probe/stats/fastcount.py; the pure-torch kernels in
 * kernels.py are the fallback and the specification. A batch is tokens [n, L] (int64, row
 * stride L) with lengths[i] valid tokens per row (2 <= lengths[i] <= L); position t predicts
 * y_t = x_{t+1} from x_0..x_t, for t < lengths[i] - 1. Padding is never read.
 *
 * Pass 1 (fc_context): lo[y_t * V + x_m] += w[t] for m <= t: exact int64 sums, so any order
 * gives the torch path's bits (the caller's FixedPoint.reserve keeps lo from overflowing).
 * Pass 2 (fc_q): q = Gc[y_t, x_m] / (t+1) - centre_t, centre_t = (sum_m Gc[y_t, x_m]) /
 * (t+1)^2, scattered into Qbar[r(x_t), r(x_m)] in the torch path's pair order (sequence, t, m),
 * so Qbar gets the same bits; Delta[t - m] gets the same terms pair by pair, where torch first
 * sums each pair over the batch's sequences (float64 rounding differs). The centre sum follows ATen's cascade_sum order for a contiguous inner
 * reduction with `lanes` doubles per vector (lanes = 0: a plain left-to-right sum).
 * Positions are visited in their natural order: consecutive t of one sequence share the
 * prefix columns x_m, which keeps them in cache (measured faster on real text than visiting
 * positions grouped by accumulator row).
 *
 * Build with -ffp-contract=off: a fused multiply-add would change the rounding of q.
 */

#include <stdint.h>
#include <stdlib.h>

#define FC_OK 0
#define FC_BAD_LENGTH -1
#define FC_BAD_TOKEN -2
#define FC_NO_MEMORY -3

static int64_t ceil_log2(int64_t x) {
    /* ATen utils::CeilLog2: 1 for x <= 2, else floor(log2(x - 1)) + 1. */
    if (x <= 2) return 1;
    int64_t r = 0;
    uint64_t v = (uint64_t)(x - 1);
    while (v) { r++; v >>= 1; }
    return r;
}

/* ATen multi_row_sum with nrows = 4 over `size` rows; row r, column k is p[(4 r + k) * s]. */
static void multi_row_sum4(const double *p, int64_t s, int64_t size, double out[4]) {
    const int64_t levels = 4;
    int64_t power = ceil_log2(size) / levels;
    if (power < 4) power = 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    double acc[4][4] = {{0.0}};
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; ++j, ++i)
            for (int k = 0; k < 4; ++k) acc[0][k] += p[(4 * i + k) * s];
        for (int64_t j = 1; j < levels; ++j) {
            for (int k = 0; k < 4; ++k) {
                acc[j][k] += acc[j - 1][k];
                acc[j - 1][k] = 0.0;
            }
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < 4; ++k) acc[0][k] += p[(4 * i + k) * s];
    for (int64_t j = 1; j < levels; ++j)
        for (int k = 0; k < 4; ++k) acc[0][k] += acc[j][k];
    for (int k = 0; k < 4; ++k) out[k] = acc[0][k];
}

/* ATen row_sum (ilp_factor 4) of size elements p[0], p[s], p[2 s], ... */
static double row_sum(const double *p, int64_t s, int64_t size) {
    const int64_t size_ilp = size / 4;
    double part[4];
    multi_row_sum4(p, s, size_ilp, part);
    for (int64_t i = size_ilp * 4; i < size; ++i) part[0] += p[i * s];
    for (int k = 1; k < 4; ++k) part[0] += part[k];
    return part[0];
}

/* vectorized_inner_sum of L >= W doubles whose ilp rows (L / 4W) stay below one cascade
 * step (16): 4W running sums over blocks of 4W, then each lane's tail and partials. The
 * `+ 0.0` terms are ATen's empty cascade levels (they turn -0.0 into +0.0, as ATen does). */
static inline double short_sum(const double *v, int64_t L, const int64_t W) {
    double a[64];
    const int64_t B = 4 * W, nb = L / B, nv = L / W;
    for (int64_t j = 0; j < B; ++j) a[j] = 0.0;
    for (int64_t i = 0; i < nb; ++i)
        for (int64_t j = 0; j < B; ++j) a[j] += v[i * B + j];
    double acc = 0.0;
    for (int64_t k = nv * W; k < L; ++k) acc += v[k];
    for (int64_t l = 0; l < W; ++l) {
        double p = ((a[l] + 0.0) + 0.0) + 0.0;
        for (int64_t i = nb * 4; i < nv; ++i) p += v[i * W + l];
        for (int64_t k = 1; k < 4; ++k) p += ((a[k * W + l] + 0.0) + 0.0) + 0.0;
        acc += p;
    }
    return 0.0 + acc;
}

/* torch.sum of a contiguous double row as ATen's cascade_sum computes it on CPU. */
double fc_torch_sum(const double *v, int64_t L, int64_t lanes) {
    if (lanes <= 0) {
        double s = 0.0;
        for (int64_t m = 0; m < L; ++m) s += v[m];
        return s;
    }
    if (L < lanes) return 0.0 + row_sum(v, 1, L);       /* scalar_inner_sum */
    if (L < 64 * lanes && lanes == 4) return short_sum(v, L, 4);
    if (L < 64 * lanes && lanes == 8) return short_sum(v, L, 8);
    const int64_t nv = L / lanes;                          /* vectorized_inner_sum */
    double acc = 0.0;
    for (int64_t k = nv * lanes; k < L; ++k) acc += v[k];
    for (int64_t l = 0; l < lanes; ++l) acc += row_sum(v + l, lanes, nv);
    return 0.0 + acc;                                      /* output filled with 0, then += */
}

static int check_batch(const int64_t *tokens, int64_t n, int64_t L, const int64_t *lengths,
                       int64_t V) {
    for (int64_t i = 0; i < n; ++i) {
        const int64_t len = lengths[i];
        if (len < 2 || len > L) return FC_BAD_LENGTH;
        const int64_t *x = tokens + i * L;
        for (int64_t j = 0; j < len; ++j)
            if (x[j] < 0 || x[j] >= V) return FC_BAD_TOKEN;
    }
    return FC_OK;
}

/* Pass 1 context weights: lo[y_t * V + x_m] += w[t] for every m <= t < lengths[i] - 1. */
int fc_context(const int64_t *tokens, int64_t n, int64_t L, const int64_t *lengths, int64_t V,
               const int64_t *w, int64_t *lo) {
    const int rc = check_batch(tokens, n, L, lengths, V);
    if (rc != FC_OK) return rc;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t *x = tokens + i * L;
        for (int64_t t = 0; t < lengths[i] - 1; ++t) {
            uint64_t *row = (uint64_t *)(lo + x[t + 1] * V);  /* wraps like torch's int64 */
            const uint64_t wt = (uint64_t)w[t];
            int64_t m = 0;
            for (; m + 4 <= t + 1; m += 4) {
                row[x[m]] += wt;
                row[x[m + 1]] += wt;
                row[x[m + 2]] += wt;
                row[x[m + 3]] += wt;
            }
            for (; m <= t; ++m) row[x[m]] += wt;
        }
    }
    return FC_OK;
}

/* Pass 2 at position t of a row x (r: its Qbar rows; q: scratch of length >= t + 1):
 * q[m] = Gc[y_t, x_m] / (t+1) - centre_t, then Delta[t - m] += q[m], Qbar[r_t, r_m] += q[m]. */
static void q_position(const int64_t *x, const int64_t *r, int64_t t, int64_t V,
                       const double *Gc, double *Qbar, int64_t side, double *Delta,
                       int64_t lanes, double *restrict q) {
    const double *grow = Gc + x[t + 1] * V;
    for (int64_t m = 0; m <= t; ++m) q[m] = grow[x[m]];
    const double inv = 1.0 / (double)(t + 1);
    const double centre = fc_torch_sum(q, t + 1, lanes) * (inv * inv);
    for (int64_t m = 0; m <= t; ++m) q[m] = q[m] * inv - centre;
    double *restrict d = Delta + t;
    for (int64_t m = 0; m <= t; ++m) d[-m] += q[m];
    double *qrow = Qbar + r[t] * side;
    for (int64_t m = 0; m <= t; ++m) qrow[r[m]] += q[m];
}

/* Pass 2: Qbar[r(x_t) * side + r(x_m)] += q and Delta[t - m] += q, r = row_of or identity,
 * in the torch path's order (sequence, t, m): every Qbar entry gets the same bits. */
int fc_q(const int64_t *tokens, int64_t n, int64_t L, const int64_t *lengths, int64_t V,
         const double *Gc, double *Qbar, int64_t side, const int64_t *row_of, double *Delta,
         int64_t lanes) {
    const int rc = check_batch(tokens, n, L, lengths, V);
    if (rc != FC_OK) return rc;
    double *q = (double *)malloc((size_t)L * sizeof(double));
    int64_t *r = (int64_t *)malloc((size_t)L * sizeof(int64_t));
    if (!q || !r) {
        free(q);
        free(r);
        return FC_NO_MEMORY;
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t *x = tokens + i * L;
        for (int64_t j = 0; j < lengths[i]; ++j) r[j] = row_of ? row_of[x[j]] : x[j];
        for (int64_t t = 0; t < lengths[i] - 1; ++t)
            q_position(x, r, t, V, Gc, Qbar, side, Delta, lanes, q);
    }
    free(q);
    free(r);
    return FC_OK;
}

/* Version of this ABI (checked by the binding). */
int64_t fc_abi_version(void) { return 3; }
