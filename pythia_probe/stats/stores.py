"""Where a CorpusStats keeps its numbers: :class:`FactoredStore` (the factors of section 6,
Qbar on the pairs that occur, Delta: what both engines produce and the file holds) and
:class:`DenseStore` (dense tensors: files of the first format, and tensors handed in). Both
answer ``block`` and ``product`` for ``result.CorpusStats``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from pythia_probe.errors import CorruptFileError
from pythia_probe.stats.dense import compose
from pythia_probe.stats.factors import Factors, SparseQ
from pythia_probe.stats.groups import GroupCounts, merged, sum_q
from pythia_probe.stats.sparse.tables import FixedTable


class FactoredStore:
    """The statistics as factors (C, W, vectors), Qbar's non-zeros and Delta; ``ids``: the
    token id of each position of a restricted (top-k) vocabulary."""

    def __init__(self, factors: Factors, qbar: SparseQ, delta: Tensor,
                 ids: Tensor | None = None, groups: list[GroupCounts] | None = None) -> None:
        self.factors, self.qbar, self.delta = factors, qbar, delta.double()
        self.groups = list(groups or [])
        """Each group's counts and pass-2 sums (``stats/groups.py``; empty: none kept)."""
        self.ids = None if ids is None else torch.as_tensor(ids, dtype=torch.int64)
        self.d_vocab = factors.d_vocab if ids is None else int(self.ids.numel())
        if qbar.side != self.d_vocab:
            raise CorruptFileError(f"Qbar holds {qbar.side} positions, the statistics "
                                   f"{self.d_vocab}; recompute the statistics")

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
        if name == "Qbar":
            return self.qbar.block(None if rows is None else rows.numpy(),
                                   None if cols is None else cols.numpy())
        full = self.ids is None
        r = None if rows is None and full else self._ids(rows)
        c = None if cols is None and full else self._ids(cols)
        if name == "Bbar":
            return f.bbar_block(r, c)
        if name == "Phibar":
            return f.phibar_block(r, c)
        r, c = self._ids(rows), self._ids(cols)
        return {"SigmaB": f.sigma_block, "PhiBT": f.phibt_block, "Gbar": f.gbar_block}[name](r, c)

    def product(self, name: str, X: Tensor, transposed: bool) -> Tensor:
        """B X (or B^T X) for X [d_vocab, d]; a restricted X acts on its ids (zeros elsewhere)."""
        x = X.detach().cpu().double().numpy()
        if name == "Qbar":
            out = self.qbar.t_mul(x) if transposed else self.qbar.mul(x)
            return torch.from_numpy(np.ascontiguousarray(out))
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
        f, q = self.factors, self.qbar
        t = {"token_counts": f.token_counts, "bigram_keys": torch.from_numpy(f.bigram_keys),
             "bigram_counts": torch.from_numpy(f.bigram_counts),
             "qbar_indptr": torch.from_numpy(q.indptr), "qbar_rows": torch.from_numpy(q.rows),
             "qbar_vals": torch.from_numpy(q.vals), "Delta": self.delta}
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
                     ids: list[int] | None) -> FactoredStore:
        chunks = [tuple(t[f"context_{p}.{i}"].numpy() for p in ("keys", "hi", "lo"))
                  for i in range(layout["context_chunks"])]
        f = Factors(int(layout["d_vocab"]), int(layout["positions"]), t["token_counts"],
                    t["bigram_keys"].numpy(), t["bigram_counts"].numpy(), FixedTable(chunks))
        side = len(ids) if ids is not None else f.d_vocab
        q = SparseQ(side, t["qbar_indptr"].numpy(), t["qbar_rows"].numpy(),
                    t["qbar_vals"].numpy())
        groups = [GroupCounts.from_tensors(t, g, lay, side)
                  for g, lay in enumerate(layout.get("groups", []))]
        return cls(f, q, t["Delta"], ids, groups)

    def subset(self, which: list[int]) -> FactoredStore:
        """The statistics of the documents of groups ``which``: their counts summed exactly,
        Qbar and Delta sums (with the full corpus's Gbar) divided by their positions."""
        parts = [self.groups[g] for g in which]
        f = merged(parts, self.factors.d_vocab)
        q = sum_q([p.qbar for p in parts])
        q = SparseQ(q.side, q.indptr, q.rows, q.vals / f.n_positions)
        delta = sum((p.delta for p in parts[1:]), parts[0].delta.clone()) / f.n_positions
        return FactoredStore(f, q, delta, self.ids)

    def parts(self) -> dict[str, Any]:
        """The sparse parts and vectors (scipy matrices; token ids, not positions)."""
        f = self.factors
        return {"C": f.C.scipy(), "W": f.W.scipy(), "n": f.n, "w": f.colsum.numpy(),
                "positions": f.n_positions, "full_d_vocab": f.d_vocab,
                "ids": None if self.ids is None else self.ids.numpy(),
                "Qbar": self.qbar.csc(), "Delta": self.delta.numpy()}


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

    def matrix(self, name: str) -> Tensor:
        if name not in self._t:
            if self.restricted:
                raise CorruptFileError(f"{name} missing from a top-k restricted statistics "
                                       "file; recompute the statistics")
            dev = self.compose_device or ("cuda" if torch.cuda.is_available() else None)
            B, Phi = self._t["Bbar"], self._t["Phibar"]
            self._t[name] = (compose.sigma_b(B, device=dev) if name == "SigmaB" else
                             compose.phi_bt(B, Phi, device=dev) if name == "PhiBT" else
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
