"""Memory plans of the dense and sparse statistics engines (their sizes: the constants below,
which the engines read), and ``--engine auto``.

dense (``stats/dense/``): V x V tensors of 8 B, "1 VV" = 8 V^2 bytes (20.2 GB at
V = 50,277). Pass 1 holds 3 VV (bigram counts and two fixed-point limbs); on the host the peak
is 5 VV (Bbar, Phibar, SigmaB, Gbar, then Bbar, Phibar, Gbar, PhiBT, GbarHead; pass 2's
centred Gc and GcHead with Qbar and QbarHead), plus the matmul tiles. Its
pass 2 runs the torch kernels on every device: a batch needs their per-pair workspace
(B x T(T+1)/2 pairs). Its statistics are factored like the sparse engine's.

sparse (``stats/sparse/``): memory grows with what the corpus holds, not with V^2:
  36 B per distinct (target, context) pair (the table, and W by target rows for GbarHead's
  tiles), 64 B per distinct bigram (table, C and C^T),
  28 B per position and 4 B per token in pass 2 (S, occurrence order, tokens; every window
  padded to T+1 slots), the pair buffer (16 B x max(BUFFER, one window's pairs)),
  column tiles (4 arrays of V x width float64, width from the tile budget), one tile's Qbar
  block (8 B and a bit x width x V), the head block (8 B x HEAD^2) and Qbar and
  QbarHead on the (query, key) pairs that occur (12 B each, twice; GbarHead's tiles need W by
  target rows, 12 B per (target, context) pair). No V x V array at any vocabulary.

``choose_engine``: "auto" follows the plan: dense when its peak fits the device's budget (free
CUDA memory x 0.9, or the host's available RAM x 0.8) and is below the sparse engine's (its
fixed bytes, or its bound when --docs is known), else sparse; "dense" past the budget is
refused up front with the numbers; an existing pass-1 checkpoint keeps the engine that wrote it
(a resumed run never switches). The choice, why, and the sparse plan are printed by the driver
and stored in the statistics metadata (``meta["engine"]``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from pythia_probe import fileio
from pythia_probe.errors import BadInputError, KernelError, MismatchError, ResourceError
from pythia_probe.planner.budget import GB, memory_budget

CHUNK = 1 << 22
"""Entries per chunk of the context table (a merge copies at most two chunks at a time)."""
BUFFER = 1 << 25
"""Raw pair codes the sparse pass 1 buffers between sorts (8 B each: 256 MiB, and as much for
their sums)."""
HEAD = 4096
"""Head tokens (the most frequent after the first flush): pairs of two head tokens are summed
in a dense HEAD x HEAD int64 block (128 MiB) instead of being sorted: 72% of all pairs on a
Zipf(1.08) stream over 50,277 tokens."""
DEFAULT_CPU_BUDGET = 1 << 30
"""Bytes of the matmul tiles (and the sparse engine's Gbar column tiles) on the host."""
KEPT_ARRAYS = 10
"""K x K float64 arrays held at once by a kept composition and its pass-2 tables."""
SPARSE_KIND = "sparse_count"
"""The sparse pass-1 accumulator's kind in its checkpoints (an engine choice resumes it)."""
ENGINES = ("auto", "dense", "sparse")
PAIR_BYTES = 36  # a (target, context) pair: the table (24 B) and W by target rows (12 B)
QBAR_PAIR_BYTES = 24  # a (query, key) pair of Qbar and of QbarHead: int32 query + float64 value
# (+ its tile place), each
QBAR_BLOCK_BYTES = 8  # a tile's dense Qbar block: float64 per (key, query), + a touched bit
BIGRAM_BYTES = 64
POSITION_BYTES = 28
TOKEN_BYTES = 4
TILE_ARRAYS = 4


@dataclass(frozen=True)
class EngineChoice:
    """The resolved engine, why, and the numbers behind it (JSON-able, for the metadata)."""

    requested: str
    resolved: str
    reason: str
    plan: dict[str, Any] = field(default_factory=dict)

    def meta(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"engine: {self.requested} -> {self.resolved} ({self.reason})"


class StatsShape(NamedTuple):
    """What the statistics' memory depends on: the vocabulary, the window length T, top-k
    (None: the full vocabulary), the documents (None: not known up front), G document groups
    and the bytes of the Gbar tiles (None: the default)."""

    d_vocab: int
    T: int
    top_k: int | None
    docs: int | None = None
    groups: int = 0
    tile_budget: int | None = None


def dense_peak(d_vocab: int, top_k: int | None, device: str = "cpu", groups: int = 0) -> int:
    """Peak bytes of the dense engine on the memory that decides whether it fits.

    CPU: the host peak, 5 VV (pass 1's 3 VV and the factors taken from them; then Bbar,
    Phibar, SigmaB, Gbar, and Bbar, Phibar, Gbar, PhiBT, GbarHead; pass 2's centred Gc and
    GcHead with one Qbar and one QbarHead sum per group, at least one) + matmul tiles (the tile
    budget, or two V x V tiles when the whole matrix is smaller). With G document groups: the
    groups are counted one at a time beside the total's 3 VV (6 VV).
    CUDA: pass 1's 3 VV on the device (later phases stream tiles through it or hold less;
    with groups 6 VV while they are counted; pass 2 as on the host).
    """
    VV = 8 * d_vocab * d_vocab
    side = d_vocab if top_k is None else top_k + 1
    pass2 = 2 * VV + 2 * max(groups, 1) * 8 * side * side
    if device.startswith("cuda"):
        return max(3 * VV, 6 * VV if groups else 0, pass2) + (1 << 30)
    return max(5 * VV, pass2, 6 * VV if groups else 0) + min(DEFAULT_CPU_BUDGET, 2 * VV)


def host_need(d_vocab: int, top_k: int | None, device: str, groups: int,
              limit: float | None) -> int:
    """Host bytes a CUDA run of the dense engine needs besides the device: where the device
    (``limit``) cannot hold six V x V float64 matrices, its V x V results live in host memory
    (``dense.first.needs_offload``), as much as a CPU run's peak; else none."""
    VV = 8 * d_vocab * d_vocab
    if not device.startswith("cuda") or (limit is not None and 6 * VV <= limit):
        return 0
    return dense_peak(d_vocab, top_k, "cpu", groups)


def check_kept(k: int, groups: int = 0, budget: tuple[float | None, str] | None = None) -> None:
    """Refuse up front a composition over k kept ids (``stats/kept.py``: dense K x K
    matrices, and the dense engine's per-group pass-2 sums) that cannot fit."""
    need = 8 * (k + 1) ** 2 * (KEPT_ARRAYS + 2 * max(groups, 1))
    limit, how = budget if budget is not None else memory_budget("cpu")
    if limit is not None and need > limit:
        raise ResourceError(f"composing over the {k:,} kept ids (--conventions authors at "
                            f"--top-k {k}) needs {need / GB:.1f} GB of K x K matrices, more "
                            f"than the budget {limit / GB:.1f} GB ({how}); use a smaller "
                            "--top-k, or the full vocabulary (--top-k full)")


def tile_width(d_vocab: int, budget_bytes: int | None = None) -> int:
    """Columns per Gbar tile: TILE_ARRAYS arrays of V x width float64 within the tile budget;
    a multiple of 32 (the C kernel's register block) when it reaches 32, at most 4096."""
    budget = DEFAULT_CPU_BUDGET if budget_bytes is None else budget_bytes
    width = budget // (TILE_ARRAYS * 8 * d_vocab)
    return int(min(4096, width // 32 * 32 if width >= 32 else max(1, width)))


def sparse_plan(s: StatsShape) -> dict[str, Any]:
    """Bytes the sparse engine needs that do not depend on the corpus, and its per-item costs.
    The statistics are factored at any vocabulary: no V x V output (Qbar is kept on the
    (query, key) pairs that occur). ``docs`` (when known) bounds the distinct pairs by
    docs x T (T + 1) / 2. With G document groups each group's pairs are kept too (at most as
    many again as the occurrences: ``group_factor`` 2 on every per-pair cost) and one group's
    pass-1 buffers are held beside the total's while the groups are counted.
    """
    d_vocab, T, top_k, docs, groups = s.d_vocab, s.T, s.top_k, s.docs, s.groups
    width = tile_width(d_vocab, s.tile_budget)
    side = d_vocab if top_k is None else top_k + 1
    buffer = max(BUFFER, T * (T + 1) // 2)  # one window's pairs fit in the buffer
    fixed = {"tiles": TILE_ARRAYS * 8 * d_vocab * width,
             "qbar_block": QBAR_BLOCK_BYTES * width * side + 8 * -(-width * side // 64),
             "pair_buffer": (16 * buffer + 48 * CHUNK + 8 * HEAD**2)
             * (2 if groups else 1),
             "vectors": 6 * 8 * d_vocab}
    plan = {"fixed_bytes": sum(fixed.values()), **{f"{k}_bytes": v for k, v in fixed.items()},
            "tile_width": width, "bytes_per_context_pair": PAIR_BYTES,
            "bytes_per_qbar_pair": QBAR_PAIR_BYTES, "bytes_per_bigram": BIGRAM_BYTES,
            "bytes_per_position": POSITION_BYTES, "bytes_per_token": TOKEN_BYTES,
            "groups": groups, "group_factor": 2 if groups else 1}
    if docs is not None:
        pairs = docs * T * (T + 1) // 2
        plan["max_context_pairs"] = min(d_vocab * d_vocab, pairs)
        plan["max_qbar_pairs"] = min((side - (top_k is not None)) ** 2, pairs)
    return plan


def describe_sparse(plan: dict[str, Any]) -> str:
    """One line: fixed bytes and what grows with the corpus."""
    s = (f"sparse needs {plan['fixed_bytes'] / GB:.2f} GB fixed (Gbar tiles "
         f"{plan['tiles_bytes'] / GB:.2f}, Qbar block {plan['qbar_block_bytes'] / GB:.2f}, "
         f"buffers {plan['pair_buffer_bytes'] / GB:.2f}) + {PAIR_BYTES} B per distinct "
         f"(target, context) pair + {QBAR_PAIR_BYTES} B per distinct (query, key) pair + "
         f"{BIGRAM_BYTES} B per distinct bigram + {POSITION_BYTES} B per position")
    if plan.get("groups"):
        s += f", per-pair costs x2 for {plan['groups']} document groups"
    if "max_context_pairs" in plan:
        s += f" (at most {plan['max_context_pairs']:,} pairs)"
    return s


def choose_engine(requested: str, s: StatsShape, device: str = "cpu",
                  budget: tuple[float | None, str] | None = None,
                  checkpoint_kind: str | None = None, sparse_built: bool = True) -> EngineChoice:
    """Resolve ``--engine`` for statistics of shape ``s``: auto -> dense when its peak fits
    ``budget`` and is below the sparse engine's, else sparse (which needs its C kernels:
    ``sparse_built``); an existing pass-1 checkpoint (``checkpoint_kind``) keeps its engine."""
    if requested not in ENGINES:
        raise BadInputError(f"--engine {requested!r}; valid: {', '.join(ENGINES)}")
    choice = _choose(requested, s, device, budget, checkpoint_kind)
    if choice.resolved == "sparse" and not sparse_built:
        if requested == "auto" and choice.plan["budget_bytes"] is not None and \
                choice.plan["dense_peak_bytes"] <= choice.plan["budget_bytes"]:
            return EngineChoice(requested, "dense", "the sparse engine's C kernels are not "
                                "built; " + choice.reason.split(";")[0], choice.plan)
        raise KernelError("the sparse engine needs its C kernels, which are not built "
                          f"(reinstall with `pip install -e .` and a C compiler); "
                          f"{choice.reason.split(';')[0]}")
    return choice


def _choose(requested: str, s: StatsShape, device: str,
            budget: tuple[float | None, str] | None, checkpoint_kind: str | None) -> EngineChoice:
    d_vocab, docs = s.d_vocab, s.docs
    splan = sparse_plan(s)
    need = dense_peak(d_vocab, s.top_k, device, s.groups)
    limit, how = budget if budget is not None else memory_budget(device)
    host = host_need(d_vocab, s.top_k, device, s.groups, limit)
    host_limit, host_how = memory_budget("cpu") if host else (None, "")
    plan = {"dense_peak_bytes": need, "budget_bytes": limit, "sparse": splan,
            "dense_host_bytes": host}
    if host_limit is not None and host > host_limit:  # the device fits, the host does not
        need, limit, how = host, host_limit, f"host memory of a CUDA run: {host_how}"
    if requested == "dense" and checkpoint_kind == SPARSE_KIND:
        raise MismatchError("the work folder holds a sparse pass-1 checkpoint: resume it with "
                            "--engine sparse (or auto), or use another --work-dir")
    if requested == "dense":
        if limit is not None and need > limit:
            raise ResourceError(f"--engine dense at d_vocab {d_vocab:,} needs {need / GB:.1f} GB "
                                f"(its V x V tensors, see MEMORY.md), more than the budget "
                                f"{limit / GB:.1f} GB ({how}); use --engine sparse or auto")
        return EngineChoice(requested, "dense", f"--engine dense given; dense peak "
                            f"{need / GB:.2f} GB", plan)
    if requested == "sparse":
        return EngineChoice(requested, "sparse", f"--engine sparse given; "
                            f"{describe_sparse(splan)}", plan)
    if checkpoint_kind is not None:
        kind = "sparse" if checkpoint_kind == SPARSE_KIND else "dense"
        return EngineChoice(requested, kind, f"resuming a {kind} pass-1 checkpoint", plan)
    sparse_need = splan["fixed_bytes"] if docs is None else sparse_bound(s)
    if limit is not None and need <= limit and need <= sparse_need:
        return EngineChoice(requested, "dense", f"dense peak {need / GB:.2f} GB fits budget "
                            f"{limit / GB:.2f} GB ({how}) and is below the sparse engine's "
                            f"{sparse_need / GB:.2f} GB", plan)
    why = ("budget unknown" if limit is None else f"exceeds budget {limit / GB:.2f} GB"
           if need > limit else f"is above the sparse engine's {sparse_need / GB:.2f} GB")
    return EngineChoice(requested, "sparse", f"dense peak {need / GB:.2f} GB at d_vocab "
                        f"{d_vocab:,} {why} ({how}); {describe_sparse(splan)}", plan)


def check_sparse_fits(choice: EngineChoice, d_vocab: int, top_k: int | None) -> None:
    """Refuse up front when the sparse engine's fixed needs (tiles, Qbar block, buffers)
    exceed the budget, saying what they are."""
    limit = choice.plan.get("budget_bytes")
    splan = choice.plan["sparse"]
    if limit is None or splan["fixed_bytes"] <= limit:
        return
    what = "full-vocabulary" if top_k is None else f"top-{top_k}"
    raise ResourceError(f"{what} statistics at d_vocab {d_vocab:,} with the sparse engine "
                        f"need {splan['fixed_bytes'] / GB:.1f} GB before any counting (Gbar "
                        f"tiles {splan['tiles_bytes'] / GB:.1f} GB, pair buffer "
                        f"{splan['pair_buffer_bytes'] / GB:.1f} GB), more than the budget "
                        f"{limit / GB:.1f} GB; lower --budget-gb (narrower tiles) or --seq-len")


def sparse_bound(s: StatsShape) -> int:
    """Upper bound of the sparse engine's peak for ``s.docs`` windows of T+1 tokens: every
    (target, context) pair, (query, key) pair and bigram distinct, up to the d_vocab^2 that
    can exist (each kept once more per group part with G groups)."""
    p = sparse_plan(s)
    positions = s.docs * s.T
    bigrams = min(positions, s.d_vocab * s.d_vocab)
    return (p["fixed_bytes"] + p["group_factor"] * (
        p["max_context_pairs"] * PAIR_BYTES + p["max_qbar_pairs"] * QBAR_PAIR_BYTES
        + bigrams * BIGRAM_BYTES) + positions * POSITION_BYTES + s.docs * (s.T + 1) * TOKEN_BYTES)


BATCH_COPIES = 4  # a token batch [B, T+1] int64 lives as ids, lengths/masks and kernel buffers
T_ARRAYS = 4  # per-position arrays of T float64 (Delta, its partial sums, weights)
TORCH_PAIR_BYTES = 32  # torch kernels: keys, weights / M and masks per (t, m) pair of a batch
PASS2_SLOT_BYTES = 13  # sparse pass 2: int32 token, float64 sum S, a mask byte per window slot


def batch_needs(T: int, batch_size: int, docs: int | None, mode: str,
                torch_kernels: bool = False) -> dict[str, int | None]:
    """Memory of one token batch [B, T+1] (padded: --keep-short windows cost as much as full
    ones), of the per-position arrays and, with the torch kernels (CUDA, or no C kernel), of
    their per-pair workspace (B x T(T+1)/2 pairs); the token cache's disk (its tokens without
    padding; bounded when --docs is given and each document gives one window: mode 'first')."""
    pairs = T * (T + 1) // 2
    window = 4 * (T + 1) + 8
    cache = docs * window if docs is not None and mode == "first" else None
    return {"batch_bytes": BATCH_COPIES * 8 * batch_size * (T + 1),
            "position_bytes": T_ARRAYS * 8 * T,
            "kernel_bytes": TORCH_PAIR_BYTES * (batch_size + 1) * pairs if torch_kernels else 0,
            "cache_bytes": cache, "cache_bytes_per_window": window}


def check_batches(T: int, batch_size: int, docs: int | None, mode: str, work_dir,
                  budget: tuple[float | None, str], torch_kernels: bool = True) -> str:
    """Refuse, before any document is read, a run whose batches, kernel workspace or token
    cache cannot fit the device's ``budget`` (e.g. --seq-len 100000000); return the plan line
    (``torch_kernels``: the batches run through the torch kernels, on CUDA or without the C
    kernel)."""
    need = batch_needs(T, batch_size, docs, mode, torch_kernels)
    return _check_batches(T, batch_size, docs, need, work_dir, budget)


def check_dense_batches(T: int, batch_size: int, device: str,
                        budget: tuple[float | None, str] | None = None) -> None:
    """The dense engine's pass 2 (torch kernels on every device) needs the per-pair workspace
    of a batch: refuse up front when it cannot fit."""
    _check_batches(T, batch_size, None, batch_needs(T, batch_size, None, "first", True), None,
                   budget if budget is not None else memory_budget(device))


def _check_batches(T: int, batch_size: int, docs: int | None, need: dict, work_dir,
                   budget: tuple[float | None, str]) -> str:
    mem = need["batch_bytes"] + need["position_bytes"] + need["kernel_bytes"]
    limit, how = budget
    if limit is not None and mem > limit:
        what = (f" (the torch kernels' workspace for {batch_size} x {T * (T + 1) // 2:,} "
                f"(t, m) pairs: {need['kernel_bytes'] / GB:.1f} GB)" if need["kernel_bytes"]
                else "")
        raise ResourceError(f"--seq-len {T} with --batch-size {batch_size} needs {mem / GB:.1f} "
                            f"GB per batch of windows{what}, more than the budget "
                            f"{limit / GB:.1f} GB ({how}); lower --batch-size or --seq-len")
    cache = need["cache_bytes"]
    if cache is not None:
        fileio.check_free(work_dir, cache, f"the token cache ({docs:,} windows of {T + 1} "
                                           "tokens)")
    return (f"batches: {mem / GB:.2f} GB ({batch_size} windows of {T + 1} tokens); token cache "
            + (f"<= {cache / GB:.2f} GB" if cache is not None else
               "4 B per token kept"))


def check_window_length(T: int, text_bytes: int | None, extra_tokens: int = 0) -> None:
    """Refuse a T no window can reach: a local text corpus of ``text_bytes`` bytes holds at
    most that many tokens (every token of the word rule and of byte-level BPE covers >= 1 byte;
    ``extra_tokens``: BOS/EOS added per document). None: the size is unknown (hub, builtin)."""
    if text_bytes is None or T + 1 <= text_bytes + extra_tokens:
        return
    raise BadInputError(f"--seq-len {T}: a window holds T+1 = {T + 1:,} tokens, but the whole "
                        f"corpus is {text_bytes:,} bytes, so no window can reach that length "
                        "(every document would be skipped, or with --keep-short padded to it); "
                        f"use --seq-len below {text_bytes + extra_tokens:,}")


def check_pass2_windows(choice: EngineChoice, T: int, docs: int | None, short: str) -> None:
    """The sparse engine's pass 2 holds every window padded to T+1 slots: refuse up front
    when ``docs`` windows of that size exceed the budget (--keep-short with a large T)."""
    limit = choice.plan.get("budget_bytes")
    if choice.resolved != "sparse" or docs is None or limit is None:
        return
    need = docs * (T + 1) * PASS2_SLOT_BYTES + choice.plan["sparse"]["fixed_bytes"]
    if need > limit:
        raise ResourceError(f"pass 2 of the sparse engine holds every window padded to T+1 = "
                            f"{T + 1:,} slots ({PASS2_SLOT_BYTES} B each): {docs:,} windows "
                            f"need {need / GB:.1f} GB, more than the budget {limit / GB:.1f} GB"
                            + ("; --keep-short pads short documents to that length"
                               if short == "keep" else "") + "; lower --seq-len or --docs")


def check_statistics_fit(st, V: int, top_k: int | None, device: str,
                         budget: tuple[float | None, str] | None = None) -> None:
    """Refuse up front, with the numbers, statistics to build (``st``: their seq_len and
    docs) that the engine ``--engine auto`` picks cannot fit in the device's memory budget
    (the statistics' own check, made by the sweep before any download or allocation)."""
    budget = budget if budget is not None else memory_budget(device)
    choice = choose_engine("auto", StatsShape(V, st.seq_len, top_k, st.docs), device, budget)
    check_sparse_fits(choice, V, top_k)
