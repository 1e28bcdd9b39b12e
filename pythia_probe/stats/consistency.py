"""The factored statistics file (``stats/2``) checked against its header before any use.

A file whose tensors were edited with their digests updated passes the sha256 check; this one
does not trust the header either: d_vocab, T, the positions, the context chunks, the document
groups (the header's G, the layout's and the tensors stored) and every sparse index pointer
must agree with the tensors held. :func:`check_factored` raises ``ValueError`` naming the first
disagreement (``result._read`` turns it into one "corrupt, recompute" line). The counts and
shapes are checked from the file's header alone (``read_meta``: what the sweep reads before
deciding on intervals), the values (sorted keys, index pointers) once the tensors are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

GROUP = re.compile(r"group\.(\d+)\.")


def check_factored(shapes: dict[str, tuple], meta: dict[str, Any],
                   t: dict[str, Tensor] | None = None) -> None:
    """Refuse (ValueError) a factored file whose header disagrees with its tensors' ``shapes``
    (and, given the tensors ``t``, with their values)."""
    layout = meta["layout"]
    V, P = int(layout["d_vocab"]), int(layout["positions"])
    _agree("d_vocab", ("layout", V), ("header full_d_vocab", meta.get("full_d_vocab", V)))
    ids = (meta.get("vocab") or {}).get("ids")
    side = V if ids is None else len(ids)
    if ids is not None and (len(set(ids)) != side or not all(0 <= int(i) < V for i in ids)):
        raise ValueError(f"the kept ids are not {side} distinct ids in 0..{V - 1}")
    _agree("d_vocab of the statistics", ("header", meta.get("d_vocab", side)),
           ("the layout" if ids is None else "the kept ids", side))
    T = int(meta["T"])
    counts = (meta.get("counts") or {}).get("positions", P)
    _agree("positions", ("layout", P), ("header counts", counts))
    part = Part(shapes, t, V, side, T)
    part.check("", int(layout["context_chunks"]))
    _check_groups(part, meta, layout)


def _check_groups(part: Part, meta: dict[str, Any], layout: dict[str, Any]) -> None:
    """The header's G, the layout's groups, the header's group counts and the groups stored
    are one number; each group's tensors are whole; their positions sum to the total's."""
    info = meta.get("groups") or {}
    lay = layout.get("groups", [])
    stored = {int(m.group(1)) for k in part.shapes for m in [GROUP.match(k)] if m}
    G = int(info.get("G", 0))
    if not (G == len(lay) == len(info.get("counts", [])) == len(stored)) or \
            stored != set(range(len(stored))):
        raise ValueError(f"header says G={G}, its layout lists {len(lay)} groups and "
                         f"{len(info.get('counts', []))} group counts, {len(stored)} groups "
                         "stored")
    for g, (gl, gc) in enumerate(zip(lay, info.get("counts", []), strict=True)):
        for k in ("sequences", "positions", "tokens"):
            _agree(f"group {g} {k}", ("layout", gl[k]), ("header counts", gc[k]))
        part.check(f"group.{g}.", int(gl["context_chunks"]))
    if lay and sum(int(gl["positions"]) for gl in lay) != int(layout["positions"]):
        raise ValueError(f"the groups' positions sum to {sum(gl['positions'] for gl in lay)}, "
                         f"the statistics hold {layout['positions']}")


@dataclass
class Part:
    """What the parts of a file are checked against: the tensors' shapes (and values, when
    read), d_vocab V, the statistics' side (the kept ids) and T."""

    shapes: dict[str, tuple]
    t: dict[str, Tensor] | None
    V: int
    side: int
    T: int

    def check(self, p: str, chunks: int) -> None:
        """The tensors of the total (``p`` = '') or of one group (``p`` = 'group.g.')."""
        self.shape(p + "token_counts", self.V)
        self.shape(p + "Delta", self.T)
        self.table(p + "bigram_keys", (p + "bigram_counts",))
        extra = {k for k in self.shapes if k.startswith(p + "context_keys.")} - \
            {f"{p}context_keys.{i}" for i in range(chunks)}
        if extra:
            raise ValueError(f"{len(extra)} context chunks stored beyond the {chunks} of the "
                             f"header ({p or 'total'})")
        for i in range(chunks):
            self.table(f"{p}context_keys.{i}", (f"{p}context_hi.{i}", f"{p}context_lo.{i}"))
        for q in ("qbar", "qbar_head"):
            if p + q + "_indptr" in self.shapes or q == "qbar":
                self.sparse_q(p + q)

    def table(self, keys: str, values: tuple[str, ...]) -> None:
        """Sorted unique keys in 0..V^2-1, one value per key in each of ``values``."""
        n = self.shape(keys)
        for v in values:
            self.shape(v, n)
        k = None if self.t is None else self.t[keys].numpy()
        if k is not None and k.size and (int(k[0]) < 0 or int(k[-1]) >= self.V ** 2
                                         or not bool(np.all(k[1:] > k[:-1]))):
            raise ValueError(f"{keys}: keys not sorted, unique and in 0..d_vocab^2-1 "
                             f"(d_vocab {self.V})")

    def sparse_q(self, p: str) -> None:
        """CSC over ``side`` keys: indptr [side + 1] from 0, non-decreasing, ending at the
        entries stored; query positions in 0..side-1."""
        self.shape(p + "_indptr", self.side + 1)
        n = self.shape(p + "_rows")
        self.shape(p + "_vals", n)
        if self.t is None:
            return
        indptr, rows = self.t[p + "_indptr"].numpy(), self.t[p + "_rows"].numpy()
        if int(indptr[0]) != 0 or bool(np.any(np.diff(indptr) < 0)) or int(indptr[-1]) != n:
            raise ValueError(f"{p}_indptr claims {int(indptr[-1])} entries (from "
                             f"{int(indptr[0])}), {n} stored")
        if n and (int(rows.min()) < 0 or int(rows.max()) >= self.side):
            raise ValueError(f"{p}_rows: a position outside 0..{self.side - 1}")

    def shape(self, name: str, n: int | None = None) -> int:
        """The length of the 1-d tensor ``name`` (checked to be ``n`` when given)."""
        if name not in self.shapes:
            raise ValueError(f"tensor {name} missing")
        got = tuple(self.shapes[name])
        if len(got) != 1 or (n is not None and got[0] != n):
            raise ValueError(f"tensor {name} has shape {got}, the header implies "
                             f"({n if n is not None else 'n'},)")
        return got[0]


def _agree(what: str, a: tuple[str, Any], b: tuple[str, Any]) -> None:
    if int(a[1]) != int(b[1]):
        raise ValueError(f"{what}: {a[0]} says {a[1]}, {b[0]} {b[1]}")
