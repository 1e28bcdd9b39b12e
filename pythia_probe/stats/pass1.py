"""Pass 1 over corpus shards, for both engines, and the windows pass 2 reads again.

Each shard is tokenized once; its windows are cached (int32 safetensors in the work dir,
without padding) and counted by the engine's accumulator, which is checkpointed with its ledger
(shards finished; their content digest and cache sha256; documents, sequences, positions and
skips) every ``checkpoint_every`` shards. A killed run restarted with the same arguments (and
the same input bytes) loads them and skips finished shards, so no shard is counted twice.
With several processes each rank takes shards rank, rank+world, ... :class:`Windows` hands
pass 2 the counted windows again, each cache checked against its ledger entry.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from pythia_probe.corpus import content_digest
from pythia_probe.errors import BadInputError, CorruptFileError, MismatchError, MissingFileError
from pythia_probe.fileio import empty_only, remove
from pythia_probe.progress import JobProgress
from pythia_probe.ranks import Ranks
from pythia_probe.stats import checkpoint
from pythia_probe.stats.doctop import KEYS as DOC_KEYS
from pythia_probe.stats.doctop import DocTokens
from pythia_probe.stats.sequences import SequencePolicy, Sequencer, batches, describe_skips

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """Everything the passes need besides the shards (built by the CLI from StatsConfig)."""

    d_vocab: int
    policy: SequencePolicy
    encode: Callable[[list[str]], Iterator[list[int]]]
    identity: dict[str, Any]
    work_dir: Path | None
    """Checkpoints and token caches (None: nothing kept, one batch in memory)."""
    min_chars: int = 0
    max_docs: int | None = None
    batch_size: int = 256
    checkpoint_every: int = 1
    device: str = "cpu"
    top_k: int | None = None
    budget_bytes: int | None = None
    progress: bool | JobProgress = True
    engine: str = "auto"
    groups: int = 0
    """G: documents in G groups by their ordinal in the corpus stream (ordinal mod G), each
    group's statistics kept beside the totals (0: none)."""
    top_rule: str = "windows"
    """How the top-k ids are ranked: 'windows' (the tokens counted in the windows, ties by
    id) or 'documents' (pythia.py's find_top_tokens: every token of each document, BOS
    first, up to 2,048, ties in first-seen order; ``stats/doctop.py``)."""
    doc_bos: int | None = None
    """The BOS id the documents' token counts of the 'documents' top-k rule start with."""
    compose: str = "full_then_slice"
    """How a top-k vocabulary's SigmaB, PhiBT, Gbar, GbarHead and pass 2 are made:
    'full_then_slice' or 'kept' (the authors': over the kept ids only, ``stats/kept.py``)."""


def doc_counts(ledger: list[dict]) -> dict[str, int]:
    """Documents kept and read, and every kind of skip, summed over the ledger."""
    skipped = sum((Counter(e["skipped"]) for e in ledger), Counter())
    return {"docs": sum(e["docs"] for e in ledger),
            "docs_read": sum(e.get("docs_read", e["docs"]) for e in ledger), **dict(skipped)}


def check_counted(acc, spec: RunSpec) -> None:
    """After pass 1: say what was left out and why; when nothing was counted, remove the work
    folder (it holds nothing worth resuming) and stop with that line."""
    counts = doc_counts(acc.ledger)
    line = describe_skips(counts, spec.policy.seq_len)
    if acc.n_positions == 0:
        if spec.work_dir is not None:
            remove_work(spec.work_dir)
        raise BadInputError(f"no positions were counted: {line}; nothing was kept (the work "
                            f"folder {spec.work_dir} is removed)")
    if counts["docs_read"] > counts["docs"] or any(v for k, v in counts.items()
                                                   if k not in ("docs", "docs_read")):
        log.info("pass 1: %s", line)


def run_meta(meta: dict[str, Any], spec: RunSpec, ledger: list[dict]) -> dict[str, Any]:
    """Metadata of a run: T, ledger, documents and skips, sequence policy."""
    docs = doc_counts(ledger)
    return dict(meta, T=spec.policy.seq_len, ledger=ledger, counts=docs,
                policy=dict(spec.policy.as_dict(), min_chars=spec.min_chars,
                            max_docs=spec.max_docs))


