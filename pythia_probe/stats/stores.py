"""Where a CorpusStats keeps its numbers: :class:`FactoredStore` (the factors of section 6,
Qbar and QbarHead on the pairs that occur, Delta: what both engines produce and the file holds)
and :class:`DenseStore` (dense tensors: files of the first format, and tensors handed in). Both
answer ``block``, ``product`` and ``has`` for ``result.CorpusStats``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import CorruptFileError
from pythia_probe.stats import compose, kept
from pythia_probe.stats.factors import Factors, SparseQ
from pythia_probe.stats.groups import GroupCounts, merged, q_tensors, read_q, sum_q
from pythia_probe.stats.tables import FixedTable

QS = ("Qbar", "QbarHead")
"""The pass-2 statistics: held where they are non-zero (``SparseQ``)."""


class FactoredStore:
    """The statistics as factors (C, W, vectors), Qbar's and QbarHead's non-zeros and Delta;
    ``ids``: the token id of each position of a restricted (top-k) vocabulary; ``compose``:
    how SigmaB, PhiBT, Gbar, GbarHead of a restricted vocabulary are made (``stats/kept.py``:
    'full_then_slice' or 'kept'); ``qbar_head`` None: a file built before QbarHead existed."""

    def __init__(self, factors: Factors, qbar: SparseQ, delta: Tensor,
                 ids: Tensor | None = None, groups: list[GroupCounts] | None = None, *,
                 qbar_head: SparseQ | None = None, compose: str = kept.FULL) -> None:
        self.factors, self.qbar, self.delta = factors, qbar, delta.double()
        self.qbar_head = qbar_head
        self.groups = list(groups or [])
        """Each group's counts and pass-2 sums (``stats/groups.py``; empty: none kept)."""
        self.ids = None if ids is None else torch.as_tensor(ids, dtype=torch.int64)
        self.d_vocab = factors.d_vocab if ids is None else int(self.ids.numel())
        self.compose = kept.check_compose(compose, self.ids is not None)
        self._kept: dict[str, Tensor] | None = None
        for name, q in (("Qbar", qbar), ("QbarHead", qbar_head)):
            if q is not None and q.side != self.d_vocab:
                raise CorruptFileError(f"{name} holds {q.side} positions, the statistics "
                                       f"{self.d_vocab}; recompute the statistics")

    def sparse_q(self, name: str) -> SparseQ | None:
        return self.qbar if name == "Qbar" else self.qbar_head

    def has(self, name: str) -> bool:
        return name != "QbarHead" or self.qbar_head is not None

    def kept_blocks(self) -> dict[str, Tensor]:
        """SigmaB, PhiBT, Gbar, GbarHead over the kept ids (K x K, composed once)."""
        if self._kept is None:
            self._kept = kept.compositions(self.factors, self.ids.numpy())
        return self._kept

    @property
    def token_counts(self) -> Tensor:
        c = self.factors.token_counts
        return c if self.ids is None else c[self.ids]

    def _ids(self, pos: Tensor | None) -> np.ndarray:
        """Token ids of positions (None: every position)."""
        if self.ids is None:
            return np.arange(self.d_vocab) if pos is None else pos.numpy()
        return (self.ids if pos is None else self.ids[pos]).numpy()

    def block(self, name: str, rows: Tensor | None, cols: Tensor | None) -> Tensor:
        f = self.factors
        if name in QS:
            return self.sparse_q(name).block(None if rows is None else rows.numpy(),
                                             None if cols is None else cols.numpy())
        if self.compose == kept.KEPT and name in kept.COMPOSED:
            M = self.kept_blocks()[name]
            M = M if rows is None else M.index_select(0, rows)
            return (M if cols is None else M.index_select(1, cols)).clone()
        full = self.ids is None
        r = None if rows is None and full else self._ids(rows)
        c = None if cols is None and full else self._ids(cols)
        if name == "Bbar":
            return f.bbar_block(r, c)
        if name == "Phibar":
            return f.phibar_block(r, c)
        r, c = self._ids(rows), self._ids(cols)
        return {"SigmaB": f.sigma_block, "PhiBT": f.phibt_block, "Gbar": f.gbar_block,
                "GbarHead": f.gbar_head_block}[name](r, c)

    def product(self, name: str, X: Tensor, transposed: bool) -> Tensor:
        """B X (or B^T X) for X [d_vocab, d]; a restricted X acts on its ids (zeros elsewhere)."""
        x = X.detach().cpu().double().numpy()
        if name in QS:
            q = self.sparse_q(name)
            out = q.t_mul(x) if transposed else q.mul(x)
            return torch.from_numpy(np.ascontiguousarray(out))
        if self.compose == kept.KEPT and name in kept.COMPOSED:
            M = self.kept_blocks()[name]
            return (M.T if transposed else M) @ torch.from_numpy(x)
        f = self.factors
        if self.ids is not None:
            full = np.zeros((f.d_vocab, x.shape[1]))
            full[self.ids.numpy()] = x
            x = full
        out = f.t_mul(name, x) if transposed else f.mul(name, x)
        if self.ids is not None:
            out = out[self.ids.numpy()]
        return torch.from_numpy(np.ascontiguousarray(out))

    def tensors(self) -> dict[str, Tensor]:
        """What the file holds (numpy arrays shared, never copied)."""
        f = self.factors
        t = {"token_counts": f.token_counts, "bigram_keys": torch.from_numpy(f.bigram_keys),
             "bigram_counts": torch.from_numpy(f.bigram_counts), "Delta": self.delta,
             **q_tensors("qbar", self.qbar), **q_tensors("qbar_head", self.qbar_head)}
        for i, (k, h, lo) in enumerate(f.context.chunks):
            t.update({f"context_keys.{i}": torch.from_numpy(k),
                      f"context_hi.{i}": torch.from_numpy(h),
                      f"context_lo.{i}": torch.from_numpy(lo)})
        for g, part in enumerate(self.groups):
            t.update(part.tensors(g))
        return t

    def layout(self) -> dict[str, Any]:
        return {"d_vocab": self.factors.d_vocab, "positions": self.factors.n_positions,
                "context_chunks": len(self.factors.context.chunks),
                "groups": [g.layout() for g in self.groups]}

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor], layout: dict[str, Any],
                     ids: list[int] | None, compose: str | None = None) -> FactoredStore:
        """A store read from a file (one without QbarHead tensors: ``qbar_head`` None)."""
        chunks = [tuple(t[f"context_{p}.{i}"].numpy() for p in ("keys", "hi", "lo"))
                  for i in range(layout["context_chunks"])]
        f = Factors(int(layout["d_vocab"]), int(layout["positions"]), t["token_counts"],
                    t["bigram_keys"].numpy(), t["bigram_counts"].numpy(), FixedTable(chunks))
        side = len(ids) if ids is not None else f.d_vocab
        groups = [GroupCounts.from_tensors(t, g, lay, side)
                  for g, lay in enumerate(layout.get("groups", []))]
        return cls(f, read_q(t, "qbar", side), t["Delta"], ids, groups,
                   qbar_head=read_q(t, "qbar_head", side), compose=compose or kept.FULL)

    def subset(self, which: list[int]) -> FactoredStore:
        """The statistics of the documents of groups ``which``: their counts summed exactly,
        Qbar, QbarHead and Delta sums (with the full corpus's Gbar, GbarHead) divided by
        their positions."""
        parts = [self.groups[g] for g in which]
        f = merged(parts, self.factors.d_vocab)
        qs = {}
        for name in ("qbar", "qbar_head"):
            if all(getattr(p, name) is not None for p in parts):
                q = sum_q([getattr(p, name) for p in parts])
                qs[name] = SparseQ(q.side, q.indptr, q.rows, q.vals / f.n_positions)
        delta = sum((p.delta for p in parts[1:]), parts[0].delta.clone()) / f.n_positions
        return FactoredStore(f, qs["qbar"], delta, self.ids, qbar_head=qs.get("qbar_head"),
                             compose=self.compose)

    def parts(self) -> dict[str, Any]:
        """The sparse parts and vectors (scipy matrices; token ids, not positions)."""
        f = self.factors
        return {"C": f.C.scipy(), "W": f.W.scipy(), "n": f.n, "w": f.colsum.numpy(),
                "positions": f.n_positions, "full_d_vocab": f.d_vocab,
                "ids": None if self.ids is None else self.ids.numpy(),
                "Qbar": self.qbar.csc(), "Delta": self.delta.numpy(),
                **({} if self.qbar_head is None else {"QbarHead": self.qbar_head.csc()})}


