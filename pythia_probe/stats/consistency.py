"""The factored statistics file (``stats/2``) checked against its header before any use.

A file whose tensors were edited with their digests updated passes the sha256 check; this one
does not trust the header either: d_vocab, T, the positions, the context chunks, the document
groups (the header's G, the layout's and the tensors stored) and every sparse index pointer
must agree with the tensors held. :func:`check_factored` raises ``ValueError`` naming the first
disagreement (``CorpusStats.load`` turns it into one "corrupt, recompute" line).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from torch import Tensor

GROUP = re.compile(r"group\.(\d+)\.")


def check_factored(t: dict[str, Tensor], meta: dict[str, Any]) -> None:
    """Refuse (ValueError) a factored file whose header and tensors disagree."""
    layout = meta["layout"]
    V, P = int(layout["d_vocab"]), int(layout["positions"])
    _agree("d_vocab", ("layout", V), ("header full_d_vocab", meta.get("full_d_vocab", V)))
    ids = (meta.get("vocab") or {}).get("ids")
    side = V if ids is None else len(ids)
    if ids is not None and (len(set(ids)) != side or not all(0 <= int(i) < V for i in ids)):
        raise ValueError(f"the kept ids are not {side} distinct ids in 0..{V - 1}")
    _agree("d_vocab of the statistics", ("header", meta.get("d_vocab", side)),
           ("the layout" if ids is None else "the kept ids", side))
    T = int(meta.get("T", t["Delta"].numel()))
    counts = (meta.get("counts") or {}).get("positions", P)
    _agree("positions", ("layout", P), ("header counts", counts))
    _check_part(t, "", V, side, T, int(layout["context_chunks"]))
    _check_groups(t, meta, layout, V, side, T)


def _check_groups(t: dict[str, Tensor], meta: dict[str, Any], layout: dict[str, Any], V: int,
                  side: int, T: int) -> None:
    """The header's G, the layout's groups, the header's group counts and the groups stored
    are one number; each group's tensors are whole; their positions sum to the total's."""
    info = meta.get("groups") or {}
    lay = layout.get("groups", [])
    stored = {int(m.group(1)) for k in t for m in [GROUP.match(k)] if m}
    G = int(info.get("G", 0))
    if not (G == len(lay) == len(info.get("counts", [])) == len(stored)) or \
            stored != set(range(len(stored))):
        raise ValueError(f"header says G={G}, its layout lists {len(lay)} groups and "
                         f"{len(info.get('counts', []))} group counts, {len(stored)} groups "
                         "stored")
    for g, (gl, gc) in enumerate(zip(lay, info.get("counts", []), strict=True)):
        for k in ("sequences", "positions", "tokens"):
            _agree(f"group {g} {k}", ("layout", gl[k]), ("header counts", gc[k]))
        _check_part(t, f"group.{g}.", V, side, T, int(gl["context_chunks"]))
    if lay and sum(int(gl["positions"]) for gl in lay) != int(layout["positions"]):
        raise ValueError(f"the groups' positions sum to {sum(gl['positions'] for gl in lay)}, "
                         f"the statistics hold {layout['positions']}")


def _check_part(t: dict[str, Tensor], p: str, V: int, side: int, T: int, chunks: int) -> None:
    """The tensors of the total (``p`` = '') or of one group (``p`` = 'group.g.')."""
    _shape(t, p + "token_counts", V)
    _shape(t, p + "Delta", T)
    _table(t, p, "bigram_keys", ("bigram_counts",), V)
    extra = {k for k in t if k.startswith(p + "context_keys.")} - \
        {f"{p}context_keys.{i}" for i in range(chunks)}
    if extra:
        raise ValueError(f"{len(extra)} context chunks stored beyond the {chunks} of the "
                         f"header ({p or 'total'})")
    for i in range(chunks):
        _table(t, p, f"context_keys.{i}", (f"context_hi.{i}", f"context_lo.{i}"), V)
    for q in ("qbar", "qbar_head"):
        if p + q + "_indptr" in t or q == "qbar":
            _sparse_q(t, p + q, side)


def _table(t: dict[str, Tensor], p: str, keys: str, values: tuple[str, ...], V: int) -> None:
    """Sorted unique keys in 0..V^2-1, one value per key in each of ``values``."""
    k = t[p + keys].numpy()
    for v in values:
        _shape(t, p + v, k.size)
    if k.size and (int(k[0]) < 0 or int(k[-1]) >= V * V or not bool(np.all(k[1:] > k[:-1]))):
        raise ValueError(f"{p + keys}: keys not sorted, unique and in 0..d_vocab^2-1 "
                         f"(d_vocab {V})")


def _sparse_q(t: dict[str, Tensor], p: str, side: int) -> None:
    """CSC over ``side`` keys: indptr [side + 1] from 0, non-decreasing, ending at the entries
    stored; query positions in 0..side-1."""
    _shape(t, p + "_indptr", side + 1)
    indptr, rows = t[p + "_indptr"].numpy(), t[p + "_rows"].reshape(-1).numpy()
    _shape(t, p + "_vals", rows.size)
    if int(indptr[0]) != 0 or bool(np.any(np.diff(indptr) < 0)) or int(indptr[-1]) != rows.size:
        raise ValueError(f"{p}_indptr claims {int(indptr[-1])} entries (from "
                         f"{int(indptr[0])}), {rows.size} stored")
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= side):
        raise ValueError(f"{p}_rows: a position outside 0..{side - 1}")


def _shape(t: dict[str, Tensor], name: str, n: int) -> None:
    if name not in t:
        raise ValueError(f"tensor {name} missing")
    if tuple(t[name].shape) != (n,):
        raise ValueError(f"tensor {name} has shape {tuple(t[name].shape)}, the header implies "
                         f"({n},)")


def _agree(what: str, a: tuple[str, Any], b: tuple[str, Any]) -> None:
    if int(a[1]) != int(b[1]):
        raise ValueError(f"{what}: {a[0]} says {a[1]}, {b[0]} {b[1]}")
