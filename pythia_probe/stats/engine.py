"""From accumulators to CorpusStats: Bbar/Phibar from counts, compositions, pass 2, top-k.

``batch_stats(tokens, d_vocab)`` runs both passes exactly over one batch (the toy experiment's
theory matrices from the first training batch). The streaming driver (``run.py``) uses the same
steps: ``first_pass`` -> ``QAccumulator`` over the data again -> ``assemble``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pythia_probe import __version__ as CODE_VERSION
from pythia_probe.errors import BadInputError
from pythia_probe.resources import memory_budget
from pythia_probe.stats import compose, kernels
from pythia_probe.stats.corpus_stats import FORMAT, CorpusStats

if TYPE_CHECKING:
    from pythia_probe.stats.accumulate import CountAccumulator, QAccumulator

TILE_ROWS = 1 << 10
EAGER_LIMIT = 16384
"""Above this d_vocab, PhiBT (and SigmaB when offloaded) stay lazy: 20 GB each at 50,304."""


@dataclass
class FirstPass:
    """Final pass-1 matrices (float64) and the accumulator's identity."""

    Bbar: Tensor
    Phibar: Tensor
    SigmaB: Tensor | None
    Gbar: Tensor
    token_counts: Tensor
    n_positions: int
    n_sequences: int
    n_tokens: int
    checksum: list[int]


def bbar_phibar(acc: CountAccumulator, consume: bool = False) -> tuple[Tensor, Tensor]:
    """Bbar = counts/P - rowsum/(P V); Phibar = (W - 1 colsum(W)^T / V) / P, W the context sums.

    consume=True writes the float64 results into the accumulator's own int64 storage (no extra
    memory; the accumulator is unusable afterwards).
    """
    V, P = acc.d_vocab, acc.n_positions
    if P == 0:
        raise BadInputError("no positions were counted (empty corpus or every document skipped)")
    acc.context.normalize()
    big = acc.bigram.view(V, V)
    rowsum = big.sum(1).double()
    hi, lo = acc.context.hi.view(V, V), acc.context.lo.view(V, V)
    colsum = hi.sum(0).double() + lo.sum(0).double() * 2.0 ** -acc.context.F
    B = big.view(torch.float64) if consume else torch.empty(V, V, dtype=torch.float64,
                                                             device=big.device)
    Phi = hi.view(torch.float64) if consume else torch.empty_like(B)
    for sl in compose.slices(V, TILE_ROWS):
        B[sl] = big[sl].double() / P - (rowsum[sl] / (P * V))[:, None]
        W = hi[sl].double() + lo[sl].double() * 2.0 ** -acc.context.F
        Phi[sl] = (W - colsum[None, :] / V) / P
    if consume:
        acc.context.lo = acc.bigram = acc.context.hi = None  # type: ignore[assignment]
    return B, Phi


def first_pass(acc: CountAccumulator, *, consume: bool = False,
               device: str | torch.device | None = None, budget_bytes: int | None = None,
               offload: bool | None = None) -> FirstPass:
    """Finalize pass 1: Bbar, Phibar, then SigmaB and Gbar at full vocabulary (tiled).

    offload: keep the V x V results in host memory and use ``device`` only for matmul tiles
    (default: when a CUDA device could not hold six V x V float64 matrices; see MEMORY.md).
    """
    checksum = acc.checksum()
    counts = acc.token_counts.clone()
    n = (acc.n_positions, acc.n_sequences, acc.n_tokens)
    dev = torch.device(device) if device is not None else acc.device
    host = needs_offload(acc.d_vocab, dev) if offload is None else offload
    Bbar, Phibar = bbar_phibar(acc, consume=consume)
    if host:
        Bbar, Phibar = Bbar.cpu(), Phibar.cpu()
    kw = {"device": dev, "budget_bytes": budget_bytes, "out_device": "cpu" if host else dev}
    SigmaB = compose.sigma_b(Bbar, **kw)
    Gbar = compose.g_bar(SigmaB, Phibar, **kw)
    return FirstPass(Bbar, Phibar, SigmaB, Gbar, counts, *n, checksum)


def needs_offload(d_vocab: int, device: torch.device) -> bool:
    """True when a CUDA device's memory budget cannot hold six V x V float64 matrices."""
    if device.type != "cuda":
        return False
    limit, _ = memory_budget(str(device))
    return limit is None or 6 * 8 * d_vocab * d_vocab > limit


