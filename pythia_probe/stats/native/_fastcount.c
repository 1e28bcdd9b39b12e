/* The dense engine's pass-1 context counts on the CPU (no Python.h), loaded through ctypes by
 * pythia_probe/stats/native/fastcount.py; the torch kernel in stats/dense/kernels.py
 * (add_context) is the fallback and gives the same integers.
 *
 * A batch is tokens [n, L] (int64, row stride L) with lengths[i] valid tokens per row
 * (2 <= lengths[i] <= L); position t predicts y_t = x_{t+1} from x_0..x_t, for
 * t < lengths[i] - 1. Padding is never read.
 *
 * fc_context: lo[y_t * V + x_m] += w[t] for m <= t: exact int64 sums, so any order gives the
 * torch path's bits (the caller's FixedPoint.reserve keeps lo from overflowing).
 */

#include <stdint.h>

#define FC_OK 0
#define FC_BAD_LENGTH -1
#define FC_BAD_TOKEN -2

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

/* Version of this ABI (checked by the binding). */
int64_t fc_abi_version(void) { return 4; }
