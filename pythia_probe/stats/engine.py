"""The statistics engine interface: what the one driver (``stats/driver.py``) asks of an engine.

An engine is one storage variant of the same exact computation (the way tokengrams keeps one
interface over in-memory, memory-mapped and sharded indexes). The driver owns the corpus, the
batches, the ledger, the token caches, resume, checkpoints and ranks; an engine owns how the
numbers are held:

- ``counter`` / ``restore_counts`` (count): the pass-1 accumulator, ``update(tokens, lengths)
  -> self``, exact ``merge``, ``state()`` for checkpoints, ``checksum()`` for ``stats_id``;
- ``reduce_counts`` (reduce): the exact sum of every rank's counts, on every rank;
- ``first_pass``: the final pass-1 statistics (Bbar, Phibar and what pass 2 needs of Gbar);
- ``second_pass``: Qbar and QbarHead (their non-zero sums, ``factors.SparseQ``, by name) and
  Delta sums over the windows again (reduced over the ranks), resuming from a checkpoint
  written with the driver's one checkpoint writer; with document groups, each group's sums too
  (the same Gbar, GbarHead); over kept ids (``stats/kept.py``) with their K x K compositions;
- ``assemble``: the frozen :class:`~pythia_probe.stats.result.CorpusStats`, factored (the
  non-zero pass-1 counts, Qbar's and QbarHead's non-zeros and Delta: the same file from both
  engines).

``stats/dense/`` keeps V x V tensors (any device, torch kernels); ``stats/sparse/`` keeps
counts where the corpus has them and composes Gbar by column tiles (CPU, C kernels). Both give
pass 1 and Bbar, Phibar bit for bit and the rest to float64 rounding, and the same stats_id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor

from pythia_probe.errors import BadInputError, MismatchError
from pythia_probe.ranks import Ranks
from pythia_probe.stats import kept
from pythia_probe.stats.factors import SparseQ
from pythia_probe.stats.result import CorpusStats, stats_meta
from pythia_probe.stats.stores import FactoredStore


class Engine(ABC):
    """One way of holding the statistics while they are computed (see the module docstring)."""

    name: ClassVar[str]
    counts_kind: ClassVar[str]
    """The ``kind`` its pass-1 checkpoints record (a resumed run keeps its engine)."""

    def available(self) -> bool:
        """Whether this engine can run here (its compiled kernels are built)."""
        return True

    @abstractmethod
    def counter(self, d_vocab: int, T: int, device: str | torch.device) -> Any:
        """An empty pass-1 accumulator."""

    @abstractmethod
    def restore_counts(self, tensors: dict[str, Tensor], state: dict[str, Any],
                       device: str | torch.device) -> Any:
        """The pass-1 accumulator of a checkpoint."""

    @abstractmethod
    def reduce_counts(self, d: Ranks, acc: Any) -> Any:
        """Exact sum of the ranks' accumulators, with the merged ledger, on every rank."""

    @abstractmethod
    def first_pass(self, acc: Any, spec: Any, d: Ranks) -> Any:
        """The final pass-1 statistics (the same object on every rank)."""

    @abstractmethod
    def second_pass(self, fp: Any, windows: Any, ids: Tensor | None, spec: Any,
                    d: Ranks) -> tuple[dict[str, SparseQ], Tensor, list | None]:
        """({"Qbar", "QbarHead"} sums on the pairs that occur, Delta sum [T], and with
        ``spec.groups`` each group's ({"Qbar", "QbarHead"}, Delta) sums with this same Gbar,
        GbarHead, else None) over every rank's windows, on rank 0 at least."""

    @abstractmethod
    def kernel(self, fp: Any, spec: Any) -> dict[str, Any]:
        """Which kernels ran (recorded in the metadata, not part of the identity)."""

    def assemble(self, fp: Any, Q: SparseQ | dict[str, SparseQ], D: Tensor,
                 meta: dict[str, Any], ids: Tensor | None, spec: Any,
                 groups: list | None = None) -> CorpusStats:
        """The frozen statistics, the same file from both engines: the factors of pass 1,
        Qbar's and QbarHead's non-zeros and Delta, divided by the positions (restricted to
        ``ids``; with the groups' counts and sums as they are, ``stats/groups.py``). ``Q``:
        the pass-2 sums by name (a lone SparseQ: Qbar, no QbarHead)."""
        P = fp.n_positions
        qs = Q if isinstance(Q, dict) else {"Qbar": Q}
        for q in qs.values():
            q.vals /= P  # in place
        kernel = self.kernel(fp, spec)
        compose = getattr(spec, "compose", kept.FULL)
        store = FactoredStore(fp.factors, qs["Qbar"], D.double() / P, ids, groups,
                              qbar_head=qs.get("QbarHead"), compose=compose)
        return CorpusStats(store, stats_meta(meta, ids, fp.factors.d_vocab, fp, kernel, compose))


def check_mergeable(a: Any, b: Any) -> None:
    """Two partial accumulators of one kind, shape and T, with no shard counted in both."""
    if type(a) is not type(b) or (a.d_vocab, a.T) != (b.d_vocab, b.T):
        raise MismatchError(f"cannot merge {type(b).__name__}(d_vocab={b.d_vocab}, T={b.T}) "
                            f"into {type(a).__name__}(d_vocab={a.d_vocab}, T={a.T})")
    twice = {e["shard"] for e in a.ledger} & {e["shard"] for e in b.ledger}
    if twice:
        raise MismatchError(f"shards counted twice in merge: {sorted(twice)[:5]}")


def row_chunks(positions: Tensor, max_positions: int) -> list[slice]:
    """Split rows so that each chunk has at most ``max_positions`` predicted positions."""
    csum = torch.cumsum(positions.cpu(), 0).tolist()
    out, start, base = [], 0, 0
    for i, c in enumerate(csum):
        if c - base > max_positions and i > start:
            out.append(slice(start, i))
            start, base = i, csum[i - 1]
    out.append(slice(start, len(csum)))
    return out


def top_k_ids(token_counts: Tensor, k: int) -> Tensor:
    """The k most frequent token ids, most frequent first (ties: smaller id first)."""
    V = token_counts.numel()
    if not 1 <= k <= V:
        raise BadInputError(f"top-k must be in 1..{V} (d_vocab), got {k}")
    ids = torch.arange(V, device=token_counts.device)
    order = torch.argsort(token_counts * V + (V - 1 - ids), descending=True)
    return order[:k].cpu()


def check_positions(second: int, first: int) -> None:
    """Pass 2 must see exactly the positions pass 1 counted."""
    if second != first:
        raise MismatchError(f"pass 2 saw {second} positions, pass 1 counted {first}: the data "
                            "changed between the passes")