def top_k_ids(token_counts: Tensor, k: int) -> Tensor:
    """The k most frequent token ids, most frequent first (ties: smaller id first)."""
    V = token_counts.numel()
    if not 1 <= k <= V:
        raise BadInputError(f"top-k must be in 1..{V} (d_vocab), got {k}")
    ids = torch.arange(V, device=token_counts.device)
    order = torch.argsort(token_counts * V + (V - 1 - ids), descending=True)
    return order[:k].cpu()


def assemble(fp: FirstPass, q: QAccumulator, meta: dict[str, Any],
             ids: Tensor | None = None, *, device: str | torch.device | None = None,
             budget_bytes: int | None = None) -> CorpusStats:
    """Freeze everything into CorpusStats; with ``ids`` slice after composing at full |V|.

    Results live where Bbar lives; PhiBT is composed eagerly (on ``device``) up to
    EAGER_LIMIT tokens and left lazy above.
    """
    if q.n_positions != fp.n_positions:
        raise ValueError(f"second pass saw {q.n_positions} positions, first pass "
                         f"{fp.n_positions}: the data changed between passes")
    P, home = fp.n_positions, fp.Bbar.device
    t = {"Bbar": fp.Bbar, "Phibar": fp.Phibar, "SigmaB": fp.SigmaB, "Gbar": fp.Gbar,
         "Qbar": q.qbar_sum().to(home, copy=True).div_(P), "Delta": (q.Delta / P).to(home),
         "token_counts": fp.token_counts.to(home)}
    if ids is not None:
        t = _restrict(t, ids)
        i = ids.to(home)
        t["PhiBT"] = fp.Phibar[:, i].T @ fp.Bbar[i].T
    elif fp.Bbar.shape[0] <= EAGER_LIMIT:
        t["PhiBT"] = compose.phi_bt(fp.Bbar, fp.Phibar, device=device,
                                    budget_bytes=budget_bytes)
    t = {k: v for k, v in t.items() if v is not None}
    meta = _full_meta(fp, meta, ids)
    return CorpusStats(t, meta)


def _restrict(t: dict[str, Tensor], ids: Tensor) -> dict[str, Tensor]:
    out = {}
    for name, x in t.items():
        if x is None:
            continue
        if name in ("Qbar", "Delta"):
            out[name] = x.contiguous()  # Qbar was accumulated over the top-k block only
        elif name == "token_counts":
            out[name] = x[ids.to(x.device)]
        else:
            i = ids.to(x.device)
            out[name] = x[i][:, i].contiguous()
    return out


def _full_meta(fp: FirstPass, meta: dict[str, Any], ids: Tensor | None) -> dict[str, Any]:
    return stats_meta(meta, ids, fp.Bbar.shape[0], fp, kernels.kernel_info(fp.Bbar.device))


def stats_meta(meta: dict[str, Any], ids: Tensor | None, V: int, fp: Any,
               kernel: dict[str, Any]) -> dict[str, Any]:
    """Metadata and stats_id of a statistics file; ``fp`` has n_sequences, n_positions,
    n_tokens and the pass-1 checksum (either engine's first pass)."""
    meta = dict(meta)
    meta.update(format=FORMAT, code_version=CODE_VERSION, full_d_vocab=V,
                counts=dict(meta.get("counts", {}), sequences=fp.n_sequences,
                            positions=fp.n_positions, tokens=fp.n_tokens))
    meta["vocab"] = {"restricted": ids is not None, "compose": "full_then_slice",
                     "ids": None if ids is None else ids.tolist(), "full_d_vocab": V}
    meta["kernel"] = kernel  # recorded, not part of the identity (nor is meta["engine"])
    meta["stats_id"] = stats_id(meta, fp.checksum)
    return meta


def stats_id(meta: dict[str, Any], checksum: list[int]) -> str:
    """12 hex digits naming what decided the numbers: the tokenizer's canonical fingerprint
    (not its name or where it was loaded from), the sequence policy, every shard's content
    digest and counts (not its name: a local shard's name is its path), the vocabulary and the
    pass-1 checksum. The same recipe built anywhere gets the same stats_id."""
    tok = meta.get("tokenizer")
    ident = {"tokenizer": None if tok is None else {k: tok.get(k) for k in
                                                    ("sha256", "d_vocab", "scheme")},
             "ledger": [ledger_identity(e) for e in meta.get("ledger") or []],
             **{k: meta.get(k) for k in ("policy", "counts", "vocab", "T")},
             "format": FORMAT, "checksum": checksum}
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def ledger_identity(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger entry without the shard's name when its content digest names it."""
    return {k: v for k, v in entry.items() if k != "shard" or "content" not in entry}
