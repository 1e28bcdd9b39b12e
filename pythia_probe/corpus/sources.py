"""Document sources behind one interface: a list of `Shard`s, each yielding document strings.

source:
- "builtin": generated TinyStories-style stories (pythia_probe.builtin_corpus), deterministic
  by seed; options n_stories (20000), seed (0), stories_per_shard (1000), length, min_tokens,
  p_topic (see builtin_corpus.story).
- a local path: a .txt file (TinyStories format: stories separated by "<|endoftext|>" lines;
  a file without any separator is cut at blank lines, or as ``doc_split`` says),
  a .jsonl file (one JSON object per line, text in `text_field`), a .parquet file (column
  `text_field`, read with the `datasets` parquet builder, exactly as hub files are), a directory
  (every such file below it, sorted; one shard each), or a glob of such files.
- a hub dataset id ("org/name"): its .parquet files for `split` (listed with huggingface_hub at
  run time, pinned to the branch's commit; option data_dir limits them to one folder, revision
  picks a branch), or an "hf://datasets/org/name[@rev]/path/*.parquet" glob. Each file is one
  shard. A shard is downloaded when it is read (resumable, every hub call under the retry
  policy of :mod:`pythia_probe.hub.io`), checked against the hub's sha256 (a mismatch is fetched
  once more, then reported naming the file), read with datasets.load_dataset("parquet",
  streaming=True) like a local file, and deleted: the tool's dataset cache
  (``hubio.tool_cache("datasets")``) holds at most the shards being read.

Every error a user can fix is a :class:`~pythia_probe.errors.UserError` naming the file and
what is valid (a missing text field, a field that is not text, a corrupt or unreadable file).

"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import quote, unquote

from huggingface_hub import HfApi, HfFileSystem

from pythia_probe import builtin_corpus
from pythia_probe.errors import (
    BadInputError,
    CorruptFileError,
    HubError,
    MissingFileError,
    UserError,
)
from pythia_probe.fileio import sha256_file
from pythia_probe.hub import io as hubio
from pythia_probe.hub.cache import HubCache
from pythia_probe.hub.weights import FileInfo, file_matches

SEPARATOR = "<|endoftext|>"
FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
VALID_SOURCES = ("'builtin', a .txt (<|endoftext|>-separated) / .jsonl / .parquet file, a "
                 "directory or glob of those, a hub dataset id 'org/name', or an "
                 "'hf://datasets/org/name/...parquet' path or glob")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HF_PATH = re.compile(r"hf://datasets/([^/@]+/[^/@]+)(?:@([^/]+))?/(.+)")
_SPLIT_WORDS = {"train": "train", "training": "train", "validation": "validation",
                "valid": "validation", "val": "validation", "dev": "validation", "test": "test"}


@dataclass(frozen=True)
class Shard:
    """One unit of a corpus: `name` is a stable id (for checkpointing), `documents()` streams
    its documents in order. Picklable, so shards can be handed to worker processes."""

    name: str
    reader: Callable[[], Iterator[str]] = field(repr=False, compare=False)
    content: Callable[[], dict] | None = field(default=None, repr=False, compare=False)

    def documents(self) -> Iterator[str]:
        return self.reader()

    def fingerprint(self) -> dict:
        """What the shard holds, so a resumed job notices a changed input: size and sha256 of
        a local file; the hub's size and sha256 of a hub file (at the pinned commit); the
        generator settings (in ``name``) of a builtin shard."""
        return {"name": self.name, **(self.content() if self.content is not None else {})}


def content_id(fingerprint: dict) -> dict:
    """The part of a shard fingerprint that is its content, never where it lies: a file's or
    hub file's size and sha256 without its name (a path); a builtin shard's settings."""
    if "sha256" in fingerprint:
        return {k: v for k, v in fingerprint.items() if k != "name"}
    return dict(fingerprint)


def content_digest(fingerprint: dict) -> str:
    """sha256 (hex) of :func:`content_id`: the same bytes under another path give the same."""
    blob = json.dumps(content_id(fingerprint), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def file_fingerprint(path: str | Path) -> dict:
    """Size and sha256 of a local file (its modification time is no part of its content)."""
    return {"size": Path(path).stat().st_size, "sha256": _file_sha256(Path(path))}


_HASHED: dict[str, tuple[tuple, str]] = {}
RACY_NS = 2_000_000_000
"""A memoised hash is trusted only for a file last modified this long before it was hashed
(git's racy-timestamp rule: a rewrite within the filesystem's timestamp resolution could keep
size, mtime and inode)."""


def _file_sha256(path: Path) -> str:
    """sha256 of a file, memoised in this process while its stat is unchanged."""
    st = path.stat()
    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    real = str(path.resolve())
    hit = _HASHED.get(real)
    if hit is not None and hit[0] == key:
        return hit[1]
    started = time.time_ns()
    digest = sha256_file(path)
    if st.st_mtime_ns < started - RACY_NS and st.st_ctime_ns < started - RACY_NS:
        _HASHED[real] = (key, digest)
    return digest


# ---------------------------------------------------------------- readers
def _builtin_docs(start: int, stop: int, seed: int, length: int, min_tokens: int,
                  p_topic: float) -> Iterator[str]:
    for i in range(start, stop):
        yield builtin_corpus.story(i, seed, length=length, min_tokens=min_tokens,
                                   p_topic=p_topic)


def _txt_docs(path: str, doc_split: str = "auto") -> Iterator[str]:
    """Documents of a .txt file by ``doc_split`` (see :data:`DOC_SPLITS`)."""
    rule = doc_split
    if rule == "auto":
        rule = "endoftext" if _holds_separator(path) else "blank-line"
    try:
        with open(path, encoding="utf-8") as f:
            yield from _SPLITTERS[rule](f)
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"{path} is not valid UTF-8 text ({e}); a .txt corpus must be "
                               "UTF-8") from e


def _holds_separator(path: str) -> bool:
    """True when the file holds an <|endoftext|> separator anywhere (read in 4 MiB blocks)."""
    tail, needle = b"", SEPARATOR.encode()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            if needle in tail + block:
                return True
            tail = block[-len(needle):]
    return False


def _split_endoftext(lines) -> Iterator[str]:
    buf: list[str] = []
    for line in lines:
        if SEPARATOR not in line:
            buf.append(line)
            continue
        pieces = line.split(SEPARATOR)
        for piece in pieces[:-1]:
            doc = ("".join(buf) + piece).strip()
            buf = []
            if doc:
                yield doc
        buf = [pieces[-1]]
    doc = "".join(buf).strip()
    if doc:
        yield doc


def _split_blank_lines(lines) -> Iterator[str]:
    buf: list[str] = []
    for line in lines:
        if line.strip():
            buf.append(line)
            continue
        if buf:
            yield "".join(buf).strip()
            buf = []
    if buf:
        yield "".join(buf).strip()


def _split_lines(lines) -> Iterator[str]:
    for line in lines:
        if line.strip():
            yield line.strip()


def _whole(lines) -> Iterator[str]:
    doc = "".join(lines).strip()
    if doc:
        yield doc


_SPLITTERS = {"endoftext": _split_endoftext, "blank-line": _split_blank_lines,
              "line": _split_lines, "whole": _whole}
DOC_SPLITS = ("auto", *_SPLITTERS)
"""How a .txt file is cut into documents: 'endoftext' (TinyStories: <|endoftext|> between
documents), 'blank-line' (paragraphs: one or more empty lines between documents), 'line' (each
non-empty line), 'whole' (the file is one document), or 'auto' (the default): 'endoftext' when
the file holds an <|endoftext|> anywhere, else 'blank-line'."""


def _jsonl_docs(path: str, text_field: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorruptFileError(f"{path} line {lineno} is not valid UTF-8 ({e.reason} at "
                                       f"byte {e.start}); a .jsonl corpus is UTF-8 text") from e
            if not line.strip():
                continue
            yield _text_of(_json_record(line, f"{path} line {lineno}"), text_field,
                           f"{path} line {lineno}")


def _json_record(line: str, where: str) -> object:
    """One JSON value, or one line naming ``where`` (bad JSON, or nested too deep to parse)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{where} is not valid JSON ({e}); a .jsonl corpus has one JSON "
                               "object per line") from e
    except RecursionError as e:
        raise CorruptFileError(f"{where} is JSON nested too deeply to read; a .jsonl corpus "
                               "has one flat object per line with a text field") from e


