"""The attention-only transformer of Definition 3.1 (leading-terms paper), batched and fast.

The residual stream lives in the |V|-dim one-hot space: h0 = X (one-hot rows), and per layer

    h_l = h_{l-1} + S(Mask(h_{l-1} W_l h_{l-1}^T + DM(P_l))) h_{l-1} V_l,    F(X) = h_L W_O.

S is the row softmax, Mask the causal mask, DM(P) puts P[r] on the r-th sub-diagonal (query t,
key t - r). One head, no scaling, no LayerNorm/MLP/biases. Layer 1's input is one-hot, so
``X W X^T`` and ``X V`` are gathers (``W[x_t, x_s]`` and ``V[x_t]``), never matmuls; later layers
are dense. All parameters start at exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pythia_probe.errors import BadInputError
from pythia_probe.linalg import positional_bias


@dataclass(frozen=True)
class ToyConfig:
    """Shape of the Def. 3.1 model: d_vocab = |V|, n_ctx = T (max positions), n_layers = L."""

    d_vocab: int
    n_ctx: int
    n_layers: int

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_ctx"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise BadInputError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.n_layers, int) or self.n_layers < 0:
            raise BadInputError(f"n_layers must be an int >= 0, got {self.n_layers!r}")


def row_gather(M: Tensor, x: Tensor) -> Tensor:
    """M[x] [..., V] via index_select (its backward, index_add, is deterministic on CPU)."""
    return M.index_select(0, x.reshape(-1)).view(*x.shape, M.shape[1])


def pair_gather(M: Tensor, x: Tensor) -> Tensor:
    """M[x_t, x_s] [batch, T, T]: the bilinear form x_t M x_s^T of one-hot rows, as a gather."""
    flat = (x[:, :, None] * M.shape[1] + x[:, None, :]).reshape(-1)
    return M.reshape(-1).index_select(0, flat).view(x.shape[0], x.shape[1], x.shape[1])


def check_tokens(tokens: Tensor, cfg: ToyConfig) -> None:
    """Raise a clear error for token tensors the model cannot take."""
    if tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise BadInputError(f"tokens must be an integer tensor [batch, T], got "
                            f"{tuple(tokens.shape)} {tokens.dtype}")
    if tokens.shape[1] > cfg.n_ctx or tokens.shape[1] < 1:
        raise BadInputError(f"sequence length {tokens.shape[1]} not in 1..n_ctx={cfg.n_ctx}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= cfg.d_vocab):
        raise BadInputError(f"token ids must lie in 0..{cfg.d_vocab - 1}, got "
                            f"{int(tokens.min())}..{int(tokens.max())}")


class AttnOnlyTransformer(nn.Module):
    """Def. 3.1 with stacked per-layer weights W [L, V, V], V [L, V, V], P [L, T] and W_O [V, V].

    W is the query-key matrix (logit of query t on key s is h_t W h_s^T: rows = query token).
    mode: "dense" (layer 1 by gathers, later layers dense [T, V] x [V, V] products), "paths"
    (every product with the residual stream expanded down to gathers; cheaper when 2^L T << V)
    or "auto" (paths when :func:`forward_flops` says it needs under half the FLOPs of dense).
    """

    def __init__(self, cfg: ToyConfig, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, mode: str = "auto") -> None:
        super().__init__()
        if mode not in MODES:
            raise BadInputError(f"mode must be one of {MODES}, got {mode!r}")
        self.cfg = cfg
        L, V, T = cfg.n_layers, cfg.d_vocab, cfg.n_ctx
        kw = {"dtype": dtype, "device": device}
        self.W = nn.Parameter(torch.zeros(L, V, V, **kw))
        self.V = nn.Parameter(torch.zeros(L, V, V, **kw))
        self.P = nn.Parameter(torch.zeros(L, T, **kw))
        self.W_O = nn.Parameter(torch.zeros(V, V, **kw))
        self.mode = mode

    def residual(self, tokens: Tensor, n_layers: int | None = None) -> Tensor:
        """h_l [batch, T, V] after the first ``n_layers`` layers (default all)."""
        check_tokens(tokens, self.cfg)
        n = self.cfg.n_layers if n_layers is None else n_layers
        T = tokens.shape[1]
        bias = positional_bias(self.P, T)
        h = F.one_hot(tokens.long(), self.cfg.d_vocab).to(self.W_O.dtype)
        for layer in range(n):
            h = h + self.attention(tokens, h, layer, bias[layer])
        return h

    def attention(self, tokens: Tensor, h: Tensor, layer: int, bias: Tensor) -> Tensor:
        """S(Mask(h W h^T + DM(P))) h V for one layer; gathers when h is still one-hot."""
        x = tokens.long()
        if layer == 0:
            A = torch.softmax(pair_gather(self.W[0], x) + bias, dim=-1)
            return A @ row_gather(self.V[0], x)
        logits = (h @ self.W[layer]) @ h.transpose(1, 2)
        A = torch.softmax(logits + bias, dim=-1)
        return (A @ h) @ self.V[layer]

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits F(X) [batch, T, V] for integer tokens [batch, T]."""
        check_tokens(tokens, self.cfg)
        if self.cfg.n_layers == 0:
            return row_gather(self.W_O, tokens.long())
        if choose_mode(self.cfg, *tokens.shape, self.mode) == "dense":
            return self.residual(tokens) @ self.W_O
        return self._forward_paths(tokens.long())

    def _forward_paths(self, x: Tensor) -> Tensor:
        """Never forms h_l R densely: h_l R = h_{l-1} R + A_l (h_{l-1} (V_l R)) down to gathers."""
        bias = positional_bias(self.P, x.shape[1])
        As: list[Tensor] = []
        for layer in range(self.cfg.n_layers):
            if layer == 0:
                logits = pair_gather(self.W[0], x)
            else:
                logits = self.times(x, As, self.W[layer]) @ self.times(x, As).transpose(1, 2)
            As.append(torch.softmax(logits + bias[layer], dim=-1))
        return self.times(x, As, self.W_O)

    def times(self, x: Tensor, As: list[Tensor], R: Tensor | None = None) -> Tensor:
        """h_l R [batch, T, V] for l = len(As) given the attention patterns As (R None: h_l).

        Uses V_l R products ([V, V], once per batch) and gathers of their rows, so the per-token
        cost is T x V per attention application instead of V x V per dense product.
        """
        if not As:
            if R is None:
                return F.one_hot(x, self.cfg.d_vocab).to(self.W_O.dtype)
            return row_gather(R, x)
        layer = len(As) - 1
        VR = self.V[layer] if R is None else self.V[layer] @ R
        return self.times(x, As[:-1], R) + As[-1] @ self.times(x, As[:-1], VR)

    def loss(self, seqs: Tensor) -> Tensor:
        """Eq. 3: mean next-token cross-entropy over all predicted positions of [batch, T+1]."""
        logits = self(seqs[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.cfg.d_vocab), seqs[:, 1:].reshape(-1).long())


