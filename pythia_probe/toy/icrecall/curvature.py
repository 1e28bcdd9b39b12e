"""Curvature of the fine-tuning loss in W_PP at a state: exact Hessian, spectrum, classification.

The loss depends on W_PP only through two softmax columns (q_rel, and q_ans when the answer loss
is on), so of the L*L = 49 directions most are exact null directions: entries of unused columns,
entries above the diagonal, and per used column the shift W[:, q] += c (softmax is invariant to
it). The spectrum that decides saddle / plateau / minimum is the Hessian restricted to the
orthogonal complement (the "effective" directions: 11 for k = 2 pairs with the answer loss on).
The exact null directions also measure the numerical noise: ||H u|| is 0 in exact arithmetic.

Classification of the relation column at a state, with gradient g, effective eigenvalues
l_1 <= l_2 <= ... and eigenvector u_1 (``reach`` = 0.5 by default, PGD's perturbation radius):
- "strict saddle": l_1 < -tol, the escape radius 2 |g| / |l_1| (distance along u_1 beyond which
  the quadratic model's curvature term outweighs its slope term) is <= reach, and the loss
  actually falls at distance ``reach`` on BOTH sides, W -/+ reach u_1 (the quadratic picture holds);
- "one-sided saddle": as above but the loss falls on one side only (the cubic term dominates,
  e.g. an AND unit that wakes up on one side and stays dead on the other);
- "minimum": every effective l_i > tol (locally convex; with cross-entropy the minimiser may lie
  at infinity, and the Newton step |H^-1 g| says how far the quadratic model puts it);
- "degenerate plateau": everything else (a zero eigenvalue within tolerance, or negative
  curvature too weak for the slope within ``reach``).
tol = 10 x the largest ||H u|| over exact null directions + 64 eps ||H||_2 (float64 eps).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.task import Prompts
from pythia_probe.toy.icrecall.train import gd_step, perturbation

LABELS = ("strict saddle", "one-sided saddle", "degenerate plateau", "minimum")


@dataclass
class Curvature:
    """Loss, gradient (L*L) and Hessian (L*L, L*L) in float64 at one W_PP, flattened row-major."""

    loss: float
    grad: torch.Tensor
    hessian: torch.Tensor
    L: int
    columns: tuple[int, ...]


def loss_grad_hessian(model: ICRecallModel, prompts: Prompts, answer_weight: float = 1.0,
                      W_PP: torch.Tensor | None = None) -> Curvature:
    """Exact gradient and Hessian of the training loss in W_PP (float64 copy of the model,
    torch.autograd.functional.hessian), at W_PP (default: the model's own)."""
    m64 = copy.deepcopy(model).double()
    L = model.L
    w0 = (model.W_PP if W_PP is None else W_PP).detach().double().reshape(-1).clone()

    def f(w: torch.Tensor) -> torch.Tensor:
        return m64.loss(prompts, answer_weight, W_PP=w.view(L, L))["loss"]

    w = w0.clone().requires_grad_(True)
    loss = f(w)
    (grad,) = torch.autograd.grad(loss, w)
    H = torch.autograd.functional.hessian(f, w0)
    cols = (model.q_rel,) + ((model.q_ans,) if answer_weight > 0 else ())
    return Curvature(float(loss.detach()), grad.detach(), 0.5 * (H + H.T), L, cols)


def effective_basis(L: int, columns: tuple[int, ...]) -> torch.Tensor:
    """(L*L, k) orthonormal basis of the directions that can change the loss: the causal entries
    j <= q of each used column q, minus the shift direction of that column."""
    blocks = []
    for q in columns:
        m = q + 1
        centred = torch.eye(m, dtype=torch.float64) - 1.0 / m
        basis = torch.linalg.qr(centred[:, : m - 1]).Q  # spans {x : sum x = 0}
        full = torch.zeros(L, L, m - 1, dtype=torch.float64)
        full[:m, q, :] = basis
        blocks.append(full.reshape(L * L, m - 1))
    return torch.cat(blocks, 1)


def null_directions(L: int, columns: tuple[int, ...]) -> torch.Tensor:
    """(L*L, L*L - k) orthonormal basis of the exact null directions (complement of
    :func:`effective_basis`)."""
    Q = effective_basis(L, columns)
    P = torch.eye(L * L, dtype=torch.float64) - Q @ Q.T
    evals, evecs = torch.linalg.eigh(P)
    return evecs[:, evals > 0.5]


def noise_level(c: Curvature) -> float:
    """Largest ||H u|| over exact null directions u (0 in exact arithmetic)."""
    N = null_directions(c.L, c.columns)
    return float((c.hessian @ N).norm(dim=0).max())


def spectrum(c: Curvature, column: int | None = None) -> dict[str, object]:
    """Eigen-decomposition of the Hessian on the effective directions of one W_PP column
    (default: the relation column, the first of ``c.columns``; the Hessian is block-diagonal
    across columns because the relation and answer losses use disjoint columns).
    Returns column, grad_norm (of that column), eigenvalues (ascending), eigenvectors as
    (L, L) matrices, tol, slope_along (|g . u_1|), escape_radius 2|g|/|l_1| (inf if l_1 >= 0)
    and newton_step |H^-1 g| (inf unless l_1 > tol)."""
    q = c.columns[0] if column is None else column
    Q = effective_basis(c.L, (q,))
    Hq = Q.T @ c.hessian @ Q
    evals, evecs = torch.linalg.eigh(Hq)
    tol = 10 * noise_level(c) + 64 * torch.finfo(torch.float64).eps * float(
        torch.linalg.eigvalsh(c.hessian).abs().max())
    g_eff = Q.T @ c.grad
    gnorm, lam = float(g_eff.norm()), float(evals[0])
    return {"column": q, "grad_norm": gnorm, "eigenvalues": evals,
            "eigenvectors": [(Q @ evecs[:, i]).view(c.L, c.L) for i in range(evals.numel())],
            "tol": tol, "slope_along": float((g_eff @ evecs[:, 0]).abs()),
            "escape_radius": 2 * gnorm / abs(lam) if lam < 0 else float("inf"),
            "newton_step": (float(torch.linalg.solve(Hq, g_eff).norm()) if lam > tol
                            else float("inf"))}


@torch.no_grad()
def line_losses(model: ICRecallModel, prompts: Prompts, direction: torch.Tensor, t: float,
                answer_weight: float = 1.0) -> tuple[float, float]:
    """L(W - t u) - L(W) and L(W + t u) - L(W) at the model's W_PP, in float64."""
    m64 = copy.deepcopy(model).double()
    W, u = model.W_PP.detach().double(), direction.double()

    def f(x: torch.Tensor) -> float:
        return float(m64.loss(prompts, answer_weight, W_PP=x)["loss"])

    base = f(W)
    return f(W - t * u) - base, f(W + t * u) - base


def classify_state(model: ICRecallModel, prompts: Prompts, answer_weight: float = 1.0,
                   reach: float = 0.5) -> dict[str, object]:
    """Curvature of the relation column at the model's W_PP and its label (module docstring):
    everything from :func:`spectrum` plus loss, line_minus / line_plus (loss change at distance
    ``reach`` along -u_1 / +u_1) and label."""
    c = loss_grad_hessian(model, prompts, answer_weight)
    out = {"loss": c.loss, **spectrum(c)}
    lo, hi = line_losses(model, prompts, out["eigenvectors"][0], reach, answer_weight)
    out["line_minus"], out["line_plus"] = lo, hi
    out["label"] = label(out, reach)
    return out


def label(s: dict[str, object], reach: float = 0.5) -> str:
    """The class of a state from its lowest effective eigenvalue (``eigenvalues[0]`` or
    ``eig1``), ``tol``, ``escape_radius`` and the line losses (rule in the module docstring)."""
    lam = float(s["eigenvalues"][0]) if "eigenvalues" in s else float(s["eig1"])
    tol, esc = float(s["tol"]), float(s["escape_radius"])
    if lam < -tol and esc <= reach:  # nan (not stored) compares False: not a saddle
        down = int(s["line_minus"] < 0) + int(s["line_plus"] < 0)
        if down == 2:
            return "strict saddle"
        if down == 1:
            return "one-sided saddle"
    if lam > tol:
        return "minimum"
    return "degenerate plateau"


@dataclass(frozen=True)
class Escapes:
    """:func:`perturb_escapes`' settings: ``draws`` perturbations uniform in the ball of
    ``radius``, each followed by ``steps`` GD steps of size ``eta`` (answer loss weighted
    ``answer_weight``); a draw escapes when the score ends >= ``level``."""

    radius: float = 0.5
    draws: int = 5
    steps: int = 1500
    eta: float = 0.1
    level: float = 0.95
    answer_weight: float = 1.0
    seed: int = 0


def perturb_escapes(model: ICRecallModel, prompts: Prompts, score,
                    how: Escapes | None = None) -> int:
    """From the model's current W_PP: ``how.draws`` times, add a PGD perturbation (uniform in
    the ball of ``how.radius`` on the causal entries) and run ``how.steps`` small GD steps;
    count the draws whose ``score(model)`` (e.g. P(correct | confusing) on fresh prompts) ends
    >= ``how.level``. W_PP is restored afterwards."""
    how = how or Escapes()
    g = torch.Generator().manual_seed(how.seed + 7)
    W0 = model.W_PP.detach().clone()
    hits = 0
    for _ in range(how.draws):
        with torch.no_grad():
            model.W_PP.copy_(W0 + perturbation(model.L, how.radius, "ball", g, W0.dtype))
        for _ in range(how.steps):
            gd_step(model, prompts, how.eta, how.answer_weight)
        hits += int(score(model) >= how.level)
    with torch.no_grad():
        model.W_PP.copy_(W0)
    return hits


def label_from_row(row, prefix: str = "stall", reach: float = 0.5) -> str:
    """:func:`label` of a state stored as table columns ``{prefix}_eig1``, ``_tol``,
    ``_escape_radius`` (absent or nan = inf), ``_line_minus`` and ``_line_plus``."""
    def get(name: str, default: float = float("nan")) -> float:
        v = row.get(f"{prefix}_{name}", default)
        return default if v != v else float(v)

    return label({"eig1": get("eig1"), "tol": get("tol"),
                  "escape_radius": get("escape_radius", float("inf")),
                  "line_minus": get("line_minus"), "line_plus": get("line_plus")}, reach)