def _text_of(record: object, text_field: str, where: str) -> str:
    if not isinstance(record, dict) or text_field not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise BadInputError(f"{where} has no text field {text_field!r}; fields present: "
                                f"{keys} (choose one with text_field=...)")
    text = record[text_field]
    if not isinstance(text, str):
        raise BadInputError(f"{where}: field {text_field!r} is {type(text).__name__}, not a "
                             "string (choose a text column with text_field=...)")
    return text


def _open_parquet(data_file: str, text_field: str, name: str):
    import datasets
    chatty = logging.getLogger("datasets")  # logs its own line before raising: ours says it
    level = chatty.level
    try:
        chatty.setLevel(logging.CRITICAL)
        ds = datasets.load_dataset("parquet", data_files=[data_file], split="train",
                                   streaming=True)
        features = ds.features
    except FileNotFoundError as e:
        raise MissingFileError(f"parquet file {name} not found ({e})") from e
    except Exception as e:  # noqa: BLE001 - pyarrow/datasets raise many kinds for bad files
        raise CorruptFileError(f"cannot read {name} as parquet ({type(e).__name__}: {e}); "
                              "expected a valid .parquet file with a string text column") from e
    finally:
        chatty.setLevel(level)
    if features is not None and text_field not in features:
        raise BadInputError(f"{name} has no text field {text_field!r}; columns present: "
                                f"{sorted(features)} (choose one with text_field=...)")
    return ds.select_columns([text_field])


