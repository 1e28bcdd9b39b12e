"""The tidy results table shared by every analysis, trainer and sweep.

One number per row. A unit of work (one checkpoint step, one training run, one experiment)
writes one Parquet shard atomically: a temp file in the same folder, then ``os.replace``, so a
killed job never leaves a half-written shard and a resumed job can skip finished ones.
Each run folder also holds ``manifest.json`` (argv, effective config, versions, git sha, times).

Conventions: ``layer`` is numbered as the papers number layers, from 1 (layer l is the l-th
transformer block; null for rows that belong to no layer); ``head`` counts from 0 within its
layer. ``chance``, ``chance_sd``, ``ceiling``, ``ceiling_half``, ``ci_low``, ``ci_high``,
``effect``, ``above_chance`` (the scale of a cell: its value with no relation between model and
statistics and that value's spread, the statistics against themselves corrected to the full
corpus and between two halves, an interval, the share of the way from chance to ceiling, a
one-sided test against chance; :mod:`pythia_probe.analysis.intervals`) and ``revision_status``
(whether the weights are the step they claim) are nullable: null where not computed, and shards
written before a column existed read with it null.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pythia_probe import __version__ as CODE_VERSION
from pythia_probe.errors import MismatchError, ResultsError
from pythia_probe.fileio import atomic_write, write_text

# column -> (arrow type, nullable)
SCHEMA: dict[str, tuple[pa.DataType, bool]] = {
    "model": (pa.string(), False),
    "step": (pa.int64(), True),
    "analysis": (pa.string(), False),
    "layer": (pa.int64(), True),
    "head": (pa.int64(), True),
    "metric": (pa.string(), False),
    "value": (pa.float64(), False),
    "n": (pa.int64(), True),
    "stats_id": (pa.string(), True),
    "dtype": (pa.string(), True),
    "code_version": (pa.string(), False),
    "run_id": (pa.string(), True),
    "settings": (pa.string(), True),  # run settings that vary within one run's table (k=v;...)
    "chance": (pa.float64(), True),  # the value with no relation between model and statistics
    "chance_sd": (pa.float64(), True),  # its standard deviation over relabelled statistics
    "ceiling": (pa.float64(), True),  # the statistics against themselves (full corpus, by SB)
    "ceiling_half": (pa.float64(), True),  # the same between two halves of the corpus
    "ci_low": (pa.float64(), True),  # an interval of the value over documents
    "ci_high": (pa.float64(), True),
    "effect": (pa.float64(), True),  # (value - chance) / (ceiling - chance)
    "above_chance": (pa.bool_(), True),  # value > chance: z > 1.96, unrelated weights flagged <= 5%
    "revision_status": (pa.string(), True),  # ok, duplicate or suspect (the revision ledger)
}
COLUMNS = list(SCHEMA)
ARROW_SCHEMA = pa.schema([pa.field(c, t, nullable=n) for c, (t, n) in SCHEMA.items()])
#: columns added after the first shards were written: an older shard reads with them null
LATER_COLUMNS = ("settings", "chance", "ceiling", "ci_low", "ci_high", "revision_status",
                 "chance_sd", "ceiling_half", "effect", "above_chance")
MANIFEST = "manifest.json"
#: tables beside the shards in a run folder: the summary (pythia_probe.summary), the ledger
NOT_SHARDS = ("summary.parquet", "revisions.parquet")
#: what identifies one cell of a table (one number per cell in one run)
CELL = ["model", "settings", "step", "analysis", "metric", "layer", "head"]
RUN_META = "pythia_probe.run"  # a shard's metadata key: its run's run_id and run_key
FILE = "_file"
LAYERS = "1-based: layer l is the l-th transformer block, as the papers number them"


def new_run_id() -> str:
    """A short unique id for one run: UTC time plus 6 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def make_rows(rows: Iterable[Mapping[str, Any]], **common: Any) -> pd.DataFrame:
    """Build a schema-conformant frame from row dicts; ``common`` fills every row.

    Missing nullable columns become null; ``code_version`` defaults to this package's version.
    """
    common = {"code_version": CODE_VERSION, **common}
    records = [{**common, **dict(r)} for r in rows]
    df = pd.DataFrame.from_records(records, columns=COLUMNS)
    return validate(_coerce(df))


