"""``python -m pythia_probe.hub.revisions`` (and ``pythia-probe revisions``): write the
revision ledger of a model's steps. The ledger itself is :mod:`pythia_probe.hub.revision_ledger`;
every name of it is also ``pythia_probe.hub.revisions.NAME`` (``ledger``, ``write_ledger``,
``read_ledger``, ``COLUMNS``, ...), loaded on first use, so that ``--help`` imports no pandas.

    python -m pythia_probe.hub.revisions --model EleutherAI/pythia-1.4b --steps all --out r.parquet
"""

from __future__ import annotations

from dataclasses import dataclass

from pythia_probe.cli import parse_configs, run_main
from pythia_probe.errors import BadInputError
from pythia_probe.fileio import check_writable
from pythia_probe.lazy import forwarding

PROG = "python -m pythia_probe.hub.revisions"


@dataclass(frozen=True)
class RevisionsConfig:
    """Write the revision ledger of a model's steps (which branches hold duplicate or final
    weights) from hub metadata alone: no weight file is downloaded."""

    model: str
    """Hub id (ORG/NAME), a folder of step*/ checkpoints, or a hub-style cache folder."""
    out: str
    """The ledger to write (.parquet)."""
    steps: str = "all"
    """Steps to list: 1000-143000, 1000-143000:5000, 0,1,2,4,512, early, all, log."""
    cache_dir: str | None = None
    """Checkpoint cache read offline (HF_HUB_OFFLINE=1); default the tool's own."""

    def __post_init__(self):
        if not str(self.model).strip():
            raise BadInputError("--model is empty; give a hub id or a folder")
        if not str(self.out).endswith(".parquet"):
            raise BadInputError(f"--out {self.out!r}: the ledger is a .parquet file")
        if not str(self.steps).strip():
            raise BadInputError("--steps is empty; e.g. all, early, 1000-143000:5000")


def main(argv: list[str] | None = None) -> int:
    """The command: parse, build the ledger, write it, print the counts."""
    [fields] = parse_configs([RevisionsConfig], argv, PROG)
    cfg = RevisionsConfig(**fields)
    check_writable(cfg.out, is_file=True)
    from pythia_probe.hub.checkpoints import CheckpointSource  # deferred: --help
    from pythia_probe.hub.revision_ledger import ledger, summary, write_ledger  # deferred: --help
    df = ledger(CheckpointSource(cfg.model, cache_dir=cfg.cache_dir), cfg.steps)
    print(f"wrote {write_ledger(df, cfg.out)}\n{summary(df)}")
    return 0


__getattr__ = forwarding(__name__, "pythia_probe.hub.revision_ledger")

if __name__ == "__main__":
    raise SystemExit(run_main(main, PROG))