def _parquet_docs(data_file: str, text_field: str, name: str | None = None) -> Iterator[str]:
    """Documents of a parquet file on local disk (``name``: what messages call it)."""
    name = name or data_file
    rows = iter(_open_parquet(data_file, text_field, name))
    while True:
        try:
            record = next(rows)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - pyarrow/datasets raise many kinds
            raise CorruptFileError(f"cannot read {name} as parquet ({type(e).__name__}: {e}); "
                                  "the file is corrupt or not parquet") from e
        yield _text_of(record, text_field, name)


# ---------------------------------------------------------------- hub datasets
@dataclass(frozen=True)
class HubParquet:
    """One parquet file of a hub dataset; size and hashes once listed (else looked up when
    the shard is read). ``name`` is its stable hf:// name."""

    repo_id: str
    revision: str | None
    path: str
    name: str
    commit: str | None = None
    size: int | None = None
    sha256: str | None = None
    git_oid: str | None = None


def _api():

    return HfApi(endpoint=hubio.endpoint())


def _hub_call(fn, what: str):
    """``fn()`` under the retry policy; failures become one-line dataset errors."""
    return hubio.call(fn, what, fail=HubError, missing=MissingFileError)


def _pin(repo_id: str, revision: str | None) -> str:
    """The commit a branch, tag or commit of a dataset points to now."""
    info = _hub_call(lambda: _api().dataset_info(repo_id, revision=revision),
                     f"looking up the hub dataset {repo_id}")
    return hubio.check_oid(info.sha, f"the commit of the hub dataset {repo_id}")


def _list_dataset(repo_id: str, revision: str | None) -> tuple[str, list]:
    """``(commit, tree entries)`` of a hub dataset at ``revision``, pinned to one commit."""
    commit = _pin(repo_id, revision)
    entries = _hub_call(lambda: list(_api().list_repo_tree(
        repo_id, repo_type="dataset", revision=commit, recursive=True)),
        f"listing the files of the hub dataset {repo_id}@{commit}")
    return commit, [e for e in entries if hasattr(e, "size")]


def _described(ref: HubParquet, entry) -> HubParquet:
    """``ref`` with the size and hashes of its tree entry, validated."""
    what = f"the hub's listing of {ref.name}"
    sha = entry.lfs.sha256 if getattr(entry, "lfs", None) else None
    return HubParquet(ref.repo_id, ref.revision, hubio.check_repo_path(ref.path, what), ref.name,
                      ref.commit, int(entry.size),
                      None if sha is None else hubio.check_sha256(sha, f"the sha256 in {what}"),
                      hubio.check_oid(entry.blob_id, f"the git blob id in {what}"))