def _coerce(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for col, (typ, _) in SCHEMA.items():
        if col not in df:
            df[col] = None
        if pa.types.is_integer(typ):
            df[col] = df[col].astype("Int64")
        elif pa.types.is_floating(typ):
            df[col] = df[col].astype("float64")
        elif pa.types.is_boolean(typ):
            df[col] = _booleans(df[col], col)
        else:
            df[col] = df[col].astype("string")
    return df[COLUMNS]


def _booleans(col: pd.Series, name: str) -> pd.Series:
    """A nullable boolean column; anything but True/False/null is one error naming it."""
    ok = col.map(lambda v: v is None or v is pd.NA or isinstance(v, (bool, np.bool_))
                 or (isinstance(v, float) and math.isnan(v)))
    if not ok.all():
        bad = col[~ok].iloc[0]
        raise ResultsError(f"column {name!r} holds {bad!r}: valid values are True, False or null")
    return col.map(lambda v: None if v is None or v is pd.NA or isinstance(v, float)
                   else bool(v)).astype("boolean")


def _check_columns(df: pd.DataFrame) -> None:
    missing = [c for c in COLUMNS if c not in df.columns]
    extra = [c for c in df.columns if c not in SCHEMA]
    if missing or extra:
        raise ResultsError(f"results columns wrong: missing {missing}, unexpected {extra}; "
                           f"valid columns are {COLUMNS}")


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check columns, types and required values; return ``df`` or raise ResultsError."""
    _check_columns(df)
    for col, (_, nullable) in SCHEMA.items():
        if not nullable and df[col].isna().any():
            raise ResultsError(f"column {col!r} must not be null ({int(df[col].isna().sum())} "
                               "null rows)")
    for col in ("value", "effect"):
        bad = df[col].map(lambda v: isinstance(v, float) and math.isinf(v))
        if bad.any():
            raise ResultsError(f"{int(bad.sum())} rows have an infinite {col}")
    if (df["chance_sd"].dropna() < 0).any():
        raise ResultsError("column 'chance_sd' has negative entries (a standard deviation is "
                           ">= 0)")
    for col in ("step", "layer", "head", "n"):
        neg = df[col].dropna() < 0
        if neg.any():
            raise ResultsError(f"column {col!r} has negative entries")
    both = df["ci_low"].notna() & df["ci_high"].notna()
    if (df.loc[both, "ci_low"] > df.loc[both, "ci_high"]).any():
        raise ResultsError("rows with ci_low > ci_high")
    return df


def write_shard(df: pd.DataFrame, path: str | os.PathLike, run: Mapping[str, str] | None = None
                ) -> Path:
    """Validate ``df`` and write it to ``path`` atomically (temp file + rename); ``run``: the
    identity of the run it belongs to (``run_id`` and ``run_key``, the manifest's content
    key), kept in the file's metadata with the digest of its rows, so a folder tells its own
    shards from another run's and an edited or damaged shard from a written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df = validate(_coerce(df))
    table = pa.Table.from_pandas(df, schema=ARROW_SCHEMA, preserve_index=False)
    if run is not None:
        table = table.replace_schema_metadata({RUN_META: json.dumps({**run,
                                                                     "rows": _digest(df)})})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp), table.nbytes)
    return path


def read_shard(path: str | os.PathLike) -> pd.DataFrame:
    """Read one shard written by :func:`write_shard`, with a clear error if unreadable."""
    return _read(path)[0]


def shard_run(path: str | os.PathLike) -> dict | None:
    """The run identity a shard was written with (None: written without one, or unreadable)."""
    try:
        meta = pq.read_schema(path).metadata or {}
        run = json.loads(meta[RUN_META.encode()])
    except (OSError, pa.ArrowInvalid, KeyError, ValueError):
        return None
    return run if isinstance(run, dict) else None


def _read(path) -> tuple[pd.DataFrame, dict | None]:
    try:
        table = pq.read_table(path)
        run = json.loads((table.schema.metadata or {}).get(RUN_META.encode(), b"null"))
    except (OSError, pa.ArrowInvalid, ValueError) as e:
        raise ResultsError(f"cannot read results shard {path}: {e}") from e
    df = table.to_pandas()
    for col in LATER_COLUMNS:  # shards written before the column existed
        if col not in df.columns:
            df[col] = None
    _check_columns(df)
    df, run = validate(_coerce(df)), run if isinstance(run, dict) else None
    if run is not None and run.get("rows") != _digest(df):
        raise ResultsError(f"results shard {path} was edited or damaged after it was written "
                           "(its rows do not match their digest); rerun the sweep to rescore it")
    return df, run


def _digest(df: pd.DataFrame) -> str:
    """sha256 of a shard's rows (their CSV text: every float in full)."""
    return hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()


