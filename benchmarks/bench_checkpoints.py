"""Streaming 10 checkpoints from a throttled loopback hub: ours vs from_pretrained one by one.

Measures, in one run:
- pure download time: hf_hub_download of every file of every step, one after another, no work;
- ours: CheckpointSource.stream(prefetch=1, max_disk) with a fixed amount of work per step
  (resolve included); wall time / pure download time (target <= 1.15) and peak disk / checkpoint
  size (target <= prefetch + 1);
- baseline: GPTNeoXForCausalLM.from_pretrained(revision="step{n}") then the same work, one step
  after another (what TransformerLens / lm-checkpoints do), nothing evicted.

    python benchmarks/bench_checkpoints.py            # ~1 min
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError

REPO = "EleutherAI/pythia-bench"
PROG = "python benchmarks/bench_checkpoints.py"


@dataclass(frozen=True)
class BenchConfig:
    """Stream checkpoints from a throttled loopback hub: ours vs from_pretrained one by one."""

    n_steps: int = 10
    """Checkpoints streamed."""
    mb_per_s: float = 40.0
    """Hub bandwidth, MB/s."""
    d_model: int = 256
    """Width of the tiny GPT-NeoX (sets the checkpoint size with --vocab)."""
    vocab: int = 8192
    """Vocabulary of the tiny GPT-NeoX."""
    work_fraction: float = 0.5
    """Work per step as a fraction of one step's download time."""
    prefetch: int = 1
    """Checkpoints downloaded ahead of the one being worked on."""
    work: Literal["cpu", "sleep"] = "cpu"
    """cpu (matmuls, GIL released) or sleep (immune to other jobs on the cores)."""

    def __post_init__(self):
        for name in ("n_steps", "d_model", "vocab"):
            if getattr(self, name) < 1:
                raise BadInputError(f"--{name.replace('_', '-')} must be >= 1, got "
                                    f"{getattr(self, name)}")
        if self.mb_per_s <= 0 or self.work_fraction < 0 or self.prefetch < 0:
            raise BadInputError("--mb-per-s must be > 0, --work-fraction and --prefetch >= 0; "
                                f"got {self.mb_per_s}, {self.work_fraction}, {self.prefetch}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeakDisk:
    """Samples the bytes under a folder in a thread; ``.peak`` after ``stop()``."""

    def __init__(self, root: Path, reserved=None):
        from pythia_probe.hub.checkpoints import dir_bytes

        self.root, self.peak, self._stop = root, 0, threading.Event()
        self.reserved, self.peak_reserved = reserved, 0
        self._dir_bytes = dir_bytes
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._dir_bytes(self.root))
            if self.reserved is not None:
                self.peak_reserved = max(self.peak_reserved, self.reserved())
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._dir_bytes(self.root))
        return self.peak


def make_work(seconds: float, kind: str = "cpu"):
    """A fixed amount of work per step: CPU matmuls (GIL released) calibrated to ``seconds``
    now, or a plain ``sleep(seconds)`` (immune to other processes sharing the cores)."""
    import torch

    if kind == "sleep":
        return _timed(lambda: time.sleep(seconds))

    a = torch.randn(1024, 1024) / 32  # big ops, like real analysis batches (few GIL handoffs)

    def run(n: int) -> None:
        x = a
        for _ in range(n):
            x = torch.tanh(x @ a)

    run(4)  # warm-up (thread pools, allocator)
    n = 2
    while True:  # double until a run is long enough to time, then scale to the target
        t0 = time.perf_counter()
        run(n)
        dt = time.perf_counter() - t0
        if dt > 0.25 or dt > seconds:
            break
        n *= 2
    n = max(1, round(n * seconds / dt))
    return _timed(lambda: run(n))


def _timed(fn):
    spent = [0.0]

    def timed() -> None:
        t0 = time.perf_counter()
        fn()
        spent[0] += time.perf_counter() - t0

    timed.spent = spent
    return timed


def start_hub(root: Path, port: int, bandwidth: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "pythia_probe.testing.hub", str(root), "--port",
                             str(port), "--bandwidth", str(bandwidth)], stdout=subprocess.PIPE)
    proc.stdout.readline()  # endpoint printed once listening
    return proc


