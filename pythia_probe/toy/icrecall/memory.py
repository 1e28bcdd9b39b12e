"""Frozen knowledge memories: a constructed associative memory and a pre-trained MLP.

Both read an attention-weighted bag of tokens, h = sum_j w_j e_{x_j}, and return logits over one
token type (relations for the first decoding step, answers for the second).

Constructed memory: every stored triple (s, r, a) has a relation-inference unit that votes
``vote(<e_s, h>, <e_a, h>)`` for r and an answer-retrieval unit that votes
``vote(<e_s, h>, <e_r, h>)`` for a; logits = beta * summed votes. vote = "product" (x*y, a quadratic
AND built from two quadratic neurons) or "minpow" (relu(min(x, y) - threshold)^power: an AND with a
threshold, concave in a pair's mass for power < 1) or "andprod" (relu(x*y - threshold)^power:
an AND of the two tokens whose threshold sits between the uniform-attention read-out and the
pairwise-pattern read-out; the default). ``smooth`` softens relu into a softplus. Token
embeddings are random N(0, I/d) (the interference noise that makes ties real) or one-hot.
<e_t, h> is read from the Gram matrix E E^T while it fits in ``gram_elems`` entries, else as
h E^T (so large vocabularies fit); votes are gathered per triple in batch chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pythia_probe.errors import BadInputError
from pythia_probe.toy.icrecall.task import KnowledgeBase

VOTES = ("product", "minpow", "andprod")
ROW_LAWS = ("softmax", "dirichlet")  # pre-training's attention-like rows (pretrained.py)
EMBEDDINGS = ("random", "onehot")
BETA_DEFAULT = {"constructed": 400.0, "pretrained": 2.0}


@dataclass(frozen=True)
class MemoryConfig:
    """kind: constructed | pretrained. embedding: random | onehot; d_model for random.
    vote, threshold, power, smooth: the constructed memory's AND unit (see module doc).
    beta: inverse temperature applied to memory logits (None: the kind's default, BETA_DEFAULT:
    400 for the constructed votes; 2 for the pre-trained MLP, i.e. twice its logits as trained,
    sharp enough that sampling from the ideal row is near-certain). Pre-trained MLP: d_hidden,
    pretrain_epochs, pretrain_lr, pretrain_mix (fraction of the pair examples that are two-pair
    prompts), pretrain_rows (fraction of all relation and answer examples that are whole prompts,
    s3 and '?' included, read through a random attention row), pretrain_threshold (a pair counts
    in a relation example's label when the product of its two weights exceeds it; none counted:
    the blank label, uniform over relations), pretrain_row_law ('softmax': rows softmax(s z),
    s ~ U(0, pretrain_row_sigma); 'dirichlet': Dirichlet(1) rows); see pretrained.py."""

    kind: str = "constructed"
    embedding: str = "random"
    d_model: int = 1024
    vote: str = "andprod"
    threshold: float = 0.035
    power: float = 1.0
    smooth: float = 0.0025
    beta: float | None = None
    d_hidden: int = 1024
    pretrain_epochs: int = 300
    pretrain_lr: float = 1e-2
    pretrain_mix: float = 0.75
    pretrain_rows: float = 0.5
    pretrain_threshold: float = 0.05
    pretrain_row_law: str = "softmax"
    pretrain_row_sigma: float = 3.0
    seed: int = field(default=0, metadata={"flag": "memory_seed"})

    def __post_init__(self) -> None:
        if self.kind not in ("constructed", "pretrained"):
            raise BadInputError("memory kind must be 'constructed' or 'pretrained', "
                             f"got {self.kind!r}")
        if self.embedding not in EMBEDDINGS:
            raise BadInputError(f"embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")
        if self.vote not in VOTES:
            raise BadInputError(f"vote must be one of {VOTES}, got {self.vote!r}")
        if self.kind == "pretrained" and self.embedding != "random":
            raise BadInputError("the pre-trained memory needs embedding='random'")
        for name in ("d_model", "d_hidden", "pretrain_epochs"):
            if getattr(self, name) < 1:
                raise BadInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad_beta = self.beta is not None and self.beta <= 0
        if bad_beta or self.power <= 0 or self.threshold < 0 or self.smooth < 0:
            raise BadInputError("beta and power must be > 0 and threshold, smooth >= 0, got "
                             f"beta={self.beta}, power={self.power}, threshold={self.threshold}, "
                             f"smooth={self.smooth}")
        if self.pretrain_row_law not in ROW_LAWS:
            raise BadInputError(f"pretrain_row_law must be one of {ROW_LAWS}, got "
                                f"{self.pretrain_row_law!r}")
        if self.pretrain_row_sigma < 0:
            raise BadInputError(f"pretrain_row_sigma must be >= 0, got {self.pretrain_row_sigma}")
        for name in ("pretrain_mix", "pretrain_rows", "pretrain_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BadInputError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def inverse_temperature(self) -> float:
        """beta, or the kind's default when beta is None."""
        return BETA_DEFAULT[self.kind] if self.beta is None else float(self.beta)


