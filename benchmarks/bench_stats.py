"""Statistics engine throughput, printed as ratios against baselines measured in the same run.

(a) |V| = 3,000, T = 200, uniform random tokens: engine (pass 1 + pass 2 updates) vs the
    literal dense one-hot computation of the same per-batch sums (X^T (Y - U),
    (Y - U)^T A0 X, M = (Y - U) Gbar X^T, the Jacobian einsum, X^T Q X), as the authors' code
    does it. The V^3 compositions (SigmaB, Gbar) are a fixed cost common to both and excluded.
(b) T = 128 on built-in stories: engine vs the HF `tokenizers` throughput on the same text,
    one core (RAYON_NUM_THREADS=1, torch 1 thread). Tokenizers: the paper's word-level rule
    (build_word_tokenizer) and a GPT-2-style byte-level BPE trained here (Pythia's cannot be
    downloaded). The engine counts each document's first 129 tokens.
(c) With CUDA: |V| = 50,304, T = 128 time and peak GPU memory (skipped without a GPU).

(a) and (b) time both pass-1 kernels side by side: the compiled C kernel
(stats/native/_fastcount.c, "c") and the pure-torch kernel ("torch"); pass 2 of the dense
engine is torch in both. CPU rates are tokens per CPU-second of this process
(time.process_time: every thread counted, so it is a per-core rate even if a library used more
threads), each the best of --repeat runs (the tokenizers too), so that load from other
processes on a shared machine biases no side. (c) uses wall-clock time.

  python benchmarks/bench_stats.py [--quick] [--repeat 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import resource  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from pythia_probe.cli import parse_configs, run_main  # noqa: E402
from pythia_probe.errors import BadInputError  # noqa: E402
from pythia_probe.stats import CountAccumulator, QAccumulator, first_pass, native  # noqa: E402
from pythia_probe.stats.native import fastcount  # noqa: E402
from pythia_probe.stats.reference import (  # noqa: E402
    one_hot_xy,
    softmax_jacobian_uniform,
    uniform_causal,
)


def dense_batch(tokens: torch.Tensor, V: int, Gbar: torch.Tensor) -> list[torch.Tensor]:
    """The per-batch sums of section 2 with dense one-hot matrices (the literal way)."""
    X, Y = one_hot_xy(tokens, V)
    T = X.shape[1]
    Yc = Y - 1.0 / V
    B = torch.einsum("ntv,ntw->vw", X, Yc)
    Phi = torch.einsum("ntv,ts,nsw->vw", Yc, uniform_causal(T), X)
    M = torch.einsum("ntv,vw,nsw->nts", Yc, Gbar, X)
    Q = torch.einsum("tjk,ntk->ntj", softmax_jacobian_uniform(T), M)
    Qs = torch.einsum("ntv,nts,nsw->vw", X, Q, X)
    return [B, Phi, Qs]


STATE_BYTES: dict[str, int] = {}


def engine_time(batches: list[tuple[torch.Tensor, torch.Tensor]], V: int, T: int,
                device: str = "cpu") -> tuple[float, float, int]:
    """Seconds of pass-1 and pass-2 updates over ``batches`` (compositions excluded)."""
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    acc = CountAccumulator(V, T, device)
    STATE_BYTES[f"pass 1 at |V|={V}"] = sum(t.nbytes for t in (
        acc.token_counts, acc.bigram, acc.context.hi, acc.context.lo))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t0 = clock()
    for tok, ln in batches:
        acc.update(tok, ln)
    sync()
    t1 = clock()
    n_tok = acc.n_tokens
    fp = first_pass(acc, consume=True, device=device)
    q = QAccumulator(fp.Gbar, T, device=device)
    STATE_BYTES[f"pass 2 at |V|={V}"] = q.Gc.nbytes + q.Qbar.nbytes
    sync()
    t2 = clock()
    for tok, ln in batches:
        q.update(tok, ln)
    sync()
    return t1 - t0, clock() - t2, n_tok


BACKENDS = ["c", "torch"]


def best_engine_times(batches: list[tuple[torch.Tensor, torch.Tensor]], V: int, T: int,
                      repeat: int) -> dict[str, tuple[float, float, int]]:
    """Per CPU backend: the fastest (pass1, pass2) of ``repeat`` runs, interleaved."""
    out: dict[str, tuple[float, float, int]] = {}
    for _ in range(repeat):
        for b in BACKENDS:
            with native.use_backend(b):
                p1, p2, n = engine_time(batches, V, T)
            old = out.get(b, (float("inf"), float("inf"), n))
            out[b] = (min(old[0], p1), min(old[1], p2), n)
    return out


def describe(times: dict[str, tuple[float, float, int]]) -> str:
    """'c X tok/s (pass1 ., pass2 .); torch Y tok/s (...)'."""
    parts = []
    for b, (p1, p2, n) in times.items():
        parts.append(f"{b} {n / (p1 + p2):,.0f} tok/s (pass1 {n / p1:,.0f}, pass2 {n / p2:,.0f})")
    return "; ".join(parts)


def ratios(rate: dict[str, float], base: float, fmt: str = ".2f") -> str:
    """'c 3.1x, torch 0.9x; c / torch 3.4x' (the last only when both backends ran)."""
    out = ", ".join(f"{b} {r / base:{fmt}}x" for b, r in rate.items())
    if "c" in rate and "torch" in rate:
        out += f"; c / torch {rate['c'] / rate['torch']:.2f}x"
    return out


def bench_dense(quick: bool, repeat: int) -> None:
    V, T = 3000, 200
    g = torch.Generator().manual_seed(0)
    n_eng = 32 if quick else 128
    tokens = torch.randint(0, V, (n_eng, T + 1), generator=g)
    full = torch.full((64,), T + 1)
    batches = [(tokens[i:i + 64], full[: len(tokens[i:i + 64])]) for i in range(0, n_eng, 64)]
    times = best_engine_times(batches, V, T, repeat)
    Gbar = torch.randn(V, V, dtype=torch.float64, generator=g) * 1e-6
    n_ref = 1 if quick else 2
    t0 = time.process_time()
    dense_batch(tokens[:n_ref], V, Gbar)
    ref = n_ref * T / (time.process_time() - t0)
    rate = {b: n / (p1 + p2) for b, (p1, p2, n) in times.items()}
    print(f"(a) |V|={V} T={T}: {describe(times)}; dense one-hot reference {ref:,.0f} tok/s")
    print(f"    ratios vs dense (target >= 100x): {ratios(rate, ref, ',.1f')}")


def train_bpe(docs: list[str], vocab_size: int):
    """A GPT-2-style byte-level BPE trained on ``docs`` (wrapped as a fast HF tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(docs, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


def tokenizer_rate(tok, docs: list[str], repeat: int) -> tuple[list[list[int]], float]:
    """(ids, best tokens/s of ``repeat`` encodes of every document)."""
    from pythia_probe.tokenizer import encode_documents

    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        ids = list(encode_documents(tok, docs))
        best = min(best, time.process_time() - t0)
    return ids, sum(map(len, ids)) / best


def bench_tokenizer(quick: bool, repeat: int) -> None:
    from pythia_probe.builtin_corpus import generate_stories
    from pythia_probe.stats.sequences import SequencePolicy, Sequencer, batches
    from pythia_probe.tokenizer import build_word_tokenizer, d_vocab

    T = 128
    docs = generate_stories(1000 if quick else 4000, seed=1)
    toks = {"word-level (paper rule, word:3000)": build_word_tokenizer(docs, 3000),
            "byte-level BPE (GPT-2 style, trained here)": train_bpe(docs, 8000)}
    for name, tok in toks.items():
        ids, tok_rate = tokenizer_rate(tok, docs, repeat)
        V = d_vocab(tok)
        seq = Sequencer(SequencePolicy(T), V)
        bs = list(batches(seq.windows(ids), T, 256))
        times = best_engine_times(bs, V, T, repeat)
        rate = {b: n / (p1 + p2) for b, (p1, p2, n) in times.items()}
        print(f"(b) T={T}, {name}, |V|={V}: tokenizer {tok_rate:,.0f} tok/s; "
              f"{describe(times)}")
        print(f"    ratios vs tokenizer (target >= 3x): {ratios(rate, tok_rate)}")
        n_seq = sum(len(t) for t, _ in bs)
        mean = sum(map(len, ids)) / len(ids)
        doc_tok = tok_rate / mean
        docs_s = {b: n_seq / (p1 + p2) for b, (p1, p2, _) in times.items()}
        print(f"    per document under the paper policy (tokenizer encodes whole documents, "
              f"mean {mean:.0f} tokens; engine counts {T + 1}): tokenizer {doc_tok:,.0f} docs/s; "
              + ", ".join(f"{b} {r:,.0f} docs/s" for b, r in docs_s.items())
              + f"; ratios {ratios(docs_s, doc_tok)}")


def bench_gpu(quick: bool) -> None:
    if not torch.cuda.is_available():
        print("(c) no CUDA device: |V| = 50,304 timing skipped (see pythia_probe/stats/MEMORY.md)")
        return
    V, T = 50304, 128
    tokens = torch.randint(0, 50277, (2048 if quick else 16384, T + 1))
    full = torch.full((256,), T + 1)
    batches = [(tokens[i:i + 256].cuda(), full.cuda()) for i in range(0, len(tokens), 256)]
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    p1, p2, n_tok = engine_time(batches, V, T, "cuda")
    total = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"(c) |V|={V} T={T} on {torch.cuda.get_device_name()}: pass1 {n_tok / p1:,.0f} tok/s,"
          f" pass2 {n_tok / p2:,.0f} tok/s, total with compositions {total:.1f} s, peak GPU "
          f"memory {peak:.1f} GiB")


PROG = "python benchmarks/bench_stats.py"


@dataclass(frozen=True)
class BenchConfig:
    """Statistics kernels (C, torch, dense one-hot reference), tokenizer and GPU throughput."""

    quick: bool = False
    """Smaller inputs."""
    repeat: int = 3
    """Best of this many runs."""

    def __post_init__(self):
        if self.repeat < 1:
            raise BadInputError(f"--repeat must be >= 1, got {self.repeat}")


def main(argv: list[str] | None = None) -> int:
    [fields] = parse_configs([BenchConfig], argv, PROG, __doc__)
    a = BenchConfig(**fields)
    torch.set_num_threads(1)
    with native.use_backend("c" if fastcount.available() else "torch"):
        print(f"CPU pass-1 kernel: {fastcount.info()} (pass 2: torch)")
    if not fastcount.available():
        print("the C kernel is not built (pip install -e .): only the torch kernels are timed")
        BACKENDS[:] = ["torch"]
    bench_dense(a.quick, a.repeat)
    bench_tokenizer(a.quick, a.repeat)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    state = ", ".join(f"{k}: {v / 2**20:.1f} MiB" for k, v in STATE_BYTES.items())
    print(f"engine accumulator memory: {state}")
    print(f"peak resident memory of this process: {rss:.2f} GiB (dense reference included)")
    bench_gpu(a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
