"""The revision ledger: does each checkpoint branch hold the weights its name says? (The
command and the module users import, ``pythia_probe.hub.revisions``, reads every name here.)

Pythia's hub branches do not always: step0 == step1 (== step2) in every size (pythia#83,
#198), 86 of pythia-2.8b's 154 branches serve final-era weights (#205), pythia-12b steps serve
the final model's first shard (#206). The ledger finds these from hub metadata alone (refs and
tree listings: sizes and LFS sha256), before any weight is downloaded::

    from pythia_probe.hub.revisions import ledger, write_ledger
    df = ledger("EleutherAI/pythia-1.4b", "0,1,2,1000-143000")  # nothing downloaded
    write_ledger(df, "out/revisions.parquet")

    python -m pythia_probe.hub.revisions --model EleutherAI/pythia-1.4b --steps all --out r.parquet

One row per asked step, columns :data:`COLUMNS`:

- ``step``, ``revision`` (the branch), ``commit`` (40 hex; null for local folders);
- ``weights_sha256``: sha256 of the lines ``"<file> <sha256>"`` of the revision's weight files,
  sorted by file name (the hub-listed sha256; local folders: the files hashed here; a weight
  file the hub lists without an LFS sha256 enters as ``git-blob:<id>``);
- ``same_as``: the earliest other asked step with the same ``weights_sha256``, or null;
- ``status`` and ``reason`` (in words): ``duplicate`` when the step is byte-identical to an
  earlier asked step (the earliest one stays ``ok``: step0 is ok, step1 its duplicate);
  ``suspect`` when the step is not the final one and its weights, or any one of its weight
  files, equal the final model's (``main``, all of its weight files, and the last step the
  model has), or when one of its files equals a file of another asked step it is not wholly
  identical to; ``suspect`` wins over ``duplicate`` (``same_as`` still says which); else ``ok``.

Duplicates are looked for among the asked steps only (listing every branch would cost one tree
call each); the final model is always listed. Nothing else is asked about: one refs call, one
tree call per asked step, ``main`` and the last step. Trust bytes over listings: a file whose
listed sha256 another file shares (the grounds of a ``duplicate`` or ``suspect``) is confirmed
against what the hub serves (the ``X-Linked-Etag`` of a HEAD; offline, the cached copy
hashed) before the verdict is given; a disagreement is refused naming the file.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pythia_probe.errors import CorruptFileError, HubNotFoundError
from pythia_probe.fileio import atomic_write
from pythia_probe.hub.checkpoints import CheckpointSource, FileInfo, Revision, confirm_shared
from pythia_probe.hub.steps import parse_steps
from pythia_probe.hub.weights import WEIGHT_SUFFIXES, weights_digest

COLUMNS = ("step", "revision", "commit", "weights_sha256", "same_as", "status", "reason")
STATUSES = ("ok", "duplicate", "suspect")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Weights:
    """One revision's weight files as identities: ``files`` {name: sha256 or git-blob:id}."""

    step: int
    revision: str
    commit: str | None
    files: dict[str, str]

    @property
    def digest(self) -> str:
        return weights_digest(self.files)


# ---- what the metadata says -------------------------------------------------------------------

def weight_files(rev: Revision, every_format: bool = False) -> list[FileInfo]:
    """``rev``'s weight files (the layout's; ``every_format``: all ``.bin`` and
    ``.safetensors`` files at the top, as on ``main``)."""
    return ([f for f in rev.files if f.path.endswith(WEIGHT_SUFFIXES) and "/" not in f.path]
            if every_format else list(rev.weight_files))


def weights_of(source: CheckpointSource, rev: Revision, every_format: bool = False) -> Weights:
    """The identities of ``rev``'s weight files (:func:`weight_files`)."""
    return Weights(rev.step, rev.branch, rev.commit, {
        f.path: source.file_identity(rev, f) for f in weight_files(rev, every_format)})


def final_model(source: CheckpointSource,
                revs: list[Revision]) -> tuple[int, list[tuple[Revision, bool]]]:
    """``(final step, its references as (revision, every format))``: ``main`` (every format)
    and the last step the model has, as far as the source has and serves them. Nothing else is
    asked about: a hub that lists a last branch it does not serve (404) leaves ``main`` alone
    as the reference, with a warning."""
    last = max(source.steps() or [r.step for r in revs])
    asked = {r.step: r for r in revs}
    refs = [(ref, every) for ref, every in (
        (_served("main", lambda: source.resolve_branch("main", last)), True),
        (asked.get(last) or _served(f"step{last}", lambda: source.resolve([last])[0]), False))
        if ref]
    return last, refs


def _served(branch: str, resolve) -> Revision | None:
    try:
        return resolve()
    except HubNotFoundError as err:
        log.warning("the hub lists the branch %s of the final model but does not serve it (%s); "
                    "the ledger compares with the final model's other reference", branch,
                    str(err).split(": ", 1)[0])
        return None