# -- pass 1 --------------------------------------------------------------------------------
def pass1_path(spec: RunSpec, d: Ranks) -> Path:
    return spec.work_dir / f"pass1-rank{d.rank}-of{d.world}.safetensors"


def count_pass(mine: list, spec: RunSpec, d: Ranks, engine, dev: torch.device,
               quotas: dict[str, int] | None, shards: list | None = None):
    """Pass 1 over this rank's shards with ``engine``'s accumulator, resuming from its
    checkpoint. With groups, each shard's first document has ordinal ``offset``: the documents
    of the shards before it (one process counts them in order; several scan ``shards``)."""
    path = pass1_path(spec, d)
    acc = _resume_counts(path, spec, engine, dev)
    done = {e["shard"] for e in acc.ledger}
    used = sum(e["docs"] for e in acc.ledger)
    offsets = offsets_of(shards, spec, quotas) if spec.groups and d.world > 1 else None
    shown = bar(spec, "statistics pass 1", d)
    since = 0
    for index, shard in mine:
        quota = _quota(shard.name, quotas, spec.max_docs, used)
        if shard.name in done or quota == 0:
            continue
        offset = used if offsets is None else offsets[index]
        entry = count_shard(index, shard, acc, spec, quota, shown, offset)
        used += entry["docs"]
        since += 1
        if since >= spec.checkpoint_every:
            _save_counts(path, acc, spec)
            since = 0
    _save_counts(path, acc, spec)
    shown.close()
    return acc


def count_shard(index: int, shard, acc, spec: RunSpec, quota: int | None,
                shown, offset: int = 0) -> dict[str, Any]:
    """Count one shard, cache its windows, append its ledger entry (with the shard's content
    digest and the cache's sha256, which pass 2 checks the cache against)."""
    content = content_digest(shard.fingerprint())
    seq, docs, cache = read_windows(shard, spec, quota, lambda t, n: (acc.update(t, n),
                                                                      shown.update(int(n.sum()))),
                                    offset)
    digest = cache_digest(cache)
    _save_cache(spec, shard.name, cache, content, digest)
    entry = {"shard": shard.name, "index": index, "content": content, "cache_sha256": digest,
             "docs": docs.kept, "docs_read": docs.read,
             "sequences": int(cache["lengths"].numel()),
             "positions": int((cache["lengths"] - 1).clamp(min=0).sum()),
             "skipped": dict(seq.skipped, docs_under_min_chars=docs.read - docs.kept)}
    if spec.groups:
        entry["doc_offset"] = offset
    if int(cache["lengths"].numel()) == 0:
        entry["skipped"]["empty_shard"] = 1
    acc.ledger.append(entry)
    return entry


def read_windows(shard, spec: RunSpec, quota: int | None, each=None, offset: int = 0):
    """(sequencer, document filter, cache) of one shard. The cache holds only the tokens of
    its windows, without padding (``ids``: int32, concatenated; ``lengths``: int64), so its
    size follows the tokens kept, whatever T is; with groups also each window's group
    (``groups``: int64, (offset + its document's place in the shard) mod G). ``each(tokens,
    lengths)`` sees every batch."""
    seq = Sequencer(spec.policy, spec.d_vocab)
    docs = _DocFilter(shard.documents(), spec.min_chars, quota)
    counted = DocTokens(spec.d_vocab, spec.doc_bos) if spec.top_rule == "documents" else None
    encoded = spec.encode(docs) if counted is None else counted.watch(spec.encode(docs))
    ids, lens = [torch.zeros(0, dtype=torch.int32)], [torch.zeros(0, dtype=torch.int64)]
    for tokens, lengths in batches(seq.windows(encoded), spec.policy.seq_len,
                                   spec.batch_size):
        if each is not None:
            each(tokens, lengths)
        valid = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
        ids.append(tokens[valid].to(torch.int32))
        lens.append(lengths)
    cache = {"ids": torch.cat(ids), "lengths": torch.cat(lens)}
    if spec.groups:
        cache["groups"] = (offset + torch.tensor(seq.origins, dtype=torch.int64)) % spec.groups
    if counted is not None:
        cache.update(counted.tensors())
    return seq, docs, cache


