"""Pass 2 of the dense engine: Qbar and Delta (Eqs. 14-17) from the final Gbar, in float64.

This is where the dense engine accumulates Qbar: :func:`add_q` scatters Q_i (Eq. 16, the
softmax Jacobian at uniform causal attention applied to M_i = (Y_i - U) Gbar X_i^T) into
Qbar[x_t, x_j] and Delta[t - j], batch by batch, in torch on any device. Resume is bit for bit
(same batches, same order); merges of partial sums agree to float64 rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pythia_probe.errors import MismatchError
from pythia_probe.ranks import Ranks
from pythia_probe.stats import engine
from pythia_probe.stats.checkpoint import Checkpoint
from pythia_probe.stats.dense import kernels
from pythia_probe.stats.sequences import as_ids, check_batch, trimmed


def add_q(q: QAccumulator, tokens: Tensor, lengths: Tensor) -> None:
    """Scatter Q_i (Eq. 16) into ``q.Qbar[x_t, x_j]`` and ``q.Delta[t - j]`` for one batch.

    ``q.Gc`` is the column-centred Gbar, flattened: M_i[t, k] = Gc[y_t, x_k]. ``q.row_of`` maps
    a token id to its row of a restricted (top-k) Qbar, k (a dummy row dropped at the end) when
    outside; None = full vocabulary.
    """
    Qbar, Delta, Gc, d_vocab, row_of, ws = q.Qbar, q.Delta, q.Gc, q.n_ids, q.row_of, q._ws
    n, T = tokens.shape[0], tokens.shape[1] - 1
    tokens = kernels.clean(tokens, lengths)
    t, m = kernels.pair_index(T, tokens.device)
    dev = tokens.device
    keys = kernels.pair_keys(tokens[:, 1:], tokens[:, :-1], d_vocab, ws).reshape(-1)
    M = ws.get("M", (n, t.numel()), torch.float64, dev)
    torch.index_select(Gc, 0, keys, out=M.view(-1))              # M_i[t, m], [n, P]
    mask = kernels.position_mask(lengths, T)
    if mask is not None:
        M.mul_(kernels.per_pair(mask.to(M.dtype)))
    inv_t = 1.0 / torch.arange(1, T + 1, dtype=M.dtype, device=dev)
    centre = kernels.position_sums(M, T) * (inv_t * inv_t)[None, :]      # mean_t / t
    M.mul_(kernels.pair_inv_t(T, dev)[None, :])
    q = kernels.sub_per_position(M, centre)                               # Q_i[t, m]
    Delta.index_add_(0, t - m, q.sum(0))
    x = tokens[:, :-1] if row_of is None else row_of[tokens[:, :-1]]
    k = d_vocab if row_of is None else int(round(Qbar.numel() ** 0.5))
    Qbar.index_add_(0, kernels.pair_keys(x, x, k, ws).reshape(-1), q.view(-1))


class QAccumulator:
    """Pass 2: Qbar (optionally only the top-k block) and Delta from the final Gbar (or any
    V x V matrix in its place: GbarHead gives QbarHead), or over kept ids from their
    composition's table (``remap``)."""

    kind = "q"

    def __init__(self, Gbar: Tensor, T: int, ids: Tensor | None = None,
                 device: str | torch.device | None = None,
                 shared: QAccumulator | None = None, remap: Tensor | None = None) -> None:
        """``shared``: an accumulator (of other windows: another group) whose Gc this one
        uses (one copy of Gbar in memory). ``remap`` (token id -> kept position, K for every
        other id): ``Gbar`` is then pass 2's table over the kept positions and the void id K,
        already centred (``kept.centred``, [K+1, K+1]); tokens are mapped through ``remap``
        and Qbar is the [K, K] block of the kept ids."""
        self.device = torch.device(device) if device is not None else Gbar.device
        self.n_ids, self.T = Gbar.shape[0], T
        self.d_vocab = self.n_ids if remap is None else int(remap.numel())
        self.remap = None if remap is None else remap.to(self.device)
        if shared is not None:
            self.Gc = shared.Gc
        else:
            self.Gc = torch.empty(Gbar.numel(), dtype=torch.float64, device=self.device)
            Gc = self.Gc.view(self.n_ids, self.n_ids)
            Gc.copy_(Gbar)  # M_i[t, k] = Gbar[y_t, x_k] - colsum(Gbar)[x_k] / V, no extra copy
            if remap is None:
                Gc -= Gc.sum(0, keepdim=True) / self.d_vocab
        self.k = self.d_vocab if ids is None else int(ids.numel())
        self.row_of = None
        side = self.k
        if remap is not None:  # tokens become kept positions; the void id's row dropped
            side = self.n_ids
        elif ids is not None:  # top-k block plus one dummy row/column for all other tokens
            self.row_of = torch.full((self.d_vocab,), self.k, dtype=torch.int64,
                                     device=self.device)
            self.row_of[ids.to(self.device)] = torch.arange(self.k, device=self.device)
            side = self.k + 1
        self.Qbar = torch.zeros(side * side, dtype=torch.float64, device=self.device)
        self.Delta = torch.zeros(T, dtype=torch.float64, device=self.device)
        self.n_positions = 0
        self.ledger: list[dict[str, Any]] = []
        self._ws = kernels.Workspace()

    def qbar_sum(self) -> Tensor:
        """The accumulated sum of X^T Q X as [k, k] (dummy row/column dropped)."""
        side = int(round(self.Qbar.numel() ** 0.5))
        return self.Qbar.view(side, side)[: self.k, : self.k]

    def update(self, tokens: Tensor, lengths: Tensor | None = None) -> QAccumulator:
        tokens = as_ids(tokens, self.device)
        lengths = check_batch(tokens, lengths, self.d_vocab, self.T)
        tokens = trimmed(tokens, lengths)
        if self.remap is not None:
            tokens = self.remap[kernels.clean(tokens, lengths)]
        add_q(self, tokens, lengths)
        self.n_positions += int((lengths - 1).sum())
        return self

    def merge(self, other: QAccumulator) -> QAccumulator:
        engine.check_mergeable(self, other)
        self.Qbar += other.Qbar.to(self.device)
        self.Delta += other.Delta.to(self.device)
        self.n_positions += other.n_positions
        self.ledger = self.ledger + other.ledger
        return self

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return ({"Qbar_sum": self.Qbar, "Delta_sum": self.Delta},
                {"kind": self.kind, "d_vocab": self.d_vocab, "T": self.T,
                 "n_positions": self.n_positions, "ledger": self.ledger})

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any]) -> QAccumulator:
        if meta.get("kind") != self.kind or meta["T"] != self.T or \
                meta["d_vocab"] != self.d_vocab:
            raise MismatchError("pass-2 checkpoint does not match these statistics")
        self.Qbar.copy_(tensors["Qbar_sum"])
        self.Delta.copy_(tensors["Delta_sum"])
        self.n_positions, self.ledger = meta["n_positions"], meta["ledger"]
        return self


