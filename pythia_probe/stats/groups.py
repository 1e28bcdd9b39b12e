"""Statistics of parts of the corpus from one build: documents in G groups.

A document's group is its ordinal in the corpus stream mod G (the documents with >= min_chars
characters, within --docs, counted from 0 across the shards in order), so the assignment is the
same whatever the shards, ranks, batch size or resume. A window belongs to the group of its
document (mode 'packed': the document of its first token).

Per group the file keeps the exact pass-1 counts in factored form (token counts, the bigram counts C
and the fixed-point context weights W where the group has them: :class:`GroupCounts`) and the pass-2
sums of Qbar and QbarHead (on the group's pairs) and Delta, computed with the FULL corpus's Gbar and
GbarHead: a part's Qbar, QbarHead and Delta are conditioned on the full-corpus Gbar (the exact ones
would need another pass over the windows per part, each with its own Gbar). ``CorpusStats.subset``
sums the groups asked for (integers exactly; Qbar and Delta in float64) and divides by their
positions.

Pass 2 needs only the total's counts, so while it runs each group's pass-1 tables wait on disk
(:class:`Spill`: written as the group is counted, read back once pass 2 is done): the groups'
tables (24 B per pair of each group) are never resident beside pass 2's working set.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from pythia_probe.errors import BadInputError
from pythia_probe.fileio import remove
from pythia_probe.stats.checkpoint import load_state, save_state
from pythia_probe.stats.config import DEFAULT_GROUPS as DEFAULT_GROUPS  # re-exported
from pythia_probe.stats.factors import Factors, SparseQ
from pythia_probe.stats.tables import CountTable, FixedTable


def q_tensors(prefix: str, q: SparseQ | None) -> dict[str, Tensor]:
    """The tensors of a Qbar-like ``SparseQ`` in a file (none for None)."""
    if q is None:
        return {}
    return {f"{prefix}_indptr": torch.from_numpy(q.indptr),
            f"{prefix}_rows": torch.from_numpy(q.rows), f"{prefix}_vals": torch.from_numpy(q.vals)}


def read_q(t: dict[str, Tensor], prefix: str, side: int) -> SparseQ | None:
    """The ``SparseQ`` stored under ``prefix`` (None when the file has none: QbarHead in a file
    built before it existed)."""
    if f"{prefix}_indptr" not in t:
        return None
    return SparseQ(side, t[f"{prefix}_indptr"].numpy(), t[f"{prefix}_rows"].numpy(),
                   t[f"{prefix}_vals"].numpy())


@dataclass
class GroupCounts:
    """One group's exact pass-1 counts (sparse) and its pass-2 sums (Qbar's and QbarHead's raw
    sums on the group's pairs, Delta's; None until pass 2 is done)."""

    token_counts: Tensor
    bigram_keys: np.ndarray
    bigram_counts: np.ndarray
    context: FixedTable
    n_sequences: int
    n_positions: int
    n_tokens: int
    qbar: SparseQ | None = None
    delta: Tensor | None = None
    qbar_head: SparseQ | None = None

    def counts(self) -> dict[str, int]:
        return {"sequences": self.n_sequences, "positions": self.n_positions,
                "tokens": self.n_tokens}

    def tensors(self, g: int) -> dict[str, Tensor]:
        t = dict(self.count_tensors(), **q_tensors("qbar", self.qbar),
                 **q_tensors("qbar_head", self.qbar_head), Delta=self.delta)
        return {f"group.{g}.{k}": v for k, v in t.items()}

    def count_tensors(self) -> dict[str, Tensor]:
        """The pass-1 tables (shared with the arrays, never copied)."""
        t = {"token_counts": self.token_counts, "bigram_keys": torch.from_numpy(self.bigram_keys),
             "bigram_counts": torch.from_numpy(self.bigram_counts)}
        for i, (k, h, lo) in enumerate(self.context.chunks):
            t.update({f"context_keys.{i}": torch.from_numpy(k),
                      f"context_hi.{i}": torch.from_numpy(h),
                      f"context_lo.{i}": torch.from_numpy(lo)})
        return t

    def layout(self) -> dict[str, Any]:
        return dict(self.counts(), context_chunks=len(self.context.chunks))

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor], g: int, layout: dict[str, Any], side: int
                     ) -> GroupCounts:
        p = f"group.{g}."
        chunks = [tuple(t[f"{p}context_{q}.{i}"].numpy() for q in ("keys", "hi", "lo"))
                  for i in range(layout["context_chunks"])]
        mine = {k[len(p):]: v for k, v in t.items() if k.startswith(p)}
        return cls(t[p + "token_counts"], t[p + "bigram_keys"].numpy(),
                   t[p + "bigram_counts"].numpy(), FixedTable(chunks), layout["sequences"],
                   layout["positions"], layout["tokens"], read_q(mine, "qbar", side),
                   t[p + "Delta"].double(), read_q(mine, "qbar_head", side))


def tables_of(engine_name: str, acc) -> tuple[Tensor, np.ndarray, np.ndarray, FixedTable]:
    """(token counts, bigram keys, bigram counts, W table) of either engine's accumulator."""
    if engine_name == "sparse":
        acc.flush()
        return (torch.from_numpy(acc.token_counts.copy()), acc.bigram.keys, acc.bigram.counts,
                acc.context)
    acc.context.normalize()
    f = Factors.from_dense(acc.d_vocab, max(acc.n_positions, 1), acc.token_counts, acc.bigram,
                           acc.context.hi, acc.context.lo)
    return f.token_counts, f.bigram_keys, f.bigram_counts, f.context