def _describe(ref: HubParquet) -> HubParquet:
    """Look up the commit, size and hashes of a shard named by an hf:// path."""
    pinned = HubParquet(ref.repo_id, ref.revision, ref.path, ref.name,
                        _pin(ref.repo_id, ref.revision))
    found = _hub_call(lambda: _api().get_paths_info(ref.repo_id, [ref.path], repo_type="dataset",
                                                    revision=pinned.commit),
                      f"looking up {ref.name}")
    files = [e for e in found if hasattr(e, "size")]
    if not files:
        raise MissingFileError(f"{ref.name}: no such file in the hub dataset {ref.repo_id}")
    return _described(pinned, files[0])


def _hub_fingerprint(ref: HubParquet) -> dict:
    """The hub's hash of a parquet shard (looked up when its listing did not give it)."""
    ref = ref if ref.size is not None else _describe(ref)
    return {"size": ref.size, "sha256": ref.sha256, "git_oid": ref.git_oid}


def _hub_parquet_docs(ref: HubParquet, text_field: str) -> Iterator[str]:
    """Documents of a hub parquet shard: downloaded, verified, read, then deleted."""

    ref = ref if ref.size is not None else _describe(ref)
    cache = HubCache(hubio.tool_cache("datasets"), ref.repo_id, "dataset")
    etag = ref.sha256 or ref.git_oid
    cache.lease(etag)
    try:
        path = _hub_call(lambda: _fetch_parquet(cache, ref), f"reading {ref.name}")
        yield from _parquet_docs(str(path), text_field, ref.name)
    finally:
        cache.unlease(etag)
        if not cache.others_hold(etag):
            with cache.lock(etag):
                if not cache.others_hold(etag):
                    cache.delete(cache.blob(etag))


def _fetch_parquet(cache, ref: HubParquet):
    """The verified local copy of ``ref`` in the tool's dataset cache."""

    f = FileInfo(ref.path, ref.size, ref.sha256, ref.git_oid)
    blob = cache.blob(f.etag)
    with cache.lock(f.etag):
        if blob.is_file() and file_matches(blob, f):
            return blob
        cache.delete(blob)
        url = hubio.resolve_url(hubio.endpoint(), ref.repo_id, ref.commit, ref.path, "dataset")
        remote = hubio.Remote(url, ref.name, f.size, f.sha256, f.git_oid)
        return cache.put_blob(f.etag, hubio.download(remote, blob, [cache.storage / "blobs"]))


# ---------------------------------------------------------------- shard lists
def builtin_shards(n_stories: int = 20000, seed: int = 0, stories_per_shard: int = 1000,
                   length: int = 24, min_tokens: int = 0, p_topic: float = 0.9) -> list[Shard]:
    """Shards of the built-in story stream; shard i holds stories [i*S, (i+1)*S)."""
    builtin_corpus._check_args(n_stories, seed, length, min_tokens, p_topic)
    if not isinstance(stories_per_shard, int) or stories_per_shard < 1:
        raise BadInputError(f"stories_per_shard must be an integer >= 1, got {stories_per_shard!r}")
    tag = f"builtin/seed={seed}/length={length}/min_tokens={min_tokens}/p_topic={p_topic}"
    shards = []
    for start in range(0, n_stories, stories_per_shard):
        stop = min(start + stories_per_shard, n_stories)
        reader = partial(_builtin_docs, start, stop, seed, length, min_tokens, p_topic)
        shards.append(Shard(f"{tag}/stories={start}-{stop}", reader))
    return shards