def pure_download(steps: list[int], cache: Path) -> float:
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi()
    t0 = time.perf_counter()
    for s in steps:
        for f in api.list_repo_tree(REPO, revision=f"step{s}"):
            hf_hub_download(REPO, f.path, revision=f"step{s}", cache_dir=cache)
    return time.perf_counter() - t0


def run_ours(steps: list[int], cache: Path, work, prefetch: int, max_disk: float):
    from pythia_probe.hub.checkpoints import CheckpointSource

    t0 = time.perf_counter()
    src = CheckpointSource(REPO, cache_dir=cache)
    disk = PeakDisk(cache, reserved=src.live_bytes)
    for _rev, _tensors, _config in src.stream(src.resolve(steps), prefetch=prefetch,
                                              max_disk=max_disk):
        work()
    wall = time.perf_counter() - t0
    disk.stop()
    return wall, disk.peak, disk.peak_reserved


def run_baseline(steps: list[int], cache: Path, work) -> tuple[float, int]:
    from transformers import GPTNeoXForCausalLM

    disk = PeakDisk(cache)
    t0 = time.perf_counter()
    for s in steps:
        model = GPTNeoXForCausalLM.from_pretrained(REPO, revision=f"step{s}", cache_dir=cache)
        work()
        del model
    return time.perf_counter() - t0, disk.stop()


def main(argv: list[str] | None = None) -> int:
    [fields] = parse_configs([BenchConfig], argv, PROG, __doc__)
    args = BenchConfig(**fields)
    port = free_port()
    os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"  # before huggingface_hub is imported
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from transformers.utils import logging as hf_logging

    from pythia_probe.testing.repos import build_pythia_like_repo, tiny_config

    hf_logging.set_verbosity_error()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ckpt_"))
    steps = [1000 * (i + 1) for i in range(args.n_steps)]
    cfg = tiny_config(vocab_size=args.vocab, hidden_size=args.d_model, num_hidden_layers=4,
                      num_attention_heads=8, intermediate_size=4 * args.d_model)
    repo = build_pythia_like_repo(tmp / "hub", REPO, steps=steps, config=cfg,
                                  layouts={s: ("bin", 1) for s in steps}, with_main=False)
    ckpt = sum(p.stat().st_size for p in (repo / f"step{steps[0]}").iterdir())
    hub = start_hub(tmp / "hub", port, args.mb_per_s * 1e6)
    try:
        t_dl = pure_download(steps, tmp / "c_dl")
        work = make_work(args.work_fraction * t_dl / len(steps), args.work)
        max_disk = (args.prefetch + 1) * ckpt * 1.02
        t_ours, peak_ours, reserved = run_ours(steps, tmp / "c_ours", work, args.prefetch, max_disk)
        w_ours = work.spent[0]
        t_base, peak_base = run_baseline(steps, tmp / "c_base", work)
        w_base = work.spent[0] - w_ours
    finally:
        hub.terminate()
        hub.wait()
        shutil.rmtree(tmp, ignore_errors=True)  # the repo and the three caches
    print(f"{len(steps)} steps, checkpoint {ckpt / 1e6:.2f} MB, hub {args.mb_per_s:.0f} MB/s, "
          f"prefetch {args.prefetch}, work {args.work} "
          f"{args.work_fraction:.2f} x one step's download")
    print(f"pure download (no work): {t_dl:.2f} s")
    print(f"{'method':<36}{'wall s':>8}{'work s':>8}{'wall/download':>15}{'peak disk MB':>14}"
          f"{'peak/ckpt':>11}")
    for name, t, w, peak in (("ours: stream(prefetch, max_disk)", t_ours, w_ours, peak_ours),
                             ("baseline: from_pretrained(revision)", t_base, w_base, peak_base)):
        print(f"{name:<36}{t:>8.2f}{w:>8.2f}{t / t_dl:>15.3f}{peak / 1e6:>14.2f}"
              f"{peak / ckpt:>11.2f}")
    print(f"ours: peak bytes reserved by the loader (files being written or live) "
          f"{reserved / 1e6:.2f} MB = {reserved / ckpt:.2f} checkpoints")
    print(f"targets: ours wall/download <= 1.15 -> {t_ours / t_dl:.3f}; "
          f"ours peak/ckpt <= {args.prefetch + 1} -> {peak_ours / ckpt:.2f}; "
          f"baseline/ours wall = {t_base / t_ours:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