class Spill:
    """The groups' pass-1 tables on disk while pass 2 runs, in a scratch folder (made on the
    first ``put``, removed by ``close``): ``put`` writes a group's tables and drops them from
    memory, ``restore`` reads them all back (bit for bit) and deletes the files."""

    def __init__(self, work_dir: Path | None) -> None:
        self.work_dir = work_dir
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.held: dict[int, tuple[GroupCounts, int]] = {}

    def _path(self, g: int) -> Path:
        if self._tmp is None:
            if self.work_dir is not None:
                Path(self.work_dir).mkdir(parents=True, exist_ok=True)
            self._tmp = tempfile.TemporaryDirectory(prefix="groups-spill-", dir=self.work_dir)
        return Path(self._tmp.name) / f"group-{g}.safetensors"

    def put(self, g: int, part: GroupCounts) -> GroupCounts:
        save_state(self._path(g), part.count_tensors(), {"chunks": len(part.context.chunks)})
        self.held[g] = (part, len(part.context.chunks))
        part.bigram_keys = part.bigram_counts = np.zeros(0, dtype=np.int64)
        part.context = FixedTable()
        return part

    def restore(self) -> None:
        for g, (part, n_chunks) in sorted(self.held.items()):
            t, _ = load_state(self._path(g))
            part.token_counts = t["token_counts"]
            part.bigram_keys, part.bigram_counts = (t[k].numpy() for k in ("bigram_keys",
                                                                           "bigram_counts"))
            part.context = FixedTable([tuple(t[f"context_{q}.{i}"].numpy()
                                             for q in ("keys", "hi", "lo"))
                                       for i in range(n_chunks)])
            remove(self._path(g), [self._tmp.name])
        self.held = {}

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@contextlib.contextmanager
def spilled(work_dir: Path | None) -> Iterator[Spill]:
    """A :class:`Spill` under ``work_dir`` (None: the system's temporary folder), its scratch
    folder removed on exit whatever happens."""
    spill = Spill(work_dir)
    try:
        yield spill
    finally:
        spill.close()


