"""In-context factual recall task: knowledge base, prompts, Assumption 1, confusing prompts.

Vocabulary layout (one id space): subjects ``[0, S)``, answers ``[S, S+N_A)``, relations
``[S+N_A, S+N_A+R)``, then the separator ``"?"``. A prompt with k pairs is
``s1 a1 ... sk ak s_{k+1} ? r*`` followed by the answer ``a_{k+1} = f(s_{k+1}, r)``: the model
predicts ``r*`` at ``"?"`` and the answer at ``r*``.

Relations are paired ``r <-> r ^ 1``; with probability ``rho`` a subject gets the same answer under
both, which is what makes a pair consistent with more than one relation ("ambiguous" pair). A prompt
is "confusing" when any of its pairs is ambiguous. Answers are shared across relations: every
relation draws from the same ``N_A`` answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pythia_probe.errors import BadInputError
from pythia_probe.toy.icrecall.config import TaskConfig


@dataclass(frozen=True)
class KnowledgeBase:
    """f[s, r] = answer index in [0, N_A) for every subject s and relation r."""

    cfg: TaskConfig
    f: torch.Tensor  # (S, R) long

    def answer_token(self, a: torch.Tensor) -> torch.Tensor:
        return a + self.cfg.n_subjects

    def relation_token(self, r: torch.Tensor) -> torch.Tensor:
        return r + self.cfg.n_subjects + self.cfg.n_answers

    @property
    def sep_token(self) -> int:
        return self.cfg.d_vocab - 1


def make_kb(cfg: TaskConfig) -> KnowledgeBase:
    """Draw f uniformly, then copy f[s, r] to the partner r^1 with probability rho."""
    g = torch.Generator().manual_seed(cfg.seed)
    S, R = cfg.n_subjects, cfg.n_relations
    f = torch.randint(cfg.n_answers, (S, R), generator=g)
    copy = torch.rand(S, R // 2, generator=g) < cfg.rho
    even, odd = f[:, 0::2], f[:, 1::2]
    f[:, 1::2] = torch.where(copy, even, odd)
    return KnowledgeBase(cfg, f)


@dataclass(frozen=True)
class Prompts:
    """A batch of prompts. subjects (B, k+1) and answers (B, k+1) are indices (not token ids);
    answers[:, k] is the target a_{k+1}. relation (B,). ambiguous (B, k): pair i alone is consistent
    with more than one relation. confusing (B,) = ambiguous.any(1)."""

    subjects: torch.Tensor
    answers: torch.Tensor
    relation: torch.Tensor
    ambiguous: torch.Tensor

    @property
    def confusing(self) -> torch.Tensor:
        return self.ambiguous.any(1)

    def __len__(self) -> int:
        return int(self.relation.shape[0])

    def tokens(self, kb: KnowledgeBase) -> torch.Tensor:
        """(B, 2k+3) token ids: s1 a1 .. sk ak s_{k+1} ? r (teacher-forced r)."""
        k = self.subjects.shape[1] - 1
        B = len(self)
        out = torch.empty(B, 2 * k + 3, dtype=torch.long)
        out[:, 0:2 * k:2] = self.subjects[:, :k]
        out[:, 1:2 * k:2] = kb.answer_token(self.answers[:, :k])
        out[:, 2 * k] = self.subjects[:, k]
        out[:, 2 * k + 1] = kb.sep_token
        out[:, 2 * k + 2] = kb.relation_token(self.relation)
        return out


def consistent(kb: KnowledgeBase, subjects: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """(B, k, R) bool: relation r maps subject i to answer i."""
    return kb.f[subjects] == answers.unsqueeze(-1)


def _distinct_subjects(B: int, m: int, S: int, g: torch.Generator) -> torch.Tensor:
    """(B, m) distinct uniform subjects (first m of a random permutation, via random keys)."""
    if m * 4 <= S:
        out = torch.randint(S, (B, m), generator=g)
        while True:
            srt = out.sort(1).values
            dup = (srt[:, 1:] == srt[:, :-1]).any(1)
            if not dup.any():
                return out
            out[dup] = torch.randint(S, (int(dup.sum()), m), generator=g)
    return torch.rand(B, S, generator=g).argsort(1)[:, :m]


def sample_prompts(kb: KnowledgeBase, n: int, seed: int, k: int | None = None) -> Prompts:
    """n prompts with r uniform, distinct subjects, rejecting draws that violate Assumption 1
    (the k pairs together must be consistent with r only)."""
    k = kb.cfg.k_pairs if k is None else k
    if n < 1:
        raise BadInputError(f"number of prompts must be >= 1, got {n}")
    if kb.cfg.n_subjects < k + 1:
        raise BadInputError(f"k={k} pairs need at least {k + 1} subjects")
    g = torch.Generator().manual_seed(seed)
    parts: list[tuple[torch.Tensor, ...]] = []
    have = 0
    while have < n:
        B = max(64, int(1.3 * (n - have)))
        subj = _distinct_subjects(B, k + 1, kb.cfg.n_subjects, g)
        rel = torch.randint(kb.cfg.n_relations, (B,), generator=g)
        ans = kb.f[subj, rel.unsqueeze(1)]
        cons = consistent(kb, subj[:, :k], ans[:, :k])
        ok = cons.all(1).sum(-1) == 1
        parts.append((subj[ok], ans[ok], rel[ok], cons[ok].sum(-1) > 1))
        have += int(ok.sum())
    subj, ans, rel, amb = (torch.cat(t)[:n] for t in zip(*parts, strict=True))
    return Prompts(subj, ans, rel, amb)


def expected_confusing_fraction(cfg: TaskConfig, k: int | None = None) -> float:
    """P(confusing | Assumption 1) over random knowledge bases (exact for the construction).

    q = P(f[s, r^1] = f[s, r]) = rho + (1 - rho)/N_A. A pair is unambiguous with probability
    u = (1 - q) (1 - 2/N_A + q/N_A)^{(R-2)/2}; Assumption 1 holds with probability
    (1 - q^k) (1 - 2 N_A^{-k} + (q/N_A)^k)^{(R-2)/2}; subjects are distinct, so rows independent.
    """
    k = cfg.k_pairs if k is None else k
    N, R = cfg.n_answers, cfg.n_relations
    q = cfg.rho + (1 - cfg.rho) / N
    u = (1 - q) * (1 - 2 / N + q / N) ** ((R - 2) / 2)
    p_a1 = (1 - q**k) * (1 - 2 * N**-k + (q / N) ** k) ** ((R - 2) / 2)
    return 1.0 - u**k / p_a1
