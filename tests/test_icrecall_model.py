"""IC-recall memories and model: float64 loop references, ideal attention, gradients, metrics."""

import math

import pytest
import torch

from pythia_probe.toy.icrecall.evaluate import accuracy_metrics, pattern_metrics
from pythia_probe.toy.icrecall.memory import ConstructedMemory, MemoryConfig, vote
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.pretrained import PretrainedMemory
from pythia_probe.toy.icrecall.task import Prompts, TaskConfig, consistent, make_kb, sample_prompts

SMALL = TaskConfig(n_subjects=12, n_relations=4, n_answers=9, rho=0.3)
VOTE_CFGS = [dict(vote="product"), dict(vote="andprod", threshold=0.03, smooth=0.01),
             dict(vote="minpow", threshold=0.05, power=0.5, smooth=0.01),
             dict(vote="minpow", threshold=0.1)]

pytestmark = pytest.mark.usefixtures("one_thread")


def _loop_reference(kb, mem_cfg, W_E, tokens, weights):
    """Relation and answer logits by explicit loops over prompts and triples (float64)."""
    S, NA, R = kb.cfg.n_subjects, kb.cfg.n_answers, kb.cfg.n_relations
    E = W_E.double()
    rel = torch.zeros(len(tokens), R, dtype=torch.float64)
    ans = torch.zeros(len(tokens), NA, dtype=torch.float64)
    for b in range(len(tokens)):
        h = sum(float(weights[b, j]) * E[int(tokens[b, j])] for j in range(tokens.shape[1]))
        for s in range(S):
            for r in range(R):
                a = int(kb.f[s, r])
                x, y_a, y_r = (E[s] @ h), (E[S + a] @ h), (E[S + NA + r] @ h)
                c = mem_cfg
                rel[b, r] += vote(x, y_a, c.vote, c.threshold, c.power, c.smooth)
                ans[b, a] += vote(x, y_r, c.vote, c.threshold, c.power, c.smooth)
    return mem_cfg.beta * rel, mem_cfg.beta * ans


@pytest.mark.parametrize("vcfg", VOTE_CFGS)
def test_constructed_memory_matches_loop_reference(vcfg):
    kb = make_kb(SMALL)
    cfg = MemoryConfig(d_model=32, beta=3.0, **vcfg)
    mem = ConstructedMemory(kb, cfg, dtype=torch.float64, chunk_elems=100)  # several chunks
    p = sample_prompts(kb, 5, seed=0)
    tokens = p.tokens(kb)
    weights = torch.rand(5, tokens.shape[1], generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)
    ref_rel, ref_ans = _loop_reference(kb, cfg, mem.W_E, tokens, weights)
    tol = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mem.relation_logits(tokens, weights), ref_rel, **tol)
    torch.testing.assert_close(mem.answer_logits(tokens, weights), ref_ans, **tol)


@pytest.mark.parametrize("embedding", ["random", "onehot"])
def test_constructed_memory_answers_every_triple_with_ideal_attention(embedding):
    cfg_t = TaskConfig(n_subjects=60, n_relations=10, n_answers=200, rho=0.2)
    kb = make_kb(cfg_t)
    mem = ConstructedMemory(kb, MemoryConfig(embedding=embedding))
    S, R = cfg_t.n_subjects, cfg_t.n_relations
    s, r = (t.flatten() for t in torch.meshgrid(torch.arange(S), torch.arange(R), indexing="ij"))
    # answer step: all attention on the query subject, plus the residual relation token
    ans = mem.answer_logits(torch.stack([s, kb.relation_token(r)], 1), torch.ones(2))
    assert torch.equal(ans.argmax(-1), kb.f[s, r])
    # relation step: the pairwise pattern (1/4 each) on (s, f(s,r)) and a second stored pair
    s2 = (s + 1 + torch.arange(len(s)) % (S - 1)) % S
    a, a2 = kb.f[s, r], kb.f[s2, r]
    ok = consistent(kb, torch.stack([s, s2], 1), torch.stack([a, a2], 1)).all(1).sum(-1) == 1
    tokens = torch.stack([s, kb.answer_token(a), s2, kb.answer_token(a2)], 1)[ok]
    rel = mem.relation_logits(tokens, torch.full((4,), 0.25))
    assert ok.float().mean() > 0.9
    assert torch.equal(rel.argmax(-1), r[ok])


def _model(vcfg, kind="constructed"):
    kb = make_kb(SMALL)
    cfg = MemoryConfig(kind=kind, d_model=16, d_hidden=8, beta=5.0, **vcfg)
    mem = (ConstructedMemory(kb, cfg, dtype=torch.float64) if kind == "constructed"
           else PretrainedMemory(kb, cfg, dtype=torch.float64))
    return kb, ICRecallModel(kb, mem, dtype=torch.float64)


