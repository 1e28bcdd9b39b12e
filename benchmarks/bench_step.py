"""One sweep step at Pythia-1.4B shapes, side by side (``bench_analysis.py --pythia`` runs it):

- ``full``: full vocabulary (50,277 statistic ids of 50,304 embedding rows), factored targets
  (the statistics' sparse parts, :mod:`pythia_probe.analysis.factored`), the sweep's own
  layer-major scoring (:func:`pythia_probe.analysis.layers.score_layers`);
- ``top5000``: the 5,000 first ids, dense targets (each matrix its own single factor, as for
  top-k statistics), the same scoring;
- ``dense-TL``: a TransformerLens-style procedure at 5,000 ids: every model matrix materialised
  (E_pre W_Q^h W_K^h^T E_pre^T per head, their mean, the LN-folded ones, E E^T for the embedding
  rows), its covariance formed, the Frobenius cosine with the target covariance (formed once).
  At the full vocabulary one such matrix is 50,277^2 x 4 B = 10 GB and the procedure holds
  several: it is run only where ``--dense-full`` is given.

Analyses embedding, attention_lnfold and attention with every head; random float32 weights
(``--layers`` of the 24, every other size Pythia-1.4B's); the sparse parts counted from a Zipf
token stream (``--docs`` documents of 129 tokens: C, W exactly as the statistics count them;
Qbar on the same (query, key) pairs with a stand-in value, 1 / (offset + 1), since only its
sparsity pattern sets the time). The once-per-statistics target norm (||C_T C_T^T||_F) is not
part of a step and not computed here (the factored targets carry norm 1, so the numbers these
steps print are timings, not cosines; their exactness is tests/test_analysis_factored*.py').

Each method in a fresh spawned process (peak RSS its own), ``--threads`` torch threads; the
machine's matmul peak (float32 GEMM, multiply-adds/s) and sparse rate measured in the same run
(:mod:`pythia_probe.planner.rates`), the achieved rate of each step against it, and the plan's
expected seconds (:func:`pythia_probe.planner.step.memory_plan` at those rates).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time

import numpy as np
import scipy.sparse as sp
import torch

from pythia_probe.analysis import Options, get_analyses
from pythia_probe.analysis.chance import Primitives
from pythia_probe.analysis.cosine import covariance, prepare_target
from pythia_probe.analysis.factored import FactoredTarget, Parts, Vectors, _row_norms_sums
from pythia_probe.analysis.layers import score_layers
from pythia_probe.arch import NeoXConfig, iter_single_token_layers
from pythia_probe.linalg import frobenius_cosine
from pythia_probe.planner.step import StepShape, gram_macs, memory_plan

ANALYSES = ("embedding", "attention_lnfold", "attention")
PYTHIA = dict(d_vocab=50304, d_model=2048, n_heads=16, d_mlp=8192, rotary_dim=32)
V_FULL, V_TOP, T = 50277, 5000, 128


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def zipf_parts(docs: int, seed: int = 0, V: int = V_FULL, T: int = T) -> dict:
    """Sparse parts of a Zipf(1) token stream over V ids (see the module docstring)."""
    g = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1)
    tok = g.choice(V, size=(docs, T + 1), p=p / p.sum())
    x, y = tok[:, :-1], tok[:, 1:]
    ti, mi = np.tril_indices(T)
    C = sp.coo_matrix((np.ones(x.size), (x.ravel(), y.ravel())), shape=(V,) * 2).tocsr()
    W = sp.coo_matrix((np.tile(1.0 / (ti + 1), docs), (y[:, ti].ravel(), x[:, mi].ravel())),
                      shape=(V,) * 2).tocsr()
    P = docs * T
    Q = sp.coo_matrix((np.tile(1.0 / (ti - mi + 1), docs) / P, (x[:, ti].ravel(),
                                                                x[:, mi].ravel())),
                      shape=(V,) * 2).tocsc()
    return {"C": C, "W": W, "n": np.asarray(C.sum(1)).ravel(), "w": np.asarray(W.sum(0)).ravel(),
            "positions": P, "full_d_vocab": V, "Qbar": Q, "ids": None}


def _weights(layers: int):
    from gpu_check import random_weights

    return random_weights(NeoXConfig(n_layers=layers, **PYTHIA), "cpu")


class Split:
    """Exclusive seconds by part of a step, measured in the step's own process: wrappers on
    the functions of each part (a part's time excludes the parts it calls), "other" the rest.

    forward: the single-token forward pass (each layer's streams); moments: each basis's
    Y^T Y; products: the target products (factored: sparse products and their vector
    corrections; dense: F^T C_T with C_T's column blocks); grams: (Y^T C_T)(Y^T C_T)^T;
    d-space: the (d+1)-space algebra of the factors (attention's S, P P^T, H, the scores)."""

    PARTS = ("forward", "moments", "products", "grams", "d-space")

    def __init__(self):
        self.s = dict.fromkeys(self.PARTS, 0.0)
        self.stack: list[str] = []

    def wrap(self, part, fn):
        def timed(*a, **k):
            name = part(self.stack[-1] if self.stack else "") if callable(part) else part
            self.stack.append(name)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                self.stack.pop()
                self.s[name] += dt
                if self.stack:
                    self.s[self.stack[-1]] -= dt
        return timed

    def install(self) -> None:
        from pythia_probe.analysis import attention, basis, cosine, factored

        def gram_part(parent: str) -> str:
            return "moments" if parent == "moments" else "grams"

        basis.Basis.moments = self.wrap("moments", basis.Basis.moments)
        factored.FactoredTarget.ct_t = self.wrap("products", factored.FactoredTarget.ct_t)
        factored.FactoredTarget.grams = self.wrap("grams", factored.FactoredTarget.grams)
        for mod in (basis, factored):
            mod.add_gram = self.wrap(gram_part, mod.add_gram)
        attention.attention_factors = self.wrap("d-space", attention.attention_factors)
        cosine._score = self.wrap("d-space", cosine._score)

    def forward(self, it):
        """The items of the forward pass's iterator, each timed as "forward"."""
        it = iter(it)
        while True:
            with_time = self.wrap("forward", next)
            try:
                yield with_time(it)
            except StopIteration:
                return


SPLIT = Split()


def _layers(weights, ids, chunk):
    """The sweep's layer-major streams (sweep.scoring.Scorer.layers without a Scorer)."""
    from pythia_probe.analysis.basis import Basis
    from pythia_probe.analysis.layers import Layer

    last = None
    streams = iter_single_token_layers(weights, ids, 4096, torch.float32)
    for i, res in enumerate(SPLIT.forward(streams)):
        bases = {k: last if k == "pre" and last is not None else Basis(res[k], torch.float32,
                                                                         chunk)
                 for k in ("attn", "post", "pre")}
        last = bases["post"]
        L = weights.layer(i)
        yield Layer(i + 1, bases, L.W_Q.float(), L.W_K.float(), L.ln1_w.float())


def _score(weights, ids, targets, chunk) -> tuple[int, dict]:
    """Rows scored and the split of the time (:class:`Split`, "other" the rest)."""
    analyses = get_analyses(list(ANALYSES))
    layered = [(a.name, a.layered) for a in analyses]
    SPLIT.install()
    t0 = time.perf_counter()
    rows = score_layers(_layers(weights, ids, chunk), layered, targets,
                        Options(chunk=chunk, per_head=True))
    split = dict(SPLIT.s, other=time.perf_counter() - t0 - sum(SPLIT.s.values()))
    return sum(len(r) for r in rows.values()), split


def step_full(args) -> dict:
    layers, parts, chunk = args
    weights = _weights(layers)
    base, t0 = _rss_gb(), time.perf_counter()
    P = Parts(parts, torch.float32, "cpu", {"PhiBT", "Qbar"})
    targets = {}
    for n in ("PhiBT", "Qbar"):
        norms, sums = _row_norms_sums(n, parts, 1024)  # the cached vectors' cheap half
        from pythia_probe.analysis.factored import row_scales

        scale, mean = row_scales(norms, sums, V_FULL)
        null = Primitives(*[0.0] * 6)  # not the real terms: this benchmark times the scoring
        targets[n] = FactoredTarget(n, P, Vectors(scale, mean, 1.0, 1.0, 0.0, null))
    t1 = time.perf_counter()
    n_rows, split = _score(weights, torch.arange(V_FULL), targets, chunk)
    return {"s": time.perf_counter() - t1, "prep_s": t1 - t0, "rows": n_rows,
            "peak_gb": _rss_gb(), "base_gb": base, "split": split,
            "live": {n: t.live_rows[0].numel() for n, t in targets.items()}}


def step_top(args) -> dict:
    layers, chunk = args
    weights = _weights(layers)
    g = torch.Generator().manual_seed(1)
    base = _rss_gb()
    targets = {n: prepare_target(n, torch.randn(V_TOP, V_TOP, generator=g), dtype=torch.float32)
               for n in ("PhiBT", "Qbar")}
    t1 = time.perf_counter()
    n_rows, split = _score(weights, torch.arange(V_TOP), targets, chunk)
    return {"s": time.perf_counter() - t1, "prep_s": 0.0, "rows": n_rows,
            "peak_gb": _rss_gb(), "base_gb": base, "split": split}


def step_dense(args) -> dict:
    """TransformerLens style: every matrix materialised, its covariance formed."""
    layers, V = args
    weights = _weights(layers)
    g = torch.Generator().manual_seed(1)
    covs = {n: covariance(torch.nn.functional.normalize(torch.randn(V, V, generator=g), dim=1))
            for n in ("PhiBT", "Qbar")}
    base, t1, n_rows = _rss_gb(), time.perf_counter(), 0
    for i, res in enumerate(iter_single_token_layers(weights, torch.arange(V), 4096)):
        L = weights.layer(i)
        for k in ("pre", "attn", "post"):
            n_rows += 1
            frobenius_cosine(covariance(res[k] @ res[k].T), covs["PhiBT"])
        E = res["pre"]
        Ec = (E - E.mean(1, keepdim=True)) * L.ln1_w.float()
        for X in (E, Ec):
            Q, K = torch.einsum("vd,hde->hve", X, L.W_Q.float()), torch.einsum(
                "vd,hde->hve", X, L.W_K.float())
            heads = [Q[h] @ K[h].T for h in range(Q.shape[0])]
            for A in [torch.stack(heads).mean(0), *heads]:
                n_rows += 1
                frobenius_cosine(covariance(A), covs["Qbar"])
    return {"s": time.perf_counter() - t1, "prep_s": 0.0, "rows": n_rows,
            "peak_gb": _rss_gb(), "base_gb": base}


def _run(fn, args, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        return pool.apply(fn, (args,))


def _rates(threads: int) -> dict:
    from pythia_probe.planner.rates import dense_rate, measure

    torch.set_num_threads(threads)
    return {"dense": dense_rate(n=2048), "sparse": measure()["sparse"]}


def _part_macs(V: int, layers: int, live: dict | None, nnz: dict | None) -> dict:
    """Multiply-adds of each part of one step (live / nnz None: the dense top-V path)."""
    w, n_phi = 2049, 1 + 2 * layers  # bases against PhiBT (pre, then attn and post a layer)
    rows = live or {"PhiBT": V, "Qbar": V}
    grams = n_phi * gram_macs(rows["PhiBT"], w) + layers * gram_macs(rows["Qbar"], w)
    products = (n_phi * w * (nnz["W"] + nnz["C"]) + layers * w * nnz["Qbar"] if nnz
                else (n_phi + layers) * V * V * w)
    return {"forward": V * layers * (2 * 2048**2 + 2 * 2048 * 8192),
            "moments": n_phi * gram_macs(V, w), "products": products, "grams": grams}


def _print_split(res: dict, rates: dict, layers: int, nnz: dict) -> None:
    """The measured split of the full and top-5,000 steps and the floor of their ratio."""
    top_s = res["top5000"]["s"]
    for name, V in (("full", V_FULL), ("top5000", V_TOP)):
        r = res[name]
        macs = _part_macs(V, layers, r.get("live"), nnz if name == "full" else None)
        parts = []
        for k, sec in r["split"].items():
            rate = (f" ({macs[k] / sec / 1e9:.0f} G/s)" if k in macs and sec > 0 else "")
            parts.append(f"{k} {sec:.1f}{rate}")
        print(f"{name:>17} split (s, multiply-adds/s): " + ", ".join(parts))
    print(f"rows in the target Grams (the rest are equal rows, counted once): "
          f"{res['full']['live']} of {V_FULL:,}")
    full = res["full"]
    macs = _part_macs(V_FULL, layers, full["live"], nnz)
    fwd = full["split"]["forward"]
    at_peak = (macs["forward"] + macs["moments"] + macs["grams"]) / rates["dense"]
    dspace = res["top5000"]["split"]["d-space"]
    print(f"floor: the full step's forward pass alone is {fwd:.1f} s = {fwd / top_s:.2f}x the "
          f"top5000 step; its dense multiply-adds (forward {macs['forward']:.2e}, moments "
          f"{macs['moments']:.2e}, Grams {macs['grams']:.2e}) at the measured peak take "
          f"{at_peak:.1f} s, plus the d-space algebra as measured in top5000 ({dspace:.1f} s, the "
          f"same in both): {at_peak + dspace:.1f} s = {(at_peak + dspace) / top_s:.2f}x the "
          f"top5000 step with free sparse products")
    top = res["top5000"]
    tmacs = _part_macs(V_TOP, layers, None, None)
    same = sum(macs[k] / max(tmacs[k] / top["split"][k], macs[k] / full["split"][k])
               for k in ("forward", "moments", "grams"))
    print(f"floor at the best rate either step achieved for each of forward pass, moments and "
          f"Grams (load-robust: the two steps ran at different moments of a shared machine): "
          f"{same:.1f} s + d-space {dspace:.1f} s = {(same + dspace) / top_s:.2f}x the top5000 "
          f"step; the forward pass alone {macs['forward'] / tmacs['forward']:.2f}x its forward = "
          f"{macs['forward'] / tmacs['forward'] * top['split']['forward'] / top_s:.2f}x the step")


def _print_scaled_plan(full: dict, rates: dict, layers: int, nnz: dict, plan_nnz: int,
                       n_params: int) -> None:
    """The plan's full step at other non-zero counts, at this run's rates: the synthetic
    sparse rate, and the product rate the full step achieved."""
    scaled = {"W": plan_nnz, "Qbar": plan_nnz, "C": round(nnz["C"] * plan_nnz / nnz["W"])}
    shape = StepShape(V_FULL, 2048, layers, 16, 8192, n_params)
    plan = memory_plan(shape, get_analyses(list(ANALYSES)), mode="factored", nnz=scaled)
    got = _part_macs(V_FULL, layers, full["live"], nnz)["products"] / full["split"]["products"]
    at_run = plan.dense_macs / rates["dense"] + plan.sparse_macs / got
    print(f"plan at nnz {scaled}: {plan.sparse_macs:.2e} sparse multiply-adds a step; "
          f"{plan.seconds(rates):.0f} s at the synthetic sparse rate, {at_run:.0f} s at the "
          f"{got / 1e9:.2f} G/s the full step's products achieved ({layers} layers; 24 layers: "
          f"{plan.seconds(rates) * 24 / layers:.0f} s, {at_run * 24 / layers:.0f} s)")


def run_pythia(layers: int, docs: int, threads: int, chunk: int, dense_full: bool,
               dense_tl: bool = True, plan_nnz: int = 0, repeats: int = 1) -> dict:
    """Every method, the rates, the plans; printed and returned."""
    rates = _rates(threads)
    print(f"matmul peak (float32 GEMM 2048^3, {threads} threads): {rates['dense'] / 1e9:.1f} G "
          f"multiply-adds/s; sparse CSR x dense: {rates['sparse'] / 1e9:.2f} G/s")
    t0 = time.perf_counter()
    parts = zipf_parts(docs)
    nnz = {"C": parts["C"].nnz, "W": parts["W"].nnz, "Qbar": parts["Qbar"].nnz}
    print(f"sparse parts of {docs:,} Zipf documents x {T + 1} tokens in "
          f"{time.perf_counter() - t0:.1f} s: nnz {nnz}")
    n_params = 2 * PYTHIA["d_vocab"] * 2048 + layers * (4 * 2048**2 + 2 * 2048 * 8192)
    res: dict = {}
    for _ in range(repeats):  # alternated, the best of each (a shared machine's load drifts)
        for name, fn, args in (("top5000", step_top, (layers, chunk)),
                               ("full", step_full, (layers, parts, chunk))):
            r = _run(fn, args, threads)
            if name not in res or r["s"] < res[name]["s"]:
                res[name] = r
    peak = _rates(threads)["dense"]
    rates["dense"] = max(rates["dense"], peak)
    print(f"matmul peak again after the steps: {peak / 1e9:.1f} G multiply-adds/s (the larger "
          "is used)")
    if dense_tl:
        res["dense-TL top5000"] = _run(step_dense, (layers, V_TOP), threads)
    if dense_full:
        res["dense-TL full"] = _run(step_dense, (layers, V_FULL), threads)
    chosen = get_analyses(list(ANALYSES))
    plans = {"full": memory_plan(StepShape(V_FULL, 2048, layers, 16, 8192, n_params), chosen,
                                 mode="factored", nnz=nnz),
             "top5000": memory_plan(StepShape(V_TOP, 2048, layers, 16, 8192, n_params),
                                    chosen, mode="dense")}
    for name, r in res.items():
        plan = plans.get(name)
        macs = None if plan is None else plan.dense_macs + plan.sparse_macs
        rate = "" if macs is None else (f", {macs / r['s'] / 1e9:.1f} G multiply-adds/s "
                                        f"({macs / r['s'] / rates['dense']:.0%} of the peak); "
                                        f"planned {plan.seconds(rates):.1f} s")
        print(f"{name:>17}: {layers} layers, {r['rows']} rows in {r['s']:.1f} s (+{r['prep_s']:.1f}"
              f" s setup), peak RSS {r['peak_gb']:.2f} GB ({r['peak_gb'] - r['base_gb']:.2f} GB "
              f"during the step){rate}")
    tl = res.get("dense-TL top5000")
    print(f"full / top5000 step time: {res['full']['s'] / res['top5000']['s']:.2f}x (goal <= 3x)"
          + (f"; dense-TL top5000 / top5000: {tl['s'] / res['top5000']['s']:.1f}x" if tl else ""))
    if not dense_full:
        print(f"dense-TL full: not run (one {V_FULL:,}^2 float32 matrix is "
              f"{V_FULL**2 * 4 / 1e9:.1f} GB and it holds two targets' and several model "
              "covariances; --dense-full runs it)")
    _print_split(res, rates, layers, nnz)
    if plan_nnz:
        _print_scaled_plan(res["full"], rates, layers, nnz, plan_nnz, n_params)
    scale = 24 / layers
    print(f"scaled to 24 layers (linear in layers): full {res['full']['s'] * scale:.0f} s, "
          f"top5000 {res['top5000']['s'] * scale:.0f} s per step on this machine")
    return res


# ---- before / after of the factored parts, side by side in one process -----------------------
def _old_gram(Z: torch.Tensor, shift: torch.Tensor | None = None,
              chunk: int = 4096) -> torch.Tensor:
    """The previous Gram: every row (less ``shift``), the whole product (both triangles)."""
    M = torch.zeros(Z.shape[1], Z.shape[1], dtype=torch.float64)
    for r in range(0, Z.shape[0], chunk):
        Zb = Z[r:r + chunk] if shift is None else Z[r:r + chunk] - shift
        M += (Zb.T @ Zb).to(torch.float64)
    return M


def run_parts_ab(docs: int, threads: int, repeats: int = 2) -> dict:
    """Sparse products (C_T^T Y: untiled vs column tiles), target Grams (every row, whole
    product vs live rows, upper triangle) and a basis's moments (whole vs upper triangle) at
    the full step's shapes (Y [50,277, 2,049] float32), alternated ``repeats`` times, best
    of each; the new result's largest difference from the old printed beside it."""
    from pythia_probe.analysis import factored
    from pythia_probe.analysis.basis import Basis
    from pythia_probe.analysis.factored import row_scales

    torch.set_num_threads(threads)
    parts = zipf_parts(docs)
    P = Parts(parts, torch.float32, "cpu", {"PhiBT", "Qbar"})
    Y = Basis(torch.randn(V_FULL, 2048, generator=torch.Generator().manual_seed(0))
              / 2048**0.5, torch.float32).Y
    best: dict[str, float] = {}

    def timed(key, fn):
        t = time.perf_counter()
        out = fn()
        best[key] = min(best.get(key, float("inf")), time.perf_counter() - t)
        return out

    diffs = {}
    for name in ("PhiBT", "Qbar"):
        scale, mean = row_scales(*_row_norms_sums(name, parts, 1024), V_FULL)
        th = FactoredTarget(name, P, Vectors(scale, mean, 1.0, 1.0, 0.0, Primitives(*[0.0] * 6)))
        rows, n_shared = th.live_rows
        for _ in range(repeats):
            factored.CPU_TILE, tile = 10**9, factored.CPU_TILE
            Z0 = timed(f"{name} products untiled", lambda th=th: th.ct_t(Y))
            factored.CPU_TILE = tile
            Z1 = timed(f"{name} products tiles of {tile}", lambda th=th: th.ct_t(Y))
            M0 = timed(f"{name} Gram every row, whole", lambda Z0=Z0: _old_gram(Z0))
            M1 = timed(f"{name} Gram {rows.numel()} live rows, triangle",
                       lambda th=th, Z1=Z1: th.gram(Z1))
        diffs[name] = (float((Z1 - Z0).abs().max() / Z0.abs().max()),
                       float((M1 - M0).abs().max() / M0.abs().max()))
    shift = Y.mean(dim=0)
    for _ in range(repeats):
        basis = Basis(Y[:, :-1], torch.float32)
        timed("moments whole", lambda: _old_gram(Y, shift))
        timed("moments triangle", basis.moments)
    print(f"parts of {docs:,} Zipf documents, nnz {({k: parts[k].nnz for k in ('C', 'W', 'Qbar')})}"
          f"; {threads} threads, best of {repeats}, alternated:")
    keys = list(best)
    for old, new in zip(keys[0::2], keys[1::2], strict=True):
        print(f"  {old}: {best[old]:.2f} s -> {new}: {best[new]:.2f} s "
              f"({best[old] / best[new]:.2f}x)")
    for name, (dz, dm) in diffs.items():
        print(f"  {name}: max relative difference new vs old, products {dz:.1e}, Gram {dm:.1e}")
    return best