def checkpoint(spec, d: Ranks, fp) -> Checkpoint:
    """This rank's pass-2 checkpoint (none without a work folder), named by the run and the
    pass-1 checksum of ``fp``."""
    path = spec.work_dir and spec.work_dir / f"pass2-rank{d.rank}-of{d.world}.safetensors"
    return Checkpoint(path, dict(spec.identity, checksum=fp.checksum),
                      every=spec.checkpoint_every)


def state(qs: list[QAccumulator]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """One pass-2 checkpoint of every group's and target's accumulator (the first's ledger:
    units done)."""
    if len(qs) == 1:
        return qs[0].state()
    tensors, meta = qs[0].state()
    for g, q in enumerate(qs[1:], 1):
        t, m = q.state()
        tensors.update({f"{k}.{g}": v for k, v in t.items()})
        meta[f"n_positions.{g}"] = m["n_positions"]
    return tensors, dict(meta, parts=len(qs))


def load_all(qs: list[QAccumulator], tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    """Every group's and target's accumulator from one pass-2 checkpoint."""
    if meta.get("parts", 1) != len(qs):
        raise MismatchError("the pass-2 checkpoint has another number of groups or targets "
                            "(written by an older version?); delete it to run pass 2 again")
    qs[0].load_state(tensors, meta)
    for g, q in enumerate(qs[1:], 1):
        q.load_state({k: tensors[f"{k}.{g}"] for k in ("Qbar_sum", "Delta_sum")},
                     dict(meta, n_positions=meta[f"n_positions.{g}"], ledger=[]))