def padded(cache: dict[str, torch.Tensor], T: int) -> dict[str, torch.Tensor]:
    """A token cache as windows [n, T+1] int32 padded with 0, and their lengths."""
    lengths = cache["lengths"]
    tokens = torch.zeros(lengths.numel(), T + 1, dtype=torch.int32)
    tokens[torch.arange(T + 1)[None, :] < lengths[:, None]] = cache["ids"]
    out = {"tokens": tokens, "lengths": lengths}
    if "groups" in cache:
        out["groups"] = cache["groups"]
    return out


def cache_digest(cache: dict[str, torch.Tensor]) -> str:
    """sha256 of a token cache (the windows' tokens and lengths, and groups and the document
    counts of the authors' top-K rule when kept)."""
    h = hashlib.sha256(cache["ids"].to(torch.int32).contiguous().numpy().tobytes())
    h.update(cache["lengths"].to(torch.int64).contiguous().numpy().tobytes())
    for key in ("groups", *DOC_KEYS):
        if key in cache:
            h.update(cache[key].to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def _save_cache(spec: RunSpec, name: str, cache: dict, content: str, digest: str) -> None:
    checkpoint.save_state(cache_path(spec, name), cache,
                          {"shard": name, "content": content, "sha256": digest})


def cached_windows(spec: RunSpec, entry: dict[str, Any], shard) -> dict[str, torch.Tensor]:
    """The windows of a counted shard (padded, as :func:`padded`) from its token cache,
    checked against its pass-1 ledger entry (:func:`cached`)."""
    return padded(cached(spec, entry, shard), spec.policy.seq_len)


def cached(spec: RunSpec, entry: dict[str, Any], shard) -> dict[str, torch.Tensor]:
    """The token cache of a counted shard as pass 1 wrote it, checked against its pass-1
    ledger entry: a cache that is missing, corrupt or holds other windows (another shard's
    copied over it) is rebuilt from the shard, which must still give the windows pass 1
    counted."""
    if "cache_sha256" not in entry:
        raise MismatchError(f"the work folder {spec.work_dir} was written by an older version "
                            "(its ledger records no token-cache digests); delete it to start "
                            "over")
    path = cache_path(spec, entry["shard"])
    try:
        cache, _ = checkpoint.load_state(path)
        if cache_digest(cache) == entry["cache_sha256"]:
            return cache
        why = "holds other windows than pass 1 counted"
    except (CorruptFileError, MissingFileError, KeyError) as err:
        why = f"cannot be read ({err})"
    log.warning("token cache %s of shard %s %s: reading the shard again", path, entry["shard"],
                why)
    quota = None if spec.max_docs is None else entry["docs"]
    cache = read_windows(shard, spec, quota, offset=entry.get("doc_offset", 0))[2]
    if content_digest(shard.fingerprint()) != entry["content"] or \
            cache_digest(cache) != entry["cache_sha256"]:
        raise MismatchError(f"shard {entry['shard']} changed since pass 1 counted it, and its "
                            f"token cache {path} {why}; delete the work folder {spec.work_dir} "
                            "to count from scratch")
    _save_cache(spec, entry["shard"], cache, entry["content"], entry["cache_sha256"])
    return cache


class _DocFilter:
    """Documents with >= min_chars characters, at most ``quota`` of them; counts both."""

    def __init__(self, docs: Iterator[str], min_chars: int, quota: int | None) -> None:
        self.docs, self.min_chars, self.quota = docs, min_chars, quota
        self.read = self.kept = 0

    def __iter__(self) -> Iterator[str]:
        for doc in self.docs:
            if self.quota is not None and self.kept >= self.quota:
                return
            self.read += 1
            if len(doc) >= self.min_chars:
                self.kept += 1
                yield doc


def plan_quotas(shards: list, spec: RunSpec) -> dict[str, int] | None:
    """Multi-process --docs: documents each shard contributes to the first max_docs (a scan)."""
    if spec.max_docs is None:
        return None
    out, left = {}, spec.max_docs
    for s in shards:
        n = 0
        if left > 0:
            n = sum(1 for doc in s.documents() if len(doc) >= spec.min_chars)
        out[s.name] = min(n, left)
        left -= out[s.name]
    return out


def offsets_of(shards: list, spec: RunSpec, quotas: dict[str, int] | None) -> list[int]:
    """The ordinal of each shard's first document in the corpus stream: the documents (with
    >= min_chars characters, within --docs) of the shards before it (a scan)."""
    counts = quotas if quotas is not None else {
        s.name: sum(1 for doc in s.documents() if len(doc) >= spec.min_chars) for s in shards}
    out, at = [], 0
    for s in shards:
        out.append(at)
        at += counts.get(s.name, 0)
    return out


def _quota(name: str, quotas: dict[str, int] | None, max_docs: int | None, used: int
           ) -> int | None:
    if quotas is not None:
        return quotas.get(name, 0)
    return None if max_docs is None else max(max_docs - used, 0)


def _resume_counts(path: Path, spec: RunSpec, engine, dev: torch.device):
    if not path.exists():
        return engine.counter(spec.d_vocab, spec.policy.seq_len, dev)
    tensors, meta = checkpoint.load_state(path, spec.identity)
    return engine.restore_counts(tensors, meta["state"], dev)


def _save_counts(path: Path, acc, spec: RunSpec) -> None:
    tensors, state = acc.state()
    checkpoint.save_state(path, tensors, {"identity": spec.identity, "state": state})


def cache_path(spec: RunSpec, name: str) -> Path:
    return spec.work_dir / "cache" / (hashlib.sha256(name.encode()).hexdigest()[:24]
                                      + ".safetensors")


def bar(spec: RunSpec, stage: str, d: Ranks, unit: str = "tok", total: int | None = None):
    """Progress of one pass: a stage of the job's display (``spec.progress`` a JobProgress, on
    rank 0), else a tqdm bar of its own (hidden with --no-progress and off rank 0)."""
    if isinstance(spec.progress, JobProgress) and d.is_main:
        return spec.progress.counter(stage, total)
    desc = f"{stage} (rank {d.rank})" if d.world > 1 else stage
    return tqdm(desc=desc, unit=unit, unit_scale=True, total=total,
                disable=not spec.progress or not d.is_main)


def remove_work(work_dir: Path) -> None:
    """Delete what the passes wrote in ``work_dir`` (checkpoints, token caches), then the folder
    itself if nothing else is left in it."""
    for p in list(work_dir.glob("pass[12]-*.safetensors")) + [work_dir / "cache"]:
        remove(p, [work_dir])
    remove(work_dir, [work_dir.parent], empty_only)


def spec_identity(**parts: Any) -> dict[str, Any]:
    """JSON-able identity of a run (a checkpoint is only resumed under the same one)."""
    return {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v)
            for k, v in sorted(parts.items())}