def file_shard(path: str | Path, text_field: str = "text", doc_split: str = "auto") -> Shard:
    """One local .txt / .jsonl / .parquet file as a shard (``doc_split``: how a .txt file is
    cut into documents, :data:`DOC_SPLITS`)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise BadInputError(f"unsupported corpus file {path}: the suffix must be one of "
                         f"{', '.join(FILE_SUFFIXES)}")
    if not path.is_file():
        raise MissingFileError(f"corpus file {path} does not exist")
    if doc_split not in DOC_SPLITS:
        raise BadInputError(f"doc_split {doc_split!r}; valid: {', '.join(DOC_SPLITS)}")
    readers = {".txt": partial(_txt_docs, str(path), doc_split),
               ".jsonl": partial(_jsonl_docs, str(path), text_field),
               ".parquet": partial(_parquet_docs, str(path), text_field)}
    content = (partial(_txt_fingerprint, path, doc_split) if suffix == ".txt"
               else partial(file_fingerprint, path))
    return Shard(str(path), readers[suffix], content)


def _txt_fingerprint(path: Path, doc_split: str) -> dict:
    """A .txt shard's content: the file's bytes and the rule that cuts it into documents."""
    return {**file_fingerprint(path), "doc_split": doc_split}


def _local_files(paths: list[Path], where: str) -> list[Path]:
    files = sorted(p for p in paths if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if not files:
        raise BadInputError(f"no {'/'.join(FILE_SUFFIXES)} files in {where}; give a directory or "
                         "glob containing such files")
    return files


def file_split(path: str) -> str | None:
    """The split a data file belongs to by hub naming conventions ("train", "validation",
    "test"), or None when its path names none."""
    for word in re.split(r"[/\-_.]", path.lower()):
        if word in _SPLIT_WORDS:
            return _SPLIT_WORDS[word]
    return None


def select_split(files: list[str], split: str) -> list[str]:
    """The files of `split`; when no file names a split, all files are "train"."""
    want = _SPLIT_WORDS.get(split.lower(), split.lower())
    named = {f: file_split(f) for f in files}
    if all(s is None for s in named.values()):
        return list(files) if want == "train" else []
    return [f for f, s in named.items() if s == want]


def hub_parquet_files(repo_id: str, split: str = "train", revision: str | None = None,
                      data_dir: str | None = None) -> list[HubParquet]:
    """The parquet files of a hub dataset for `split`, with sizes and hashes (listed at run
    time, pinned to the commit `revision` points to now)."""
    try:
        commit, entries = _list_dataset(repo_id, revision)
    except UserError as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        kind = MissingFileError if isinstance(e, MissingFileError) else HubError
        raise kind(f"{repo_id!r} is no local path, and listing it as a hub dataset failed "
                   f"({hubio.one_line(cause)}); check the path or id and the network "
                   "(HF_HUB_OFFLINE=1 uses the cache only)") from e
    by_path = {e.path: e for e in entries}
    files = sorted(f for f in by_path if f.endswith(".parquet")
                   and (data_dir is None or f.startswith(data_dir.rstrip("/") + "/")))
    chosen = select_split(files, split)
    if not chosen:
        raise BadInputError(
            f"hub dataset {repo_id!r} has no .parquet files for split {split!r}"
            f"{'' if data_dir is None else f' under {data_dir!r}'}; parquet files "
            f"found: {files[:10]}{' ...' if len(files) > 10 else ''}")
    at = "" if revision is None else "@" + quote(revision, safe="")
    return [_described(HubParquet(repo_id, revision, f, f"hf://datasets/{repo_id}{at}/{f}",
                                  commit), by_path[f]) for f in chosen]


def parse_hf_path(path: str) -> HubParquet:
    """``hf://datasets/ORG/NAME[@REV]/PATH`` -> a :class:`HubParquet` (nothing looked up)."""
    m = _HF_PATH.fullmatch(path)
    if m is None:
        raise BadInputError(f"{path!r} is not an hf://datasets/ORG/NAME[@REVISION]/PATH path")
    rev = unquote(m[2]) if m[2] else None
    return HubParquet(m[1], rev, hubio.check_repo_path(m[3], f"the file of {path}"), path)


def _hf_glob(pattern: str) -> list[str]:
    if not any(c in pattern for c in "*?["):
        return [pattern]

    found = sorted("hf://" + p for p in _hub_call(lambda: HfFileSystem().glob(pattern),
                                                   f"listing {pattern}"))
    if not found:
        raise MissingFileError(f"no files match {pattern}")
    return found


