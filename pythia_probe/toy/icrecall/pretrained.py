"""A knowledge memory pre-trained by gradient descent on the triples instead of constructed.

MLP d -> d_hidden -> d_vocab with ReLU and biases, over fixed random embeddings, reading the
attention output h = sum_j w_j e_{x_j} (plus the residual where the model adds one). Trained by
Adam (cosine-decayed learning rate) with cross-entropy, each softmax restricted to its token type,
on examples drawn afresh every epoch (a memory that sees the same few mixtures every epoch learns
them, not the rule). Every example is a whole prompt s1 a1 s2 a2 s3 ? r* read through a weight
row, as the fine-tuned model reads it:
- relation, single pair: weights 1/2 on s1 and a1;
- relation, two pairs (a fraction ``pretrain_mix`` of the pair examples): 1/4 on each of s1, a1,
  s2, a2;
- relation, attention-like rows (a fraction ``pretrain_rows`` of the relation examples): a random
  row over s1 a1 s2 a2 s3 ?: the inputs the memory meets while the attention moves, s3 and '?'
  included. ``pretrain_row_law`` 'softmax': w = softmax(sigma z), z ~ N(0, I), sigma ~
  U(0, ``pretrain_row_sigma``), the rows a query-key block of random size produces, uniform
  attention (sigma -> 0) included; 'dirichlet': w ~ Dirichlet(1, ..., 1);
- answer: 1 on s3 plus the residual r* -> f(s3, r) (the answer step's ideal input), and for a
  fraction ``pretrain_rows`` a random row of the same law over the seven positions plus the
  residual r*.
Every relation example's label is the soft target of one rule, the AND of the constructed memory
(:func:`relation_targets`): pair i counts when the product of its two weights w_si w_ai exceeds
``pretrain_threshold``; the target is uniform over the relations consistent with every pair that
counts, and uniform over all relations (blank: "cannot tell") when none counts. A single pair
thus splits its vote over the relations it is consistent with, two counted pairs name r
(Assumption 1), and attention spread thin (the uniform row: w_s w_a = 1/36 < 0.035 < 1/16, the
pairwise pattern's product) reads blank. The memory must then be read through both tokens of a
pair, as the paper's is: uniform attention cannot do the task with it (with threshold 0 every
attended pair counts and Dirichlet rows are labelled with the prompt's relation, the earlier
design under which uniform attention already gets P(correct | confusing) ~0.98).
Prompts are drawn like the fine-tuning prompts (Assumption 1, confusing prompts at their natural
rate). Frozen afterwards; fine-tuning uses the trained logits times ``inverse_temperature``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pythia_probe.toy.icrecall.memory import MemoryConfig, make_embeddings
from pythia_probe.toy.icrecall.task import KnowledgeBase, Prompts, consistent, sample_prompts


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


def dirichlet_rows(n: int, m: int, g: torch.Generator) -> torch.Tensor:
    """(n, m) rows uniform on the simplex (Dirichlet(1, ..., 1): normalised exponentials)."""
    e = -torch.log(torch.rand(n, m, generator=g, dtype=torch.float64).clamp_min(1e-300))
    return (e / e.sum(1, keepdim=True)).float()


def softmax_rows(n: int, m: int, g: torch.Generator, sigma: float) -> torch.Tensor:
    """(n, m) rows softmax(s z), z ~ N(0, I), s ~ U(0, sigma) per row: attention rows of a
    random query-key block of random size (s near 0: near uniform)."""
    s = torch.rand(n, 1, generator=g, dtype=torch.float64) * sigma
    z = torch.randn(n, m, generator=g, dtype=torch.float64)
    return torch.softmax(s * z, 1).float()


def random_rows(n: int, m: int, g: torch.Generator, law: str = "softmax",
                sigma: float = 3.0) -> torch.Tensor:
    """(n, m) random attention-like rows of ``law`` (module doc)."""
    return dirichlet_rows(n, m, g) if law == "dirichlet" else softmax_rows(n, m, g, sigma)


def _counts(n: int, rows: float, mix: float) -> tuple[int, int, int]:
    """(single-pair, two-pair, attention-row) example counts out of n."""
    n_rows = int(round(rows * n))
    n_mix = int(round(mix * (n - n_rows)))
    return n - n_rows - n_mix, n_mix, n_rows


def relation_targets(kb: KnowledgeBase, p: Prompts, w: torch.Tensor,
                     threshold: float) -> torch.Tensor:
    """(n, R) soft relation targets of the AND rule (module doc): pair i of prompt b counts when
    w[b, 2i] * w[b, 2i+1] > threshold; uniform over the relations consistent with every counted
    pair, uniform over all relations when none counts."""
    k = p.subjects.shape[1] - 1
    cons = consistent(kb, p.subjects[:, :k], p.answers[:, :k])  # (n, k, R)
    counts = (w[:, 0:2 * k:2] * w[:, 1:2 * k:2]).double() > threshold  # (n, k)
    allowed = (cons | ~counts.unsqueeze(-1)).all(1).double()
    return (allowed / allowed.sum(1, keepdim=True)).float()


def relation_examples(kb: KnowledgeBase, n: int, mix: float, seed: int, rows: float = 0.0,
                      threshold: float = 0.0, row_law: tuple[str, float] = ("softmax", 3.0)):
    """Fresh relation examples: tokens (n, 6) = s1 a1 s2 a2 s3 ?, weights (n, 6), soft targets
    (n, R) from :func:`relation_targets` (module doc); ``row_law`` (law, sigma) of the random
    rows (:func:`random_rows`)."""
    n_one, n_mix, n_rows = _counts(n, rows, mix)
    p = sample_prompts(kb, n, seed=seed + 1, k=2)
    tok = p.tokens(kb)[:, :6]
    w = torch.zeros(n, 6)
    w[:n_one, :2] = 0.5
    w[n_one:n_one + n_mix, :4] = 0.25
    if n_rows:
        w[n - n_rows:] = random_rows(n_rows, 6, torch.Generator().manual_seed(seed), *row_law)
    return tok, w, relation_targets(kb, p, w, threshold)


def answer_examples(kb: KnowledgeBase, n: int, seed: int, rows: float = 0.0,
                    law: str = "softmax", sigma: float = 3.0):
    """Fresh answer examples: tokens (n, 7) = s1 a1 s2 a2 s3 ? r*, weights (n, 7) (attention
    plus the residual on r*), targets (n,) = f(s3, r)."""
    n_rows = int(round(rows * n))
    p = sample_prompts(kb, n, seed=seed + 1, k=2)
    w = torch.zeros(n, 7)
    w[:, 4] = 1.0
    if n_rows:
        w[n - n_rows:] = random_rows(n_rows, 7, torch.Generator().manual_seed(seed), law, sigma)
    w[:, 6] += 1.0
    return p.tokens(kb), w, p.answers[:, -1]


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
    losses = []
    for epoch in tqdm(range(cfg.pretrain_epochs), disable=not progress, desc="pretrain memory"):
        seed = (cfg.seed + 1) * 1_000_003 + epoch * 2
        law, sigma = cfg.pretrain_row_law, cfg.pretrain_row_sigma
        rel_tok, rel_w, rel_y = relation_examples(kb, n, cfg.pretrain_mix, seed,
                                                  cfg.pretrain_rows, cfg.pretrain_threshold,
                                                  (law, sigma))
        ans_tok, ans_w, ans_y = answer_examples(kb, n, seed + 1, cfg.pretrain_rows, law, sigma)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        running = 0.0
        for b in range(nb):
            i = perm[b * batch:(b + 1) * batch]
            loss = (F.cross_entropy(mem.raw_relation_logits(rel_tok[i], rel_w[i]), rel_y[i])
                    + F.cross_entropy(mem.raw_answer_logits(ans_tok[i], ans_w[i]), ans_y[i]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            running += float(loss.detach())
        losses.append(running / nb)
    for p in mem.parameters():
        p.requires_grad_(False)
    return losses
