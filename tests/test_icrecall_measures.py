"""The discriminating measures and what feeds them: intervals, sampled accuracy at the memory's
temperature, reference rows, relation-only training, both read-out paths of the memory, the
pre-trained memory's fresh examples and its kind-dependent temperature."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from pythia_probe.cli import parse_configs
from pythia_probe.errors import BadInputError
from pythia_probe.toy.icrecall.__main__ import CONFIGS
from pythia_probe.toy.icrecall.evaluate import evaluate
from pythia_probe.toy.icrecall.experiment import (
    CONTROL_ROWS,
    EvalConfig,
    evaluate_controls,
    run_experiment,
    set_rows,
)
from pythia_probe.toy.icrecall.intervals import bootstrap, bootstrap_slope, wilson
from pythia_probe.toy.icrecall.memory import BETA_DEFAULT, ConstructedMemory, MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.pretrained import (
    PretrainedMemory,
    answer_examples,
    relation_examples,
)
from pythia_probe.toy.icrecall.task import TaskConfig, consistent, make_kb, sample_prompts
from pythia_probe.toy.icrecall.train import TrainConfig

TASK = TaskConfig(n_subjects=30, n_relations=6, n_answers=100, rho=0.3)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_wilson_known_values_and_edges():
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.23659, abs=1e-5) and hi == pytest.approx(0.76341, abs=1e-5)
    assert wilson(0, 10)[0] == 0.0 and wilson(0, 10)[1] == pytest.approx(0.27753, abs=1e-5)
    assert wilson(10, 10)[1] == 1.0 and all(math.isnan(x) for x in wilson(0, 0))


def test_bootstrap_width_and_degenerate_inputs():
    x = np.random.default_rng(0).normal(size=2000)
    lo, hi = bootstrap(x)
    assert lo < x.mean() < hi and abs((hi - lo) - 2 * 1.96 / math.sqrt(2000)) < 0.02
    assert bootstrap([3.0, 3.0, 3.0]) == (3.0, 3.0) and bootstrap([2.0]) == (2.0, 2.0)
    assert all(math.isnan(v) for v in bootstrap([]))


def test_bootstrap_slope_recovers_and_brackets():
    rng = np.random.default_rng(1)
    groups = {x: list(0.5 * x + rng.normal(0, 0.1, 8)) for x in (0.0, 1.0, 2.0, 3.0)}
    f = bootstrap_slope(groups)
    assert f["slope_lo"] < 0.5 < f["slope_hi"] and f["slope_hi"] - f["slope_lo"] < 0.3
    with pytest.raises(ValueError):
        bootstrap_slope({1.0: [1.0, 2.0]})


def _model(cfg: MemoryConfig | None = None):
    kb = make_kb(TASK)
    return kb, ICRecallModel(kb, ConstructedMemory(kb, cfg or MemoryConfig(d_model=128)))


def test_sampled_accuracy_agrees_with_the_probability_of_the_truth():
    kb, model = _model()
    set_rows(model, CONTROL_ROWS["stuck"])
    m = evaluate(model, sample_prompts(kb, 3000, seed=5), seed=1)
    lo, hi = wilson(m["relation_sampled"] * m["n_all"], m["n_all"])
    assert lo - 0.01 <= m["relation_prob"] <= hi + 0.01
    assert m["relation_prob_confusing_lo"] <= m["relation_prob_confusing"] \
        <= m["relation_prob_confusing_hi"]
    assert m["relation_sampled_confusing"] < m["relation_acc_confusing"]  # argmax hides ties
    no_ans = evaluate(model, sample_prompts(kb, 50, seed=5), answers=False)
    assert math.isnan(no_ans["answer_sampled"]) and math.isnan(no_ans["answer_prob"])
    assert no_ans["relation_prob"] == pytest.approx(
        evaluate(model, sample_prompts(kb, 50, seed=5))["relation_prob"])


def test_control_rows_are_set_exactly_and_W_is_restored():
    kb, model = _model()
    set_rows(model, CONTROL_ROWS["ideal"])
    row = model.attention_row(model.q_rel).detach()
    torch.testing.assert_close(row, torch.tensor([0.25] * 4 + [0.0, 0.0]), atol=1e-8, rtol=0)
    assert float(model.attention_row(model.q_ans).detach()[4]) > 1 - 1e-7
    with pytest.raises(BadInputError):
        set_rows(model, (0.5, 0.5))
    W = model.W_PP.detach().clone()
    out = evaluate_controls(model, sample_prompts(kb, 300, seed=2))
    assert list(out) == list(CONTROL_ROWS) and torch.equal(model.W_PP.detach(), W)
    assert out["uniform"]["attn_s1"] == pytest.approx(1 / 6)
    assert out["ideal"]["relation_prob_confusing"] > out["one_pair"]["relation_prob_confusing"]


def test_relation_row_trajectory_does_not_depend_on_the_answer_loss():
    kb, model = _model()
    tr = TrainConfig(n_train=8, steps=30, seed=2, log_every=10)
    ev = EvalConfig(n_test=50, n_monitor=0)
    a = run_experiment(TASK, MemoryConfig(d_model=128), tr, ev, memory=model.memory)
    b = run_experiment(TASK, MemoryConfig(d_model=128), dataclasses.replace(tr, answer_weight=0),
                       ev, memory=model.memory)
    torch.testing.assert_close(a.model.W_PP[:, 5], b.model.W_PP[:, 5], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(a.model.W_PP[:, 6], b.model.W_PP[:, 6])
    assert "answer_acc" in a.metrics and math.isnan(b.metrics["answer_acc"])


def test_gram_and_direct_read_outs_agree():
    kb = make_kb(TASK)
    cfg = MemoryConfig(d_model=64)
    gram = ConstructedMemory(kb, cfg, dtype=torch.float64)
    direct = ConstructedMemory(kb, cfg, dtype=torch.float64, gram_elems=0)
    assert gram.G is not None and direct.G is None
    tokens = sample_prompts(kb, 7, seed=0).tokens(kb)
    w = torch.rand(7, tokens.shape[1], dtype=torch.float64)
    torch.testing.assert_close(gram.relation_logits(tokens, w), direct.relation_logits(tokens, w))
    torch.testing.assert_close(gram.answer_logits(tokens, w), direct.answer_logits(tokens, w))


def test_pretraining_examples_are_fresh_and_shaped_like_attention():
    kb = make_kb(TASK)
    tok, w, y = relation_examples(kb, 400, 0.75, seed=1)
    tok2, _, _ = relation_examples(kb, 400, 0.75, seed=2)
    assert not torch.equal(tok, tok2)
    single, two = w[:, 2] == 0, w[:, 2] > 0
    assert int(two.sum()) == 300 and torch.allclose(w.sum(1), torch.ones(400, dtype=w.dtype))
    assert (w[:, 4:] == 0).all()  # rows = 0: no mass on s3 or '?'
    s, a = tok[two][:, 0:4:2], tok[two][:, 1:4:2] - kb.cfg.n_subjects
    cons = consistent(kb, s, a)
    assert bool((cons.all(1).sum(-1) == 1).all())  # Assumption 1
    # the label of a two-pair example is that one relation; of a single pair, uniform over the
    # relations consistent with it
    torch.testing.assert_close(y[two], cons.all(1).float())
    one = consistent(kb, tok[single][:, :1], tok[single][:, 1:2] - kb.cfg.n_subjects)[:, 0]
    torch.testing.assert_close(y[single], one.float() / one.sum(1, keepdim=True))
    at, aw, ay = answer_examples(kb, 50, seed=3)
    assert bool((kb.f[at[:, 4], at[:, 6] - kb.cfg.n_subjects - kb.cfg.n_answers] == ay).all())
    assert (aw[:, 4] == 1).all() and (aw[:, 6] == 1).all() and aw.sum() == 100  # s3 + r*


def test_beta_defaults_by_kind_and_scales_the_pretrained_logits():
    c = MemoryConfig()
    assert c.beta is None and c.inverse_temperature == BETA_DEFAULT["constructed"]
    p = dataclasses.replace(c, kind="pretrained")
    assert p.inverse_temperature == BETA_DEFAULT["pretrained"]
    assert dataclasses.replace(p, beta=7.0).inverse_temperature == 7.0
    with pytest.raises(BadInputError):
        MemoryConfig(beta=0.0)
    kb = make_kb(TASK)
    mem = PretrainedMemory(kb, MemoryConfig(kind="pretrained", d_model=16, d_hidden=8, beta=3.0))
    tokens, w = sample_prompts(kb, 4, seed=0).tokens(kb)[:, :4], torch.full((4,), 0.25)
    torch.testing.assert_close(mem.relation_logits(tokens, w),
                               3.0 * mem.raw_relation_logits(tokens, w))


def _configs(argv):
    values = parse_configs(CONFIGS, argv, "icrecall")
    return [cls(**v) for cls, v in zip(CONFIGS, values, strict=True)]


def test_cli_flags_for_the_pretrained_memory_parse():
    task, mem, train, *_ = _configs(["--kind", "pretrained", "--beta", "3", "--n-train", "32",
                                     "--kb-seed", "4", "--memory-seed", "5", "--seed", "6"])
    assert mem.kind == "pretrained" and mem.inverse_temperature == 3.0 and train.n_train == 32
    assert (task.seed, mem.seed, train.seed) == (4, 5, 6)  # three seeds, three flags
    default = _configs(["--kind", "pretrained"])[1]
    assert default.beta is None and default.inverse_temperature == BETA_DEFAULT["pretrained"]