# ---- the rules --------------------------------------------------------------------------------
def _final_reason(w: Weights, final: set[str], label: str) -> str | None:
    shared = sorted(name for name, i in w.files.items() if i in final)
    if not shared:
        return None
    if len(shared) == len(w.files):
        return (f"its weights are byte-identical to the final model's ({label}): the branch "
                f"serves final weights, not step {w.step}'s (cf. pythia#205)")
    verb = "is" if len(shared) == 1 else "are"
    return (f"{', '.join(shared)} {verb} byte-identical to the final model's ({label}) while "
            "its other weight files differ (cf. pythia#206)")


def _shared_reason(w: Weights, table: list[Weights], final_step: int) -> str | None:
    by_file = defaultdict(set)
    for other in table:
        if other.step not in (w.step, final_step) and other.digest != w.digest:
            for name, i in other.files.items():
                by_file[i].add((other.step, name))
    hits = sorted((name, step) for name, i in w.files.items() for step, _ in by_file.get(i, ()))
    if not hits:
        return None
    said = ", ".join(f"{name} = step{step}'s" for name, step in hits)
    return f"{said}, a step whose other weight files differ: a mixed-up branch"


def classify(table: list[Weights], final_step: int, final: list[Weights]) -> pd.DataFrame:
    """The ledger rows for ``table`` (one per asked step) against the final model."""
    final_ids = {i for ref in final for i in ref.files.values()}
    label = " / ".join(dict.fromkeys(ref.revision for ref in final)) or "unknown"
    first: dict[str, int] = {}
    rows = []
    for w in sorted(table, key=lambda x: x.step):
        same_as = first.setdefault(w.digest, w.step)
        same_as = None if same_as == w.step else same_as
        suspect = [] if w.step == final_step else [
            r for r in (_final_reason(w, final_ids, label), _shared_reason(w, table, final_step))
            if r]
        dup = ([] if same_as is None else
               [f"byte-identical to step{same_as} (the same weights_sha256)"])
        status = "suspect" if suspect else "duplicate" if dup else "ok"
        reason = "; ".join(suspect + dup) or ("the final step" if w.step == final_step else
                                              "weights unlike every other asked step's")
        rows.append({"step": w.step, "revision": w.revision, "commit": w.commit,
                     "weights_sha256": w.digest, "same_as": same_as, "status": status,
                     "reason": reason})
    return validate(pd.DataFrame(rows, columns=list(COLUMNS)))


def ledger(source: CheckpointSource | str | os.PathLike,
           steps: Iterable[int] | str) -> pd.DataFrame:
    """The revision ledger of ``steps`` (a list, or a ``--steps`` spec) of ``source`` (a
    :class:`~pythia_probe.hub.checkpoints.CheckpointSource`, a hub id or a local folder), from
    metadata alone: no weight file is downloaded."""
    if not isinstance(source, CheckpointSource):
        source = CheckpointSource(source)
    if isinstance(steps, str):
        steps = parse_steps(steps, source.steps())
    revs = source.resolve(sorted(set(steps)))
    final_step, final = final_model(source, revs)
    confirm_shared([(source, r, f) for r, every in [(r, False) for r in revs] + final
                    for f in weight_files(r, every)])
    return classify([weights_of(source, r) for r in revs], final_step,
                    [weights_of(source, r, every) for r, every in final])


# ---- the table on disk ------------------------------------------------------------------------
def validate(df: pd.DataFrame, where: str = "the revision ledger") -> pd.DataFrame:
    """``df`` with the ledger's columns and types, checked (a wrong one names the column)."""
    if list(df.columns) not in (list(COLUMNS), ["model", *COLUMNS]):  # a sweep's: by model
        raise CorruptFileError(f"{where} has columns {list(df.columns)}, not {list(COLUMNS)}")
    df = df.astype({"step": "int64", "same_as": "Int64"})
    bad = sorted(set(df["status"]) - set(STATUSES))
    commits = df["commit"].dropna()
    if bad or not commits.map(lambda c: isinstance(c, str) and len(c) == 40).all():
        raise CorruptFileError(f"{where}: statuses {bad} (valid: {STATUSES}) or a commit that "
                               "is not 40 hex digits")
    if df.duplicated([c for c in ("model", "step") if c in df]).any():
        raise CorruptFileError(f"{where} has more than one row for a step")
    return df.reset_index(drop=True)


def write_ledger(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the ledger to a Parquet file atomically (through :mod:`pythia_probe.fileio`)."""
    table = pa.Table.from_pandas(validate(df), preserve_index=False)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp), table.nbytes)


def read_ledger(path: str | os.PathLike) -> pd.DataFrame:
    """A ledger written by :func:`write_ledger`, checked."""
    return validate(pd.read_parquet(path), str(path))


def summary(df: pd.DataFrame) -> str:
    """``"N steps: a ok, b duplicate, c suspect"`` and one line per step that is not ok."""
    counts = df["status"].value_counts()
    head = f"{len(df)} steps: " + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in STATUSES)
    return "\n".join([head] + [f"  step{r.step}: {r.status}: {r.reason}"
                               for r in df.itertuples() if r.status != "ok"])
