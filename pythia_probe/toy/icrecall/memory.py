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

import torch
import torch.nn.functional as F

from pythia_probe.toy.icrecall.config import (  # noqa: F401 - the memory's names
    BETA_DEFAULT,
    EMBEDDINGS,
    ROW_LAWS,
    VOTES,
    MemoryConfig,
)
from pythia_probe.toy.icrecall.task import KnowledgeBase


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