def count_groups(engine, windows, spec, d, dev, spill: Spill | None = None
                 ) -> list[GroupCounts]:
    """Each group's pass-1 counts from the counted windows (the token caches), one group at a
    time (one accumulator in memory), summed over the ranks exactly; with ``spill`` each
    group's tables go to disk as soon as they are counted."""
    units = [windows.load(u) for u in windows.units]
    out = []
    for g in range(spec.groups):
        acc = engine.counter(spec.d_vocab, spec.policy.seq_len, dev)
        for w in units:
            rows = torch.nonzero(w["groups"] == g).view(-1)
            for s in range(0, rows.numel(), spec.batch_size):
                r = rows[s:s + spec.batch_size]
                acc.update(w["tokens"][r].to(torch.int64), w["lengths"][r])
        acc = engine.reduce_counts(d, acc)
        part = GroupCounts(*tables_of(engine.name, acc), acc.n_sequences, acc.n_positions,
                           acc.n_tokens)
        del acc
        out.append(part if spill is None else spill.put(g, part))
    return out


def check_groups(G: int) -> int:
    """G = 0 (no groups) or G >= 2."""
    if not isinstance(G, int) or G < 0 or G == 1:
        raise BadInputError(f"--groups must be 0 (none) or an integer >= 2, got {G!r}")
    return G


def empty_groups(parts: list[GroupCounts]) -> str | None:
    """The line naming the groups that hold no counted window (--groups larger than the
    documents that give windows), or None: they stay in the file, and the jackknife and the
    halves use the others (``CorpusStats.filled_groups``)."""
    empty = [g for g, p in enumerate(parts) if p.n_positions == 0]
    if not empty:
        return None
    G = len(parts)
    return (f"--groups {G}: {len(empty)} of the {G} groups hold no counted window (groups "
            f"{_span(empty)}): the intervals use the other {G - len(empty)}; a smaller "
            "--groups gives every group documents")


def _span(gs: list[int]) -> str:
    """'3, 5, 30..49' for sorted group numbers."""
    runs: list[list[int]] = []
    for g in gs:
        if runs and g == runs[-1][1] + 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def split_rows(groups: Tensor | np.ndarray | None, G: int) -> list[np.ndarray | None]:
    """The rows of each group (G = 0: one part, every row, as None)."""
    if not G:
        return [None]
    g = np.asarray(groups)
    return [np.flatnonzero(g == i) for i in range(G)]


def sum_q(parts: list[SparseQ]) -> SparseQ:
    """The entrywise sum of Qbar parts on the union of their pairs (float64, in part order)."""
    if len(parts) == 1:
        return parts[0]
    total = parts[0].csc()
    for p in parts[1:]:
        total = total + p.csc()
    total = scipy.sparse.csc_matrix(total)
    total.sort_indices()
    return SparseQ(parts[0].side, total.indptr.astype(np.int64, copy=False),
                   total.indices.astype(np.int32, copy=False),
                   total.data.astype(np.float64, copy=False))


def merged(parts: list[GroupCounts], V: int) -> Factors:
    """The factors of the documents of ``parts`` (exact integer sums)."""
    P = sum(p.n_positions for p in parts)
    if P == 0:
        raise BadInputError("these groups hold no counted positions (too few documents for "
                            "--groups G: rebuild with a smaller G)")
    tc = sum(p.token_counts for p in parts[1:]) + parts[0].token_counts
    big, ctx = CountTable(), FixedTable()
    for p in parts:
        big.add(p.bigram_keys, p.bigram_counts)
        for chunk in p.context.chunks:
            ctx.add(*chunk)
    return Factors(V, P, tc.clone(), big.keys, big.counts, ctx)


def docs_per_group(ledger: list[dict[str, Any]], G: int) -> list[int]:
    """Documents of each group: ordinals offset .. offset + docs - 1 of every ledger entry."""
    out = [0] * G
    for e in ledger:
        a, n = int(e.get("doc_offset", 0)), int(e["docs"])
        for g in range(G):
            first = a + (g - a) % G  # the first ordinal >= a in group g
            out[g] += max(0, -(-(a + n - first) // G))
    return out