def make_embeddings(kb: KnowledgeBase, cfg: MemoryConfig, dtype=torch.float32) -> torch.Tensor:
    """W_E (d_vocab, d): rows N(0, I/d) (seeded) or the identity for one-hot."""
    V = kb.cfg.d_vocab
    if cfg.embedding == "onehot":
        return torch.eye(V, dtype=dtype)
    g = torch.Generator().manual_seed(cfg.seed + 7919)
    return (torch.randn(V, cfg.d_model, generator=g, dtype=torch.float64)
            / cfg.d_model**0.5).to(dtype)


def vote(x: torch.Tensor, y: torch.Tensor, kind: str, threshold: float = 0.0,
         power: float = 1.0, smooth: float = 0.0, eps: float = 1e-4) -> torch.Tensor:
    """The AND unit of one stored triple from the two read-outs x = <e_s, h>, y = <e_a or e_r, h>.
    minpow: relu(min(x, y) - threshold)^power; andprod: relu(x y - threshold)^power;
    smooth > 0 replaces relu(z) by smooth * softplus(z / smooth)."""
    if kind == "product":
        return x * y
    z = torch.minimum(x, y) - threshold if kind == "minpow" else x * y - threshold
    m = smooth * F.softplus(z / smooth) if smooth > 0 else F.relu(z)
    if power == 1.0:
        return m
    return (m + eps) ** power - eps**power


class ConstructedMemory(torch.nn.Module):
    """Frozen associative memory with one relation unit and one answer unit per triple."""

    def __init__(self, kb: KnowledgeBase, cfg: MemoryConfig, dtype=torch.float32,
                 chunk_elems: int = 2**24, gram_elems: int = 2**26):
        super().__init__()
        self.kb, self.cfg, self.chunk_elems = kb, cfg, chunk_elems
        W_E = make_embeddings(kb, cfg, dtype)
        self.register_buffer("W_E", W_E)
        V = W_E.shape[0]
        gram = W_E @ W_E.T if V * V <= gram_elems else None
        self.register_buffer("G", gram, persistent=False)

    def _reads(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """p[b, t] = <e_t, h> with h = sum_j w_j e_{x_j}, for every token t: (B, d_vocab).
        From the Gram matrix G = E E^T when it fits (cost B L V per call, independent of d),
        else as h E^T."""
        w = weights.expand(tokens.shape).to(self.W_E.dtype)
        if self.G is not None:
            return torch.einsum("bl,blv->bv", w, self.G[tokens])
        h = torch.einsum("bl,bld->bd", w, self.W_E[tokens])
        return h @ self.W_E.T

    def _chunks(self, B: int) -> list[slice]:
        step = max(1, self.chunk_elems // self.kb.cfg.n_triples)
        return [slice(i, i + step) for i in range(0, B, step)]

    def _vote(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return vote(x, y, c.vote, c.threshold, c.power, c.smooth)

    def relation_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(B, R): beta * sum_s vote(<e_s,h>, <e_f(s,r),h>)."""
        S = self.kb.cfg.n_subjects
        outs = []
        for sl in self._chunks(tokens.shape[0]):
            p = self._reads(tokens[sl], weights if weights.dim() == 1 else weights[sl])
            x = p[:, :S].unsqueeze(-1)
            y = p[:, S + self.kb.f]  # (b, S, R)
            outs.append(self._vote(x, y).sum(1))
        return self.cfg.inverse_temperature * torch.cat(outs)

    def answer_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(B, N_A): beta * sum over triples (s, r, a) of vote(<e_s,h>, <e_r,h>) into a."""
        tc = self.kb.cfg
        S, NA, R = tc.n_subjects, tc.n_answers, tc.n_relations
        idx = self.kb.f.reshape(1, -1)
        outs = []
        for sl in self._chunks(tokens.shape[0]):
            p = self._reads(tokens[sl], weights if weights.dim() == 1 else weights[sl])
            x = p[:, :S].unsqueeze(-1)
            y = p[:, S + NA:S + NA + R].unsqueeze(1)
            v = self._vote(x, y).reshape(p.shape[0], -1)
            out = torch.zeros(p.shape[0], NA, dtype=v.dtype)
            outs.append(out.scatter_add(1, idx.expand(p.shape[0], -1), v))
        return self.cfg.inverse_temperature * torch.cat(outs)
