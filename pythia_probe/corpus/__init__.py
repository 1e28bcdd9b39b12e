"""Document sources behind one interface: a list of :class:`Shard` s, each yielding document
strings (see :mod:`pythia_probe.corpus.sources`). ``python -m pythia_probe.corpus`` generates
and inspects corpora (:mod:`pythia_probe.corpus.__main__`)."""

from pythia_probe.lazy import faces

__all__ = ["DOC_SPLITS", "FILE_SUFFIXES", "HubParquet", "SEPARATOR", "Shard", "VALID_SOURCES",
           "builtin_shards", "content_digest", "content_id", "corpus_shards", "file_fingerprint",
           "file_shard", "file_split", "hub_parquet_files", "iter_documents", "parse_hf_path",
           "select_split"]
__getattr__, __dir__ = faces(__name__, {
    ".sources": (
        "DOC_SPLITS",
        "FILE_SUFFIXES",
        "SEPARATOR",
        "VALID_SOURCES",
        "HubParquet",
        "Shard",
        "builtin_shards",
        "content_digest",
        "content_id",
        "corpus_shards",
        "file_fingerprint",
        "file_shard",
        "file_split",
        "hub_parquet_files",
        "iter_documents",
        "parse_hf_path",
        "select_split",
    ),
})
