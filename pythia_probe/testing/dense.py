"""The tests' dense oracle for a target: T [V, V] held as C_T = rownorm(T) row-centred,
materialised in float64, every V x V product formed (B = C_T C_T^T). It has the target protocol
of :mod:`pythia_probe.analysis.cosine` (``grams``, ``norm``, ``trace``, ``total``,
``null_terms``), the vectors of :class:`~pythia_probe.analysis.factored.Vectors` (``scale``,
``mean``) and ``weighted_column_blocks``, so the factored path is checked against it on the
same inputs. Literal and slow: V of a test only."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from pythia_probe.analysis.chance import Primitives, vector_terms


@dataclass(frozen=True, eq=False)
class DenseTarget:
    """A target matrix T materialised as C_T (float64)."""

    name: str
    T: Tensor

    dtype = torch.float64

    @property
    def d_vocab(self) -> int:
        return self.T.shape[0]

    @cached_property
    def scale(self) -> Tensor:
        """1 / row norm of T (0 for a zero row)."""
        norms = torch.linalg.vector_norm(self.T.to(torch.float64), dim=1)
        return torch.where(norms > 0, 1 / norms.clamp_min(1e-300), torch.zeros_like(norms))

    @cached_property
    def mean(self) -> Tensor:
        """The row means of rownorm(T)."""
        return (self.T.to(torch.float64) * self.scale[:, None]).mean(dim=1)

    @cached_property
    def C(self) -> Tensor:
        """C_T = D T - m 1^T."""
        return self.T.to(torch.float64) * self.scale[:, None] - self.mean[:, None]

    @cached_property
    def B(self) -> Tensor:
        return self.C @ self.C.T

    @property
    def norm(self) -> float:
        return float(torch.linalg.matrix_norm(self.B))

    @property
    def trace(self) -> float:
        return float(self.B.trace())

    @property
    def total(self) -> float:
        return float(self.B.sum())

    @property
    def null_terms(self) -> Primitives:
        return vector_terms(self.B.diagonal().clone(), self.B.sum(dim=1), self.norm ** 2,
                            self.total)

    def grams(self, F: Tensor, edges: Sequence[int], chunk: int = 0) -> list[Tensor]:
        """(F_i^T C_T)(F_i^T C_T)^T for each column group of F, float64."""
        P = F.to(torch.float64).T @ self.C
        return [P[s:e] @ P[s:e].T for s, e in zip(edges, edges[1:], strict=False)]

    def weighted_column_blocks(self, chunk: int = 1024) -> Iterator[tuple[Tensor, Tensor]]:
        """(ones, C_T[:, J]) over column blocks J."""
        for s in range(0, self.d_vocab, chunk):
            block = self.C[:, s:s + chunk]
            yield torch.ones(block.shape[1], dtype=torch.float64), block
