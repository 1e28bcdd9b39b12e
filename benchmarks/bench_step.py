"""One sweep step at Pythia-1.4B shapes, side by side (``bench_analysis.py --pythia`` runs it):

- ``full``: full vocabulary (50,277 statistic ids of 50,304 embedding rows), factored targets
  (the statistics' sparse parts, :mod:`pythia_probe.analysis.factored`), the sweep's own
  layer-major scoring (:func:`pythia_probe.analysis.layers.score_layers`);
- ``top5000``: the 5,000 first ids, dense resident targets (``--targets memory``), the same
  scoring;
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
(:mod:`pythia_probe.analysis.rates`), the achieved rate of each step against it, and the plan's
expected seconds (:func:`pythia_probe.analysis.plan.memory_plan` at those rates).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time

import numpy as np
import scipy.sparse as sp
import torch

from pythia_probe.analysis import Options, get_analyses
from pythia_probe.analysis.cosine import covariance, prepare_target
from pythia_probe.analysis.factored import FactoredTarget, Parts, Vectors, _row_norms_sums
from pythia_probe.analysis.layers import score_layers
from pythia_probe.analysis.plan import StepShape, memory_plan
from pythia_probe.arch import NeoXConfig, iter_single_token_layers
from pythia_probe.linalg import frobenius_cosine

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


def _layers(weights, ids, chunk):
    """The sweep's layer-major streams (sweep.scoring.Scorer.layers without a Scorer)."""
    from pythia_probe.analysis.basis import Basis
    from pythia_probe.analysis.layers import Layer

    last = None
    for i, res in enumerate(iter_single_token_layers(weights, ids, 4096, torch.float32)):
        bases = {k: last if k == "pre" and last is not None else Basis(res[k], torch.float32,
                                                                         chunk)
                 for k in ("attn", "post", "pre")}
        last = bases["post"]
        L = weights.layer(i)
        yield Layer(i + 1, bases, L.W_Q.float(), L.W_K.float(), L.ln1_w.float())


def _score(weights, ids, targets, chunk) -> int:
    analyses = get_analyses(list(ANALYSES))
    layered = [(a.name, a.layered) for a in analyses]
    rows = score_layers(_layers(weights, ids, chunk), layered, targets,
                        Options(chunk=chunk, per_head=True))
    return sum(len(r) for r in rows.values())


def step_full(args) -> dict:
    layers, parts, chunk = args
    weights = _weights(layers)
    base, t0 = _rss_gb(), time.perf_counter()
    P = Parts(parts, torch.float32, "cpu", {"PhiBT", "Qbar"})
    targets = {}
    for n in ("PhiBT", "Qbar"):
        norms, sums = _row_norms_sums(n, parts, 1024)  # the cached vectors' cheap half
        from pythia_probe.analysis.dense import row_scales

        scale, mean = row_scales(norms, sums, V_FULL)
        targets[n] = FactoredTarget(n, P, Vectors(scale, mean, 1.0, 1.0, 0.0))
    t1 = time.perf_counter()
    n_rows = _score(weights, torch.arange(V_FULL), targets, chunk)
    return {"s": time.perf_counter() - t1, "prep_s": t1 - t0, "rows": n_rows,
            "peak_gb": _rss_gb(), "base_gb": base}


def step_top(args) -> dict:
    layers, chunk = args
    weights = _weights(layers)
    g = torch.Generator().manual_seed(1)
    base = _rss_gb()
    targets = {n: prepare_target(n, torch.randn(V_TOP, V_TOP, generator=g), dtype=torch.float32)
               for n in ("PhiBT", "Qbar")}
    t1 = time.perf_counter()
    n_rows = _score(weights, torch.arange(V_TOP), targets, chunk)
    return {"s": time.perf_counter() - t1, "prep_s": 0.0, "rows": n_rows,
            "peak_gb": _rss_gb(), "base_gb": base}


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
    from pythia_probe.analysis.rates import dense_rate, sparse_rate

    torch.set_num_threads(threads)
    return {"dense": dense_rate(n=2048), "sparse": sparse_rate()}


def run_pythia(layers: int, docs: int, threads: int, chunk: int, dense_full: bool) -> dict:
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
    res = {"full": _run(step_full, (layers, parts, chunk), threads),
           "top5000": _run(step_top, (layers, chunk), threads),
           "dense-TL top5000": _run(step_dense, (layers, V_TOP), threads)}
    if dense_full:
        res["dense-TL full"] = _run(step_dense, (layers, V_FULL), threads)
    plans = {"full": memory_plan(StepShape(V_FULL, 2048, layers, 16, 8192, n_params), ANALYSES,
                                 mode="factored", nnz=nnz),
             "top5000": memory_plan(StepShape(V_TOP, 2048, layers, 16, 8192, n_params),
                                    ANALYSES, mode="memory")}
    for name, r in res.items():
        plan = plans.get(name)
        macs = None if plan is None else plan.dense_macs + plan.sparse_macs
        rate = "" if macs is None else (f", {macs / r['s'] / 1e9:.1f} G multiply-adds/s "
                                        f"({macs / r['s'] / rates['dense']:.0%} of the peak); "
                                        f"planned {plan.seconds(rates):.1f} s")
        print(f"{name:>17}: {layers} layers, {r['rows']} rows in {r['s']:.1f} s (+{r['prep_s']:.1f}"
              f" s setup), peak RSS {r['peak_gb']:.2f} GB ({r['peak_gb'] - r['base_gb']:.2f} GB "
              f"during the step){rate}")
    print(f"full / top5000 step time: {res['full']['s'] / res['top5000']['s']:.2f}x (goal <= 3x); "
          f"dense-TL top5000 / top5000: {res['dense-TL top5000']['s'] / res['top5000']['s']:.1f}x")
    if not dense_full:
        print(f"dense-TL full: not run (one {V_FULL:,}^2 float32 matrix is "
              f"{V_FULL**2 * 4 / 1e9:.1f} GB and it holds two targets' and several model "
              "covariances; --dense-full runs it)")
    scale = 24 / layers
    print(f"scaled to 24 layers (linear in layers): full {res['full']['s'] * scale:.0f} s, "
          f"top5000 {res['top5000']['s'] * scale:.0f} s per step on this machine")
    return res
