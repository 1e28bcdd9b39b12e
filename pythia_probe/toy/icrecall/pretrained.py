"""A knowledge memory pre-trained by gradient descent on the triples instead of constructed.

MLP d -> d_hidden -> d_vocab with ReLU and biases, over fixed random embeddings, reading the
attention output h = sum_j w_j e_{x_j} (plus the residual where the model adds one). Trained by
Adam (cosine-decayed learning rate) with cross-entropy, each softmax restricted to its token type,
on examples drawn afresh every epoch (a memory that sees the same few mixtures every epoch learns
them, not the rule):
- relation, single pair: h = (e_s + e_a) / 2 -> r for a uniform stored triple (s, r, a); an
  ambiguous pair's label is whichever consistent relation was drawn, so the memory learns to
  split its vote;
- relation, two pairs (a fraction ``pretrain_mix``): h = (e_s1 + e_a1 + e_s2 + e_a2) / 4 from a
  fresh prompt drawn like the fine-tuning prompts (Assumption 1, confusing prompts at their
  natural rate) -> r;
- answer: h = e_s + e_r -> a for a uniform stored triple (the answer step's input: attention on
  the query subject plus the residual relation token).
The weights are those of the attention pattern the memory will be read with (1/2 per token of a
single pair, 1/4 for two pairs), so the biases see the scale they meet in fine-tuning.
Frozen afterwards; fine-tuning uses the trained logits times ``inverse_temperature`` (1 by
default: the memory's own temperature).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pythia_probe.toy.icrecall.memory import MemoryConfig, make_embeddings
from pythia_probe.toy.icrecall.task import KnowledgeBase, sample_prompts


class PretrainedMemory(torch.nn.Module):
    """W_E fixed; W_in (d, d_hidden), b_in, W_out (d_hidden, d_vocab), b_out trained by
    :func:`pretrain`."""

    def __init__(self, kb: KnowledgeBase, cfg: MemoryConfig, dtype=torch.float32):
        super().__init__()
        self.kb, self.cfg = kb, cfg
        self.register_buffer("W_E", make_embeddings(kb, cfg, dtype))
        g = torch.Generator().manual_seed(cfg.seed + 31)
        d, m, V = cfg.d_model, cfg.d_hidden, kb.cfg.d_vocab
        self.W_in = torch.nn.Parameter(torch.randn(d, m, generator=g, dtype=dtype) / d**0.5)
        self.b_in = torch.nn.Parameter(torch.zeros(m, dtype=dtype))
        self.W_out = torch.nn.Parameter(torch.randn(m, V, generator=g, dtype=dtype) / m**0.5)
        self.b_out = torch.nn.Parameter(torch.zeros(V, dtype=dtype))

    def _slices(self) -> tuple[slice, slice]:
        c = self.kb.cfg
        S, NA = c.n_subjects, c.n_answers
        return slice(S + NA, S + NA + c.n_relations), slice(S, S + NA)

    def _mlp(self, h: torch.Tensor, out: slice) -> torch.Tensor:
        return F.relu(h @ self.W_in + self.b_in) @ self.W_out[:, out] + self.b_out[out]

    def _h(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w = weights.expand(tokens.shape).to(self.W_E.dtype)
        return torch.einsum("bl,bld->bd", w, self.W_E[tokens])

    def raw_relation_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(B, R) logits as trained (no inverse temperature)."""
        return self._mlp(self._h(tokens, weights), self._slices()[0])

    def raw_answer_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(B, N_A) logits as trained (no inverse temperature)."""
        return self._mlp(self._h(tokens, weights), self._slices()[1])

    def relation_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.cfg.inverse_temperature * self.raw_relation_logits(tokens, weights)

    def answer_logits(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.cfg.inverse_temperature * self.raw_answer_logits(tokens, weights)


def relation_examples(kb: KnowledgeBase, n: int, mix: float, seed: int):
    """Fresh relation examples: tokens (n, 4), weights (n, 4), targets (n,) (module doc)."""
    g = torch.Generator().manual_seed(seed)
    n_mix = int(round(mix * n))
    n_one = n - n_mix
    c = kb.cfg
    s = torch.randint(c.n_subjects, (n_one,), generator=g)
    r = torch.randint(c.n_relations, (n_one,), generator=g)
    a = kb.answer_token(kb.f[s, r])
    tok = [torch.stack([s, a, s, a], 1)]
    w = [torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(n_one, 4)]
    target = [r]
    if n_mix:
        p = sample_prompts(kb, n_mix, seed=seed + 1, k=2)
        tok.append(p.tokens(kb)[:, :4])
        w.append(torch.full((n_mix, 4), 0.25))
        target.append(p.relation)
    return torch.cat(tok), torch.cat(w), torch.cat(target)


def answer_examples(kb: KnowledgeBase, n: int, seed: int):
    """Fresh answer examples: tokens (n, 2) = (s, r), targets (n,) = f(s, r)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(kb.cfg.n_subjects, (n,), generator=g)
    r = torch.randint(kb.cfg.n_relations, (n,), generator=g)
    return torch.stack([s, kb.relation_token(r)], 1), kb.f[s, r]


def pretrain(mem: PretrainedMemory, batch: int = 128, progress: bool = False) -> list[float]:
    """Adam with a cosine-decayed learning rate on fresh examples each epoch (n_triples relation
    and n_triples answer examples per epoch); returns the mean loss per epoch and freezes the
    memory."""
    cfg, kb = mem.cfg, mem.kb
    n = kb.cfg.n_triples
    nb = max(1, math.ceil(n / batch))
    opt = torch.optim.Adam(mem.parameters(), lr=cfg.pretrain_lr)
    total = cfg.pretrain_epochs * nb
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, total) / total)))
    ones = torch.ones(2)
    losses = []
    for epoch in tqdm(range(cfg.pretrain_epochs), disable=not progress, desc="pretrain memory"):
        seed = (cfg.seed + 1) * 1_000_003 + epoch * 2
        rel_tok, rel_w, rel_y = relation_examples(kb, n, cfg.pretrain_mix, seed)
        ans_tok, ans_y = answer_examples(kb, n, seed + 1)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        running = 0.0
        for b in range(nb):
            i = perm[b * batch:(b + 1) * batch]
            loss = (F.cross_entropy(mem.raw_relation_logits(rel_tok[i], rel_w[i]), rel_y[i])
                    + F.cross_entropy(mem.raw_answer_logits(ans_tok[i], ones), ans_y[i]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            running += float(loss.detach())
        losses.append(running / nb)
    for p in mem.parameters():
        p.requires_grad_(False)
    return losses