class DenseStore:
    """Statistics held as dense tensors: files of the first format, and tensors handed in."""

    def __init__(self, tensors: dict[str, Tensor], restricted: bool,
                 compose_device: str | None = None) -> None:
        missing = [k for k in ("Bbar", "Phibar", "Qbar", "Delta") if k not in tensors]
        if missing:
            raise ValueError(f"CorpusStats needs {missing}")
        self._t, self.restricted = dict(tensors), restricted
        self.compose_device = compose_device
        self.d_vocab = int(tensors["Bbar"].shape[0])
        self.delta = tensors["Delta"]

    @property
    def token_counts(self) -> Tensor | None:
        return self._t.get("token_counts")

    def has(self, name: str) -> bool:
        return name != "QbarHead" or name in self._t

    def matrix(self, name: str) -> Tensor:
        if name not in self._t:
            if self.restricted:
                raise CorruptFileError(f"{name} missing from a top-k restricted statistics "
                                       "file; recompute the statistics")
            dev = self.compose_device or ("cuda" if torch.cuda.is_available() else None)
            B, Phi = self._t["Bbar"], self._t["Phibar"]
            self._t[name] = (compose.sigma_b(B, device=dev) if name == "SigmaB" else
                             compose.phi_bt(B, Phi, device=dev) if name == "PhiBT" else
                             compose.matmul_tiled(B.T, self.matrix("PhiBT"), device=dev)
                             if name == "GbarHead" else
                             compose.g_bar(self.matrix("SigmaB"), Phi, device=dev))
        return self._t[name]

    def block(self, name: str, rows: Tensor | None, cols: Tensor | None) -> Tensor:
        M = self.matrix(name)
        out = M if rows is None else M.index_select(0, rows.to(M.device))
        return out if cols is None else out.index_select(1, cols.to(M.device))

    def product(self, name: str, X: Tensor, transposed: bool) -> Tensor:
        M = self.matrix(name).double()
        return (M.T if transposed else M) @ X.to(M.device).double()

    def tensors(self) -> dict[str, Tensor]:
        return dict(self._t)
