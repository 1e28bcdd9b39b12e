"""IC-recall task generator: Assumption 1, shared answers, confusing fraction, token layout."""

import pytest
import torch

from pythia_probe.toy.icrecall.task import (
    TaskConfig,
    consistent,
    expected_confusing_fraction,
    make_kb,
    sample_prompts,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _count_consistent(kb, s: int, a: int) -> int:
    return sum(int(kb.f[s, r]) == a for r in range(kb.cfg.n_relations))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_assumption1_and_answers_on_every_prompt(k):
    # many answer collisions (N_A = 4, rho = 0.5) so that rejection is exercised
    kb = make_kb(TaskConfig(n_subjects=30, n_relations=6, n_answers=4, rho=0.5, k_pairs=k))
    p = sample_prompts(kb, 3000, seed=1)
    assert len(p) == 3000
    assert torch.equal(p.answers, kb.f[p.subjects, p.relation[:, None]])
    cons = consistent(kb, p.subjects[:, :k], p.answers[:, :k]).all(1)
    assert torch.equal(cons.sum(-1), torch.ones(3000, dtype=torch.long))
    assert torch.equal(cons.float().argmax(-1), p.relation)
    srt = p.subjects.sort(1).values
    assert not (srt[:, 1:] == srt[:, :-1]).any(), "subjects of a prompt must be distinct"


def test_rejection_actually_rejects():
    kb = make_kb(TaskConfig(n_subjects=30, n_relations=6, n_answers=4, rho=0.5))
    g = torch.Generator().manual_seed(0)
    subj = torch.randint(30, (2000, 2), generator=g)
    rel = torch.randint(6, (2000,), generator=g)
    cons = consistent(kb, subj, kb.f[subj, rel[:, None]]).all(1)
    assert (cons.sum(-1) > 1).float().mean() > 0.05  # violations are common before rejection


def test_ambiguous_flags_match_brute_force():
    kb = make_kb(TaskConfig(n_subjects=40, n_relations=8, n_answers=6, rho=0.4))
    p = sample_prompts(kb, 300, seed=2)
    for b in range(300):
        for i in range(2):
            want = _count_consistent(kb, int(p.subjects[b, i]), int(p.answers[b, i])) > 1
            assert bool(p.ambiguous[b, i]) == want
    assert torch.equal(p.confusing, p.ambiguous.any(1))


def test_answers_shared_across_relations():
    cfg = TaskConfig(n_subjects=200, n_relations=10, n_answers=50, rho=0.0)
    kb = make_kb(cfg)
    sets = [set(kb.f[:, r].tolist()) for r in range(cfg.n_relations)]
    shared = set.intersection(*sets)
    assert len(shared) > 10  # the same answers serve every relation
    assert int(kb.f.max()) < cfg.n_answers and int(kb.f.min()) >= 0


def test_partner_copy_rate():
    cfg = TaskConfig(n_subjects=4000, n_relations=4, n_answers=1000, rho=0.3)
    kb = make_kb(cfg)
    same = (kb.f[:, 0::2] == kb.f[:, 1::2]).double().mean()
    q = cfg.rho + (1 - cfg.rho) / cfg.n_answers
    assert abs(float(same) - q) < 0.015


@pytest.mark.parametrize("cfg", [
    TaskConfig(n_subjects=3000, n_relations=10, n_answers=20, rho=0.3),
    TaskConfig(n_subjects=3000, n_relations=20, n_answers=1000, rho=0.2),
    TaskConfig(n_subjects=3000, n_relations=6, n_answers=8, rho=0.1, k_pairs=3),
])
def test_confusing_fraction_matches_construction(cfg):
    kb = make_kb(cfg)
    p = sample_prompts(kb, 20000, seed=3)
    emp = float(p.confusing.double().mean())
    want = expected_confusing_fraction(cfg)
    # 20000 prompts: sd ~0.0035; a fixed knowledge base adds a similar amount
    assert abs(emp - want) < 0.02, (emp, want)


def test_expected_fraction_reference_values():
    # rho = 0 and huge N_A: nothing is ambiguous
    assert expected_confusing_fraction(TaskConfig(n_answers=10**9, rho=0.0)) < 1e-6
    # R = 2, N_A huge: a pair is ambiguous iff the partner copy happened (prob rho)
    cfg = TaskConfig(n_relations=2, n_answers=10**9, rho=0.3, k_pairs=2)
    want = 1 - (1 - 0.3) ** 2 / (1 - 0.3**2)
    assert abs(expected_confusing_fraction(cfg) - want) < 1e-6


def test_token_layout():
    cfg = TaskConfig(n_subjects=20, n_relations=4, n_answers=10, k_pairs=2)
    kb = make_kb(cfg)
    p = sample_prompts(kb, 5, seed=0)
    t = p.tokens(kb)
    assert t.shape == (5, 7)
    assert torch.equal(t[:, 0], p.subjects[:, 0]) and torch.equal(t[:, 4], p.subjects[:, 2])
    assert torch.equal(t[:, 1], p.answers[:, 0] + 20) and torch.equal(t[:, 3], p.answers[:, 1] + 20)
    assert (t[:, 5] == cfg.d_vocab - 1).all()
    assert torch.equal(t[:, 6], p.relation + 30)


def test_sampling_is_seeded():
    kb = make_kb(TaskConfig())
    a, b, c = (sample_prompts(kb, 50, seed=s) for s in (7, 7, 8))
    assert torch.equal(a.subjects, b.subjects) and not torch.equal(a.subjects, c.subjects)


@pytest.mark.parametrize("kw, word", [
    ({"n_relations": 3}, "n_relations"), ({"rho": 1.0}, "rho"), ({"n_subjects": 2}, "n_subjects"),
    ({"k_pairs": 0}, "k_pairs"), ({"n_answers": 1}, "n_answers")])
def test_bad_config_names_the_field(kw, word):
    with pytest.raises(ValueError, match=word):
        TaskConfig(**kw)
