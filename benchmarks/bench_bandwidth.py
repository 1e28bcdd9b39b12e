"""Bandwidth of the checkpoint loader against a plain download of the same bytes, measured in one
run against a throttled loopback hub (the hub's ``--bandwidth`` caps each transfer, as a link
would; multi-GB checkpoints do not fit this machine's time, so the sizes below run in about a
minute, and the ratios are what carries over).

- plain: one ``httpx2`` stream of every file the loader fetches (config.json and the weights,
  following the hub's redirect to its CDN), bytes thrown away, one file after another;
- loader alone: ``CheckpointSource.resolve`` + ``stream`` (HEAD, GET, sha256 check, torch.load,
  eviction), no scoring;
- loader + scoring, without prefetch (``prefetch=0``: download, then score) and with prefetch
  (``prefetch=1``: the next checkpoint downloads while this one is scored). Scoring is a
  CPU-bound stand-in: float32 matmuls on one thread (GIL released), calibrated to
  ``--work-fraction`` x one checkpoint's plain download time.

Each line prints the bandwidth reached (checkpoint bytes / wall time) and its ratio to the plain
download. With perfect overlap and work below the download time, "prefetch" reaches 1.0 and "no
prefetch" 1 / (1 + work fraction).

    python benchmarks/bench_bandwidth.py                 # 8 x ~42 MB at 40 MB/s, ~1-2 min
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_checkpoints import free_port, make_work, start_hub

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError

REPO = "EleutherAI/pythia-bandwidth"
PROG = "python benchmarks/bench_bandwidth.py"


@dataclass(frozen=True)
class BandwidthConfig:
    """What the loader reaches relative to a plain download, with and without prefetch."""

    n_steps: int = 8
    """Checkpoints streamed."""
    mb_per_s: float = 40.0
    """Hub bandwidth per transfer, MB/s (the spec's estimate for a full sweep)."""
    d_model: int = 384
    """Width of the GPT-NeoX (with --vocab: about 42 MB per checkpoint at the defaults)."""
    vocab: int = 16384
    """Vocabulary of the GPT-NeoX."""
    work_fraction: float = 0.8
    """Scoring time per checkpoint, as a fraction of its plain download time."""
    repeats: int = 1
    """Runs of each measurement; the fastest is reported."""

    def __post_init__(self):
        if min(self.n_steps, self.d_model, self.vocab, self.repeats) < 1:
            raise BadInputError("--n-steps, --d-model, --vocab and --repeats must be >= 1")
        if self.mb_per_s <= 0 or self.work_fraction < 0:
            raise BadInputError(f"--mb-per-s must be > 0 and --work-fraction >= 0; got "
                                f"{self.mb_per_s}, {self.work_fraction}")


def plain_download(endpoint: str, steps: list[int], names: list[str]) -> tuple[float, int]:
    """Seconds and bytes of one httpx2 stream per file, to nowhere."""
    import httpx2

    t0, nbytes = time.perf_counter(), 0
    with httpx2.Client(follow_redirects=True, timeout=60) as client:
        for s in steps:
            for name in names:
                with client.stream("GET", f"{endpoint}/{REPO}/resolve/step{s}/{name}") as r:
                    r.raise_for_status()
                    for chunk in r.iter_bytes():
                        nbytes += len(chunk)
    return time.perf_counter() - t0, nbytes


def loader(cache: Path, steps: list[int], prefetch: int, work=None) -> float:
    """Seconds to resolve and stream every checkpoint (scoring each with ``work``)."""
    from pythia_probe.hub.checkpoints import CheckpointSource

    t0 = time.perf_counter()
    src = CheckpointSource(REPO, cache_dir=cache)
    for _ in src.stream(src.resolve(steps), prefetch=prefetch):
        if work is not None:
            work()
    wall = time.perf_counter() - t0
    shutil.rmtree(cache, ignore_errors=True)
    return wall


def best(repeats: int, fn) -> float:
    return min(fn() for _ in range(repeats))


def build(root: Path, cfg: BandwidthConfig) -> tuple[list[int], list[str], int]:
    from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

    steps = [1000 * (i + 1) for i in range(cfg.n_steps)]
    model = tiny_config(vocab_size=cfg.vocab, hidden_size=cfg.d_model, num_hidden_layers=4,
                        num_attention_heads=8, intermediate_size=4 * cfg.d_model)
    repo = build_pythia_like_repo(root, REPO, steps=steps, config=model,
                                  layouts={s: ("bin", 1) for s in steps}, with_main=False)
    names = ["config.json", "pytorch_model.bin"]
    size = sum((repo / f"step{steps[0]}" / n).stat().st_size for n in names)
    return steps, names, size


def report(cfg: BandwidthConfig, size: int, rows: list[tuple[str, float]], t_plain: float,
           work_s: float) -> None:
    total = size * cfg.n_steps
    fraction = work_s / (t_plain / cfg.n_steps)
    print(f"{cfg.n_steps} checkpoints x {size / 1e6:.1f} MB = {total / 1e6:.0f} MB over a loopback "
          f"hub at {cfg.mb_per_s:g} MB/s per transfer; scoring {work_s:.2f} s per checkpoint "
          f"({fraction:.2f} x its plain download, asked {cfg.work_fraction:g}), torch on 1 thread")
    print(f"{'':<44}{'wall s':>8}{'MB/s':>8}{'ratio to plain':>16}")
    for name, t in [("plain download (httpx2 stream, discarded)", t_plain), *rows]:
        print(f"{name:<44}{t:>8.2f}{total / t / 1e6:>8.1f}{t_plain / t:>16.3f}")
    for name, bound in (("bound, no overlap: download + scoring", t_plain + work_s * cfg.n_steps),
                        ("bound, full overlap: max(download, scoring)",
                         max(t_plain, work_s * cfg.n_steps))):
        print(f"{name:<44}{bound:>8.2f}{total / bound / 1e6:>8.1f}{t_plain / bound:>16.3f}")


def main(argv: list[str] | None = None) -> int:
    [fields] = parse_configs([BandwidthConfig], argv, PROG, __doc__)
    cfg = BandwidthConfig(**fields)
    port = free_port()
    os.environ["HF_ENDPOINT"] = endpoint = f"http://127.0.0.1:{port}"  # before huggingface_hub
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import torch

    torch.set_num_threads(1)  # scoring on one core, downloads and hashing on the other
    tmp = Path(tempfile.mkdtemp(prefix="bench_bw_"))
    try:
        steps, names, size = build(tmp / "hub", cfg)
        hub = start_hub(tmp / "hub", port, cfg.mb_per_s * 1e6)
        try:
            plain_download(endpoint, steps[:1], names)  # warm: the hub hashes its files once
            t_plain = best(cfg.repeats, lambda: plain_download(endpoint, steps, names)[0])
            work = make_work(cfg.work_fraction * t_plain / cfg.n_steps)
            rows = [(label, best(cfg.repeats, lambda p=p, w=w: loader(tmp / "c", steps, p, w)))
                    for label, p, w in (("loader alone (prefetch 1, no scoring)", 1, None),
                                        ("loader + scoring, no prefetch", 0, work),
                                        ("loader + scoring, prefetch 1", 1, work))]
        finally:
            hub.terminate()
            hub.wait()
        n_work = 2 * cfg.repeats * cfg.n_steps
        report(cfg, size, rows, t_plain, work.spent[0] / n_work)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, PROG))