def _hub_shards(source: str, text_field: str, split: str, revision: str | None,
                data_dir: str | None) -> list[Shard]:
    if source.startswith("hf://"):
        refs = [parse_hf_path(f) for f in _hf_glob(source)]
    else:
        refs = hub_parquet_files(source, split, revision, data_dir)
    bad = [r.name for r in refs if not r.path.endswith(".parquet")]
    if bad:
        raise BadInputError(f"hub sources are read as parquet only; not parquet: {bad[:3]}")
    return [Shard(r.name, partial(_hub_parquet_docs, r, text_field),
                  partial(_hub_fingerprint, r)) for r in refs]


def corpus_shards(source: str = "builtin", *, text_field: str = "text", split: str = "train",
                  revision: str | None = None, data_dir: str | None = None,
                  doc_split: str = "auto", **builtin_opts) -> list[Shard]:
    """The shards of `source`, in a fixed order (see the module docstring for sources).

    builtin_opts (n_stories, seed, stories_per_shard, length, min_tokens, p_topic) apply to
    "builtin" only; text_field to .jsonl/.parquet/hub; split, revision, data_dir to hub ids;
    doc_split to .txt files (:data:`DOC_SPLITS`).
    """
    source = str(source)
    if source == "builtin":
        if split != "train":
            raise BadInputError("the builtin corpus has one stream ('train'); use another seed "
                             f"for held-out stories, not split={split!r}")
        return builtin_shards(**builtin_opts)
    if builtin_opts:
        raise BadInputError(f"options {sorted(builtin_opts)} apply to source='builtin' only")
    return _source_shards(source, text_field, split, revision, data_dir, doc_split)


def _source_shards(source: str, text_field: str, split: str, revision: str | None,
                   data_dir: str | None, doc_split: str = "auto") -> list[Shard]:
    path = Path(source).expanduser()
    if source.startswith("hf://"):
        return _hub_shards(source, text_field, split, revision, data_dir)
    if path.is_dir():
        files = _local_files(list(path.rglob("*")), f"directory {path}")
    elif any(c in source for c in "*?["):
        files = _local_files([Path(p) for p in globlib.glob(source, recursive=True)],
                             f"glob {source!r}")
    elif path.exists() or path.suffix.lower() in FILE_SUFFIXES:
        if not path.exists():
            raise MissingFileError(f"corpus file {path} does not exist; valid sources: "
                                    f"{VALID_SOURCES}")
        files = [path]
    elif _HUB_ID.match(source):
        return _hub_shards(source, text_field, split, revision, data_dir)
    else:
        raise MissingFileError(f"corpus source {source!r} not found; valid sources: "
                                f"{VALID_SOURCES}")
    return [file_shard(f, text_field, doc_split) for f in files]


def iter_documents(source: str = "builtin", *, text_field: str = "text", min_chars: int = 0,
                   max_docs: int | None = None, split: str = "train",
                   **opts) -> Iterator[str]:
    """All documents of all shards of `source`, in order, with at least `min_chars`
    characters, stopping after `max_docs` kept documents (None: no limit).

    Raises ValueError when the source holds no document, or none passes min_chars.
    """
    if not isinstance(min_chars, int) or min_chars < 0:
        raise BadInputError(f"min_chars must be an integer >= 0, got {min_chars!r}")
    if max_docs is not None and (not isinstance(max_docs, int) or max_docs < 1):
        raise BadInputError(f"max_docs must be None or an integer >= 1, got {max_docs!r}")
    seen = kept = longest = 0
    for shard in corpus_shards(source, text_field=text_field, split=split, **opts):
        for doc in shard.documents():
            seen += 1
            longest = max(longest, len(doc))
            if len(doc) >= min_chars:
                kept += 1
                yield doc
                if max_docs is not None and kept >= max_docs:
                    return
    if seen == 0:
        raise BadInputError(f"empty corpus: {source!r} holds no documents (a .txt corpus needs "
                         "non-blank text between <|endoftext|> lines)")
    if kept == 0:
        raise BadInputError(f"no document of {source!r} has >= {min_chars} characters ({seen} "
                         f"documents, longest {longest}); lower min_chars")
