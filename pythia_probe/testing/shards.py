"""Corpus shards for tests whose documents are token ids written as text ("3 1 4 1 5")."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class IdShard:
    """A shard of space-separated integer ids; ``fail`` raises mid-shard (a killed run)."""

    name: str
    texts: tuple[str, ...]
    fail: bool = False

    def documents(self) -> Iterator[str]:
        for i, t in enumerate(self.texts):
            if self.fail and i == 1:
                raise KeyboardInterrupt("killed")
            yield t

    def fingerprint(self) -> dict:
        """Its name and the sha256 of its texts (what a file shard's fingerprint gives)."""
        blob = "\x00".join(self.texts).encode()
        return {"name": self.name, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def encode_ids(docs: Iterable[str]) -> Iterator[list[int]]:
    """The ids of each document (the ``encode`` of a statistics run over IdShards)."""
    for d in docs:
        yield [int(w) for w in d.split()]
