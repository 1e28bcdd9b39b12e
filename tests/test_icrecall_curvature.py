"""The exact Hessian of the fine-tuning loss in W_PP against finite differences, its exact null
directions, the spectrum's classification rule, and perturbation escapes."""

import pytest
import torch

from pythia_probe.toy.icrecall.curvature import (
    LABELS,
    Curvature,
    Escapes,
    classify_state,
    effective_basis,
    label,
    loss_grad_hessian,
    noise_level,
    null_directions,
    perturb_escapes,
    spectrum,
)
from pythia_probe.toy.icrecall.memory import ConstructedMemory, MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.task import TaskConfig, make_kb, sample_prompts

SMALL = TaskConfig(n_subjects=12, n_relations=4, n_answers=9, rho=0.3)

pytestmark = pytest.mark.usefixtures("one_thread")


def _setup(vote: str = "andprod"):
    kb = make_kb(SMALL)
    cfg = MemoryConfig(d_model=16, beta=5.0, vote=vote, threshold=0.03, smooth=0.01)
    model = ICRecallModel(kb, ConstructedMemory(kb, cfg))  # float32: the Hessian casts to 64
    W = torch.randn(model.L, model.L, generator=torch.Generator().manual_seed(3)) * 0.7
    with torch.no_grad():
        model.W_PP.copy_(W)
    return kb, model, sample_prompts(kb, 6, seed=1)


@pytest.mark.parametrize("vote", ["andprod", "product"])
def test_hessian_matches_central_differences_of_the_gradient(vote):
    kb, model, p = _setup(vote)
    c = loss_grad_hessian(model, p)
    assert c.hessian.dtype == torch.float64 and c.hessian.shape == (49, 49)
    m64 = ICRecallModel(kb, model.memory).double()
    W0 = model.W_PP.detach().double().reshape(-1)

    def grad(w):
        w = w.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(m64.loss(p, W_PP=w.view(7, 7))["loss"], w)
        return g

    torch.testing.assert_close(grad(W0), c.grad, rtol=1e-10, atol=1e-12)
    h = 1e-5
    fd = torch.stack([(grad(W0 + h * e) - grad(W0 - h * e)) / (2 * h)
                      for e in torch.eye(49, dtype=torch.float64)], 1)
    scale = float(c.hessian.abs().max())
    assert scale > 1e-6  # not a trivially flat point
    torch.testing.assert_close(c.hessian, fd, rtol=1e-5, atol=1e-7 * scale)


def test_null_directions_are_exact_and_the_basis_is_orthonormal():
    _, model, p = _setup()
    c = loss_grad_hessian(model, p)
    Q, N = effective_basis(7, c.columns), null_directions(7, c.columns)
    assert Q.shape == (49, 11) and N.shape == (49, 38)  # 6 + 7 used entries, minus 2 shifts
    torch.testing.assert_close(torch.cat([Q, N], 1).T @ torch.cat([Q, N], 1),
                               torch.eye(49, dtype=torch.float64), rtol=0, atol=1e-12)
    assert float((c.grad @ N).abs().max()) < 1e-12  # softmax shift, unused entries
    assert noise_level(c) < 1e-10 * float(c.hessian.abs().max()) + 1e-15
    c0 = loss_grad_hessian(model, p, answer_weight=0.0)
    assert c0.columns == (model.q_rel,)
    assert float(c0.hessian[:, 6::7].abs().max()) == 0.0  # answer column untouched


def _fake(evals, grad_eff, L=7, q=5):
    """A Curvature whose relation-column block has eigenvalues ``evals`` (basis order) and the
    given effective gradient."""
    Q = effective_basis(L, (q,))
    H = Q @ torch.diag(torch.tensor(evals, dtype=torch.float64)) @ Q.T
    return Curvature(0.0, Q @ torch.tensor(grad_eff, dtype=torch.float64), H, L, (q,))


def test_spectrum_of_a_known_block():
    s = spectrum(_fake([-2.0, 1.0, 3.0, 4.0, 5.0], [0.1, 0.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(s["eigenvalues"], torch.tensor([-2.0, 1, 3, 4, 5],
                                                              dtype=torch.float64))
    assert s["escape_radius"] == pytest.approx(0.1) and s["slope_along"] == pytest.approx(0.1)
    assert s["newton_step"] == float("inf") and s["tol"] < 1e-12
    s = spectrum(_fake([2.0, 1.0, 3.0, 4.0, 5.0], [0.0, 0.5, 0.0, 0.0, 0.0]))
    assert s["newton_step"] == pytest.approx(0.5) and s["escape_radius"] == float("inf")


@pytest.mark.parametrize("lam,esc,minus,plus,newton,want", [
    (-1e-3, 0.3, -1e-4, -1e-4, 0.0, "strict saddle"),
    (-1e-3, 0.3, -1e-4, 1e-5, 0.0, "one-sided saddle"),
    (-1e-3, 2.0, -1e-4, -1e-4, 0.0, "degenerate plateau"),  # slope beats the curvature
    (-1e-16, 0.3, -1e-4, -1e-4, 0.0, "degenerate plateau"),  # within noise
    (1e-3, float("inf"), 1e-5, 1e-5, 0.1, "minimum"),
    (1e-3, float("inf"), 1e-5, 1e-5, 5.0, "minimum"),  # convex; its minimiser far away
    (-1e-3, 0.3, 1e-5, 1e-5, 0.0, "degenerate plateau"),  # negative but rises on both sides
])
def test_label_rule(lam, esc, minus, plus, newton, want):
    s = {"eigenvalues": torch.tensor([lam, 1.0]), "tol": 1e-14, "escape_radius": esc,
         "line_minus": minus, "line_plus": plus, "newton_step": newton}
    assert label(s, reach=0.5) == want and want in LABELS
    flat = {"eig1": lam, **{k: v for k, v in s.items() if k != "eigenvalues"}}
    assert label(flat, reach=0.5) == want  # the same rule from a table row


def test_classify_state_and_perturbation_escapes_restore_W():
    _, model, p = _setup()
    W0 = model.W_PP.detach().clone()
    c = classify_state(model, p)
    assert c["label"] in LABELS and c["grad_norm"] > 0
    assert torch.equal(model.W_PP.detach(), W0)
    calls = []

    def score(m):
        calls.append(m.W_PP.detach().clone())
        return 1.0

    assert perturb_escapes(model, p, score, Escapes(radius=0.5, draws=3, steps=2)) == 3
    assert len(calls) == 3 and not torch.equal(calls[0], calls[1])
    assert torch.equal(model.W_PP.detach(), W0)
    assert perturb_escapes(model, p, lambda m: 0.0, Escapes(draws=2, steps=1)) == 0