@pytest.mark.parametrize("vcfg, kind", [(v, "constructed") for v in VOTE_CFGS[:3]]
                         + [({}, "pretrained")])
def test_W_PP_gradient_matches_finite_differences(vcfg, kind):
    kb, model = _model(vcfg, kind)
    p = sample_prompts(kb, 6, seed=1)
    W0 = torch.randn(model.L, model.L, generator=torch.Generator().manual_seed(2),
                     dtype=torch.float64) * 0.5

    def f(W):
        with torch.no_grad():
            model.W_PP.copy_(W)
        return float(model.loss(p)["loss"].detach())

    with torch.no_grad():
        model.W_PP.copy_(W0)
    model.zero_grad()
    model.loss(p)["loss"].backward()
    grad = model.W_PP.grad.clone()
    fd = torch.zeros_like(W0)
    h = 1e-6
    for i in range(model.L):
        for j in range(model.L):
            E = torch.zeros_like(W0)
            E[i, j] = h
            fd[i, j] = (f(W0 + E) - f(W0 - E)) / (2 * h)
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7)
    assert grad[:, model.q_rel].abs().sum() > 0 and grad[:, model.q_ans].abs().sum() > 0
    assert grad[:, : model.q_rel].abs().sum() == 0  # only the two decoding rows are used
    assert torch.all(grad.tril(-1) == 0)  # causal: key j > query q never used


def test_attention_rows_are_causal_softmax():
    kb, model = _model({})
    with torch.no_grad():
        model.W_PP.copy_(torch.arange(49, dtype=torch.float64).reshape(7, 7) / 10)
    row = model.attention_row(model.q_rel)
    assert row.shape == (6,)
    torch.testing.assert_close(row, torch.softmax(model.W_PP[:6, 5], 0))


def test_pattern_metrics_hand_made():
    m = pattern_metrics(torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0, 0.0]))
    assert m["pair_gap_max"] == 0 and m["pattern_dist"] == 0 and m["offpair_mass"] == 0
    assert m["pair_mass_min"] == m["pair_mass_max"] == 0.5
    m = pattern_metrics(torch.tensor([0.3, 0.2, 0.15, 0.15, 0.1, 0.1], dtype=torch.float64))
    assert math.isclose(m["pair_gap_max"], 0.1, abs_tol=1e-12)
    assert math.isclose(m["offpair_mass"], 0.2, abs_tol=1e-12)
    assert math.isclose(m["pattern_dist"], math.sqrt(0.01 / 2 + 0.02), abs_tol=1e-12)
    assert math.isclose(m["attn_s1"], 0.3) and math.isclose(m["attn_a2"], 0.15)
    k3 = [0.1, 0.1, 0.2, 0.2, 0.15, 0.15, 0.05, 0.05]
    m = pattern_metrics(torch.tensor(k3, dtype=torch.float64))
    assert math.isclose(m["pair_mass_min"], 0.2) and math.isclose(m["pair_mass_max"], 0.4)
    assert math.isclose(m["attn_s_query"], 0.05) and "attn_s3" in m
    with pytest.raises(ValueError, match="2k\\+2"):
        pattern_metrics(torch.ones(5) / 5)


def test_accuracy_metrics_hand_made():
    p = Prompts(subjects=torch.zeros(4, 3, dtype=torch.long),
                answers=torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4]]),
                relation=torch.tensor([0, 1, 2, 3]),
                ambiguous=torch.tensor([[True, False], [False, False], [False, True],
                                        [False, False]]))
    m = accuracy_metrics(torch.tensor([0, 1, 0, 0]), torch.tensor([1, 0, 3, 4]), p)
    assert m["relation_acc"] == 0.5 and m["answer_acc"] == 0.75
    assert m["relation_acc_confusing"] == 0.5 and m["answer_acc_confusing"] == 1.0
    assert m["relation_acc_nonconfusing"] == 0.5 and m["answer_acc_nonconfusing"] == 0.5
    assert m["n_confusing"] == 2 and m["n_all"] == 4


@pytest.mark.parametrize("kw, word", [({"vote": "xor"}, "vote"), ({"kind": "lookup"}, "kind"),
                                       ({"embedding": "sparse"}, "embedding"),
                                       ({"beta": 0.0}, "beta"), ({"pretrain_mix": 2.0}, "mix"),
                                       ({"pretrain_threshold": -0.1}, "pretrain_threshold"),
                                       ({"pretrain_row_law": "beta"}, "softmax', 'dirichlet"),
                                       ({"pretrain_row_sigma": -1.0}, "pretrain_row_sigma")])
def test_bad_memory_config_names_the_field(kw, word):
    with pytest.raises(ValueError, match=word):
        MemoryConfig(**kw)