def read_results(run_dir: str | os.PathLike) -> pd.DataFrame:
    """Concatenate every ``*.parquet`` shard under ``run_dir`` (recursively; a shard file: that
    one), validated; the
    tables a run folder holds beside its shards (:data:`NOT_SHARDS`) are not rows. A folder is
    one run's table: shards of runs with other settings (another ``run_key``) or cells held
    twice (a copy of a shard) are refused in one line naming the files."""
    root = Path(run_dir)
    if root.is_file():
        return read_shard(root)
    shards = sorted(p for p in root.rglob("*.parquet") if p.name not in NOT_SHARDS)
    if not shards:
        raise ResultsError(f"no *.parquet result shards under {run_dir}"
                           + ("" if root.is_dir() else ": no such folder"))
    read = [_read(p) for p in shards]
    _one_run(root, shards, [run for _, run in read])
    df = pd.concat([d.assign(**{FILE: str(p.relative_to(root))}) for p, (d, _) in
                    zip(shards, read, strict=True)], ignore_index=True)
    check_cells(df, f"{run_dir}", FILE)
    return df.drop(columns=FILE)


def named_files(files: list) -> str:
    """The first three of ``files`` and how many more."""
    return ", ".join(map(str, files[:3])) + (f" and {len(files) - 3} more" if len(files) > 3
                                              else "")


def _one_run(root: Path, shards: list[Path], runs: list[dict | None]) -> None:
    """Refuse shards of more than one run_key (the settings and statistics of a run)."""
    by_key: dict[str, list[Path]] = {}
    for path, run in zip(shards, runs, strict=True):
        if run is not None and run.get("run_key"):
            by_key.setdefault(run["run_key"], []).append(path.relative_to(root))
    if len(by_key) > 1:
        (key, mine), *others = sorted(by_key.items(), key=lambda kv: -len(kv[1]))
        where = "; ".join(f"run {k} ({named_files(files)})" for k, files in others)
        raise MismatchError(f"{root} holds the shards of {len(by_key)} runs with different "
                            f"settings: run {key} ({len(mine)} shards) and {where}; a folder "
                            "is one run's table: move the other run's shards out")


def check_cells(df: pd.DataFrame, where: str, files: str | None = None) -> None:
    """Refuse a table holding one cell (model, settings, step, analysis, metric, layer, head)
    more than once: two runs' rows, or a shard and its copy; ``files``: the column naming
    each row's file."""
    cell = [c for c in CELL if c in df]
    dup = df.duplicated(cell, keep=False)
    if not dup.any():
        return
    by = files or "run_id"
    named = sorted(set(df.loc[dup, by].astype(str))) if by in df else []
    raise MismatchError(f"{where}: {int(dup.sum() - df[dup].duplicated(cell).sum())} cells "
                        f"appear more than once, in {'files' if files else 'runs'} "
                        f"{named_files(named)}; a table is one run's: remove the copies (or "
                        "read each run's folder on its own)")


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions(names: Iterable[str] = ("torch", "transformers", "huggingface-hub",
                                             "datasets", "accelerate", "tokenizers", "numpy",
                                             "pandas", "pyarrow")) -> dict[str, str | None]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def write_manifest(run_dir: str | os.PathLike, config: Mapping[str, Any], *,
                   argv: list[str] | None = None, started: datetime | None = None,
                   run_id: str | None = None, extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``run_dir/manifest.json`` atomically. Call again at the end to set ``ended``."""
    now = datetime.now(timezone.utc)
    manifest = {
        "run_id": run_id,
        "argv": list(sys.argv if argv is None else argv),
        "config": _jsonable(dict(config)),
        "code_version": CODE_VERSION,
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "started": (started or now).isoformat(),
        "ended": now.isoformat(),
        **_jsonable(dict(extra or {})),
    }
    return write_text(Path(run_dir) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=False))


def read_manifest(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``run_dir/manifest.json``, checked to be a manifest: a JSON object whose ``config`` is an
    object and ``run_id`` a string (or null); anything else is one error naming the file."""
    path = Path(run_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ResultsError(f"no {MANIFEST} in {run_dir}") from e
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ResultsError(f"{path} is not valid JSON: {e}; delete it (or the folder) to start "
                           "a new run") from e
    problem = _manifest_problem(manifest)
    if problem:
        raise ResultsError(f"{path} is not a run manifest ({problem}); delete it (or choose "
                           "another folder) to start a new run")
    return manifest


def _manifest_problem(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    if not isinstance(manifest.get("config", {}), dict):
        return "'config' is not an object"
    if not isinstance(manifest.get("run_id"), (str, type(None))):
        return "'run_id' is not a string"
    return None