MODES = ("auto", "dense", "paths")


def _dense_flops(V: int, T: int, L: int) -> int:
    per_seq = 2 * T * T * V  # layer 1: A @ V[x]
    per_seq += max(L - 1, 0) * (2 * T * V * V * 2 + 2 * T * T * V * 2)  # hW, (hW)h^T, A h, (Ah)V
    return per_seq + 2 * T * V * V  # h W_O


def _times_flops(level: int, identity: bool, V: int, T: int, batch: int) -> int:
    """FLOPs of AttnOnlyTransformer.times at depth ``level`` (mirrors its recursion)."""
    if level == 0:
        return 0
    product = 0 if identity else 2 * V**3
    return (product + _times_flops(level - 1, identity, V, T, batch)
            + _times_flops(level - 1, False, V, T, batch) + batch * 2 * T * T * V)


def _paths_flops(V: int, T: int, L: int, batch: int) -> int:
    total = 0
    for layer in range(1, L):
        total += (_times_flops(layer, False, V, T, batch) + _times_flops(layer, True, V, T, batch)
                  + batch * 2 * T * T * V)
    return total + _times_flops(L, False, V, T, batch)


def forward_flops(cfg: ToyConfig, batch: int, T: int, mode: str = "auto") -> int:
    """Matmul FLOPs of one forward pass (gathers count zero) in ``mode`` ("auto": as chosen)."""
    V, L = cfg.d_vocab, cfg.n_layers
    if L == 0:
        return 0
    if mode == "auto":
        mode = choose_mode(cfg, batch, T)
    return batch * _dense_flops(V, T, L) if mode == "dense" else _paths_flops(V, T, L, batch)


#: "auto" takes paths mode only below this fraction of dense mode's FLOPs: its batched
#: [T, T] x [T, V] products and extra [batch, T, V] temporaries run less efficiently (on this
#: project's 2-core CPU, paths at 0.51x the FLOPs took the same wall time as dense).
PATHS_MAX_FRACTION = 0.5


def choose_mode(cfg: ToyConfig, batch: int, T: int, mode: str = "auto") -> str:
    """The implementation a forward pass of this shape uses."""
    if mode != "auto":
        return mode
    dense = forward_flops(cfg, batch, T, "dense")
    paths = forward_flops(cfg, batch, T, "paths")
    return "paths" if paths < PATHS_MAX_FRACTION * dense else "dense"


def train_flops(cfg: ToyConfig, batch: int, T: int, mode: str = "auto") -> int:
    """Forward + backward matmul FLOPs of one training step (backward = 2x forward)."""
    return 3 * forward_flops(cfg, batch, T, mode)