class Windows:
    """The windows pass 2 reads again, unit by unit: each counted shard of this rank (its
    checked token cache), or one batch held in memory. ``units`` are ledger entries."""

    def __init__(self, units: list[dict[str, Any]], load, raw=None) -> None:
        self.units, self._load, self._raw = units, load, raw

    @classmethod
    def of_shards(cls, spec: RunSpec, ledger: list[dict[str, Any]], mine: list) -> Windows:
        """This rank's counted shards, in ledger order."""
        by_name = {s.name: s for _, s in mine}
        units = [e for e in ledger if e["shard"] in by_name]
        return cls(units, lambda e: cached_windows(spec, e, by_name[e["shard"]]),
                   lambda e: cached(spec, e, by_name[e["shard"]]))

    @classmethod
    def of_batch(cls, tokens: torch.Tensor, lengths: torch.Tensor | None,
                 groups: torch.Tensor | None = None) -> Windows:
        L = tokens.shape[1]
        n = torch.full((tokens.shape[0],), L) if lengths is None else lengths.to(torch.int64)
        n = n.to(tokens.device)
        pad = torch.arange(L, device=tokens.device)[None, :] >= n[:, None]
        batch = {"tokens": tokens.masked_fill(pad, 0).to(torch.int32).cpu(), "lengths": n.cpu()}
        if groups is not None:
            batch["groups"] = groups.to(torch.int64).cpu()
        return cls([{"shard": "batch", "index": 0}], lambda e: batch)

    def load(self, unit: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One unit's windows: int32 tokens [n, T+1] padded with 0, int64 lengths."""
        return self._load(unit)

    def doc_tokens(self, unit: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One unit's token cache as pass 1 wrote it (checked): its document counts
        (``stats/doctop.py``). Only shards have them."""
        if self._raw is None:
            raise BadInputError("the authors' top-K rule counts the tokens of documents: it "
                                "needs corpus shards, not a batch of windows")
        return self._raw(unit)
