"""A knowledge memory pre-trained by gradient descent on the triples instead of constructed.

MLP d -> d_hidden -> d_vocab without biases (ReLU; positively homogeneous, so the scale of the
attention-weighted input does not matter), over fixed random embeddings. Trained by Adam on
{e_s + e_a -> r} and {e_s + e_r -> a} for every stored triple, each softmax restricted to its
token type; a fraction ``pretrain_mix`` of relation examples are two same-relation pairs summed
(attention-like mixtures). Frozen afterwards; logits are multiplied by ``beta``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pythia_probe.toy.icrecall.memory import MemoryConfig, make_embeddings
from pythia_probe.toy.icrecall.task import KnowledgeBase


class PretrainedMemory(torch.nn.Module):
    """W_E fixed; W_in (d, d_hidden) and W_out (d_hidden, d_vocab) trained by :func:`pretrain`."""

    def __init__(self, kb: KnowledgeBase, cfg: MemoryConfig, dtype=torch.float32):
        super().__init__()
        self.kb, self.cfg = kb, cfg
        self.register_buffer("W_E", make_embeddings(kb, cfg, dtype))
        g = torch.Generator().manual_seed(cfg.seed + 31)
        d, m, V = cfg.d_model, cfg.d_hidden, kb.cfg.d_vocab
        self.W_in = torch.nn.Parameter(torch.randn(d, m, generator=g, dtype=dtype) / d**0.5)
        self.W_out = torch.nn.Parameter(torch.randn(m, V, generator=g, dtype=dtype) / m**0.5)

    def _slices(self) -> tuple[slice, slice]:
        c = self.kb.cfg
        S, NA = c.n_subjects, c.n_answers
        return slice(S + NA, S + NA + c.n_relations), slice(S, S + NA)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return F.relu(h @ self.W_in) @ self.W_out

    def _h(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = weights.expand(tokens.shape).to(self.W_E.dtype)
        return torch.einsum("bl,bld->bd", w, self.W_E[tokens])

    def relation_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.cfg.beta * self.mlp(self._h(tokens, weights))[:, self._slices()[0]]

    def answer_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.cfg.beta * self.mlp(self._h(tokens, weights))[:, self._slices()[1]]


def _examples(kb: KnowledgeBase, mix: float, g: torch.Generator):
    """Relation inputs (token pairs or quadruples, padded with weight 0) and answer inputs."""
    c = kb.cfg
    s, r = torch.meshgrid(torch.arange(c.n_subjects), torch.arange(c.n_relations), indexing="ij")
    s, r = s.flatten(), r.flatten()
    a_tok, r_tok = kb.answer_token(kb.f[s, r]), kb.relation_token(r)
    rel_tok = torch.stack([s, a_tok, s, a_tok], 1)
    rel_w = torch.tensor([1.0, 1.0, 0.0, 0.0]).expand(len(s), 4).clone()
    n_mix = int(mix * len(s))
    if n_mix:
        i = torch.randint(len(s), (n_mix,), generator=g)
        s2 = (s[i] + torch.randint(1, c.n_subjects, (n_mix,), generator=g)) % c.n_subjects
        mix_tok = torch.stack([s[i], a_tok[i], s2, kb.answer_token(kb.f[s2, r[i]])], 1)
        rel_tok = torch.cat([rel_tok, mix_tok])
        rel_w = torch.cat([rel_w, torch.ones(n_mix, 4)])
        r_rel = torch.cat([r, r[i]])
    else:
        r_rel = r
    ans_tok = torch.stack([s, r_tok], 1)
    return rel_tok, rel_w, r_rel, ans_tok, kb.f[s, r]


def pretrain(mem: PretrainedMemory, batch: int = 512, progress: bool = False) -> list[float]:
    """Adam (cosine-decayed learning rate) on the triples; returns the mean loss per epoch.
    Freezes the memory at the end."""
    cfg = mem.cfg
    g = torch.Generator().manual_seed(cfg.seed + 17)
    rel_tok, rel_w, r_rel, ans_tok, a_ans = _examples(mem.kb, cfg.pretrain_mix, g)
    opt = torch.optim.Adam([mem.W_in, mem.W_out], lr=cfg.pretrain_lr)
    total_steps = cfg.pretrain_epochs * max(1, len(r_rel) // batch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 * (1 + math.cos(math.pi * t
                                                                                 / total_steps)))
    ones = torch.ones(2)
    losses = []
    for _ in tqdm(range(cfg.pretrain_epochs), disable=not progress, desc="pretrain memory"):
        pr = torch.randperm(len(r_rel), generator=g)
        pa = torch.randint(len(a_ans), (len(pr),), generator=g)
        total, nb = 0.0, max(1, len(pr) // batch)
        for b in range(nb):
            ir, ia = pr[b * batch:(b + 1) * batch], pa[b * batch:(b + 1) * batch]
            loss = (F.cross_entropy(mem.relation_logits(rel_tok[ir], rel_w[ir]) / cfg.beta,
                                    r_rel[ir])
                    + F.cross_entropy(mem.answer_logits(ans_tok[ia], ones) / cfg.beta, a_ans[ia]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach())
        losses.append(total / nb)
    for p in mem.parameters():
        p.requires_grad_(False)
    return losses
