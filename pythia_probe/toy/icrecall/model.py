"""One layer, one head, followed by a frozen memory; only the position-position block is trained.

Attention logit from key position j to query position q is x_j^T W^{KQ} x_q with x = [e_token;
e_pos]; with every block but PP zero this is W_PP[j, q], so the attention row at q is
softmax_j(W_PP[j, q]) over j <= q, the same for every prompt. Value = identity on the token block,
so the attention output is sum_j v_j e_{x_j}. Chain of thought: predict r* at "?" (row q_rel), then
the answer at r* (row q_ans, plus the residual e_{r*}).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pythia_probe.toy.icrecall.task import KnowledgeBase, Prompts


class ICRecallModel(torch.nn.Module):
    """W_PP (L, L) trainable; memory frozen (any object with relation_logits/answer_logits)."""

    def __init__(self, kb: KnowledgeBase, memory: torch.nn.Module, k_pairs: int | None = None,
                 residual_relation: bool = False, residual_answer: bool = True,
                 dtype=torch.float32):
        super().__init__()
        self.kb, self.memory = kb, memory
        self.k = kb.cfg.k_pairs if k_pairs is None else k_pairs
        self.L = 2 * self.k + 3
        self.residual_relation, self.residual_answer = residual_relation, residual_answer
        self.W_PP = torch.nn.Parameter(torch.zeros(self.L, self.L, dtype=dtype))
        for p in memory.parameters():
            p.requires_grad_(False)

    @property
    def q_rel(self) -> int:
        return self.L - 2

    @property
    def q_ans(self) -> int:
        return self.L - 1

    def attention_row(self, q: int, W_PP: torch.Tensor | None = None) -> torch.Tensor:
        """softmax over key positions 0..q of W_PP[:, q]."""
        W = self.W_PP if W_PP is None else W_PP
        return torch.softmax(W[: q + 1, q], dim=0)

    def _weights(self, q: int, residual: bool, W_PP: torch.Tensor | None = None) -> torch.Tensor:
        w = self.attention_row(q, W_PP)
        if residual:
            w = w + F.one_hot(torch.tensor(q), q + 1).to(w.dtype)
        return w

    def relation_logits(self, tokens: torch.Tensor,
                        W_PP: torch.Tensor | None = None) -> torch.Tensor:
        """Memory logits over relations at "?" (W_PP: use this matrix instead of the parameter)."""
        q = self.q_rel
        return self.memory.relation_logits(tokens[:, : q + 1],
                                           self._weights(q, self.residual_relation, W_PP))

    def answer_logits(self, tokens: torch.Tensor, W_PP: torch.Tensor | None = None) -> torch.Tensor:
        """Memory logits over answers at the r* position (W_PP as in :meth:`relation_logits`)."""
        q = self.q_ans
        return self.memory.answer_logits(tokens[:, : q + 1],
                                         self._weights(q, self.residual_answer, W_PP))

    def loss(self, prompts: Prompts, answer_weight: float = 1.0,
             W_PP: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Chain-of-thought cross-entropy: relation at "?" plus answer at the teacher-forced r*.
        The two terms depend on disjoint columns of W_PP (q_rel and q_ans); answer_weight = 0
        skips the answer memory entirely (its loss is reported as NaN)."""
        tokens = prompts.tokens(self.kb)
        rel = F.cross_entropy(self.relation_logits(tokens, W_PP), prompts.relation)
        if answer_weight == 0:
            return {"loss": rel, "loss_relation": rel,
                    "loss_answer": torch.full_like(rel.detach(), float("nan"))}
        ans = F.cross_entropy(self.answer_logits(tokens, W_PP), prompts.answers[:, -1])
        return {"loss": rel + answer_weight * ans, "loss_relation": rel, "loss_answer": ans}

    @torch.no_grad()
    def decode(self, prompts: Prompts, temperature: float = 0.0,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Two-step decoding: r_hat from the "?" row, then the answer given the model's own r_hat.
        temperature 0 = argmax; > 0 samples from softmax(logits / temperature)."""
        g = torch.Generator().manual_seed(seed)
        tokens = prompts.tokens(self.kb)
        r_hat = _pick(self.relation_logits(tokens), temperature, g)
        tokens[:, -1] = self.kb.relation_token(r_hat)
        a_hat = _pick(self.answer_logits(tokens), temperature, g)
        return r_hat, a_hat


def _pick(logits: torch.Tensor, temperature: float, g: torch.Generator) -> torch.Tensor:
    if temperature == 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, -1)
    return torch.multinomial(probs, 1, generator=g).squeeze(-1)
