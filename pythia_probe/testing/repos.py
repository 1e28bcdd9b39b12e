"""Tiny GPT-NeoX checkpoint repos laid out like Pythia's, for the loopback hub and local-dir tests.

On-disk layout (also a valid "one folder per step" local directory for ``CheckpointSource``)::

    root/ORG/NAME/step0/{config.json, pytorch_model.bin}
    root/ORG/NAME/step1/...        byte-identical to step0 (as in every Pythia model)
    root/ORG/NAME/step64/{config.json, model.safetensors}
    root/ORG/NAME/step128/{config.json, pytorch_model-00001-of-00002.bin, ..., index json}
    root/ORG/NAME/main/...         copy of the last step

Dataset repos (``build_dataset_repo``, OpenWebText-like: parquet shards with a "text" column)::

    root/datasets/ORG/NAME/main/{README.md, data/train-00000-of-00003.parquet, ...}

FineWeb-like (``build_fineweb_repo``: one folder per crawl dump and the 10BT sample, FineWeb's
columns)::

    root/datasets/HuggingFaceFW/fineweb/main/{README.md, data/CC-MAIN-2013-20/000_00000.parquet,
        ..., sample/10BT/000_00000.parquet, ...}
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from pythia_probe.hub.steps import PYTHIA_STEPS
from pythia_probe.testing.tokenizers import (
    PYTHIA_D_VOCAB,
    pythia_like_backend,
    write_pythia_tokenizer,
)

Layout = tuple[str, int]  # (format "bin" | "safetensors", number of shards)


def tiny_config(**overrides):
    """A small random GPT-NeoX config with partial rotary, parallel residual, untied embeddings."""
    from transformers import GPTNeoXConfig

    kw = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, rotary_pct=0.25, max_position_embeddings=64,
              use_parallel_residual=True, tie_word_embeddings=False)
    return GPTNeoXConfig(**{**kw, **overrides})


def random_state_dict(config, seed: int, dtype=torch.float16) -> dict[str, torch.Tensor]:
    """Hub-named (``embed_out.weight``) random weights for ``config``, deterministic in ``seed``."""
    from transformers import GPTNeoXForCausalLM

    with torch.device("meta"):  # shapes only
        sd = GPTNeoXForCausalLM(config).state_dict()
    sd = {("embed_out.weight" if k == "lm_head.weight" else k): v for k, v in sd.items()}
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g).mul(0.1).to(dtype) for k, v in sd.items()}


def legacy_buffers(config) -> dict[str, torch.Tensor]:
    """Non-parameter buffers old Pythia .bin files carry (causal mask, masked_bias, inv_freq)."""
    n = config.max_position_embeddings
    d_head = config.hidden_size // config.num_attention_heads
    rd = int(d_head * config.rope_parameters["partial_rotary_factor"])
    out = {}
    for i in range(config.num_hidden_layers):
        p = f"gpt_neox.layers.{i}.attention."
        out[p + "bias"] = torch.ones(n, n, dtype=torch.bool).tril().view(1, 1, n, n)
        out[p + "masked_bias"] = torch.tensor(-1e9)
        out[p + "rotary_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))
    return out


def _shards(sd: Mapping[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    names = sorted(sd)
    return [{k: sd[k] for k in names[i::n]} for i in range(n)]


def _write_index(folder: Path, index_name: str, shards: dict[str, dict]) -> None:
    total = sum(v.numel() * v.element_size() for s in shards.values() for v in s.values())
    weight_map = {k: fname for fname, s in shards.items() for k in s}
    body = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / index_name).write_text(json.dumps(body, indent=2))


def write_checkpoint(
    folder: Path, config, sd: Mapping[str, torch.Tensor], fmt: str = "bin", n_shards: int = 1,
    with_legacy_buffers: bool = True,
) -> list[str]:
    """Write config.json and weights in HF layout; returns the weight file names."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config.to_json_string(use_diff=True))
    if fmt == "bin":
        sd = {**sd, **(legacy_buffers(config) if with_legacy_buffers else {})}
        stem, ext, index = "pytorch_model", "bin", "pytorch_model.bin.index.json"
    elif fmt == "safetensors":
        stem, ext, index = "model", "safetensors", "model.safetensors.index.json"
    else:
        raise ValueError(f"fmt must be 'bin' or 'safetensors', got {fmt!r}")
    parts = _shards(sd, n_shards)
    names = ([f"{stem}.{ext}"] if n_shards == 1 else
             [f"{stem}-{i + 1:05d}-of-{n_shards:05d}.{ext}" for i in range(n_shards)])
    for name, part in zip(names, parts, strict=True):
        if fmt == "bin":
            torch.save({k: v.contiguous() for k, v in part.items()}, folder / name)
        else:
            save_file({k: v.contiguous() for k, v in part.items()}, folder / name, {"format": "pt"})
    if n_shards > 1:
        _write_index(folder, index, dict(zip(names, parts, strict=True)))
    return names


DEFAULT_STEPS = (0, 1, 2, 4, 64, 128, 1000, 2000)


def default_layouts(steps: Sequence[int]) -> dict[int, Layout]:
    """Mostly single .bin (like Pythia step branches); one safetensors, one sharded of each kind."""
    special = [("safetensors", 1), ("bin", 2), ("safetensors", 2)]
    lay = {s: ("bin", 1) for s in steps}
    for s, l in zip([s for s in steps if s > 2], special, strict=False):
        lay[s] = l
    return lay


def build_pythia_like_repo(
    root: Path, repo_id: str = "EleutherAI/pythia-tiny", steps: Sequence[int] = DEFAULT_STEPS,
    config=None, layouts: Mapping[int, Layout] | None = None, with_main: bool = True,
) -> Path:
    """One folder per ``step{N}`` branch (step0, step1 byte-identical); returns the repo dir."""
    config = config or tiny_config()
    layouts = {**default_layouts(steps), **(layouts or {})}
    repo = Path(root) / repo_id
    for step in steps:
        folder = repo / f"step{step}"
        if step == 1 and 0 in steps:
            shutil.copytree(repo / "step0", folder, dirs_exist_ok=True)
            continue
        fmt, n = layouts[step]
        write_checkpoint(folder, config, random_state_dict(config, seed=step), fmt, n)
    if with_main:
        shutil.copytree(repo / f"step{max(steps)}", repo / "main", dirs_exist_ok=True)
    return repo


def write_malicious_bin(path: Path, marker: Path) -> None:
    """A .bin whose pickle runs ``touch marker`` on an unsafe load (for the refusal test)."""

    class Payload:
        def __reduce__(self):

            return (os.system, (f"touch {marker}",))

    torch.save({"gpt_neox.embed_in.weight": torch.zeros(2, 2), "payload": Payload()}, path)


WORDS = ("the a of to and in that is was for on with as by it at from this be are have not "
         "page city river market school report season water light people court music paper "
         "energy garden story number island bridge winter doctor village engine forest").split()


def web_documents(n_docs: int, seed: int = 0) -> list[str]:
    """Deterministic web-text-like documents: 1-6 paragraphs of random sentences; lengths vary
    from a few dozen to a few thousand characters (some short ones, for min_chars filters)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        paragraphs = []
        for _ in range(rng.randint(1, 6)):
            sentences = (" ".join(rng.choices(WORDS, k=rng.randint(3, 18))).capitalize() + "."
                         for _ in range(rng.randint(1, 8)))
            paragraphs.append(" ".join(sentences))
        docs.append("\n\n".join(paragraphs))
    return docs


def build_dataset_repo(
    root: Path, repo_id: str = "Skylion007/openwebtext-tiny",
    splits: Mapping[str, int] | None = None, docs_per_shard: int = 40, seed: int = 0,
    branch: str = "main", row_group_size: int = 16,
) -> dict[str, list[str]]:
    """An OpenWebText-like dataset repo for the loopback hub: ``data/{split}-0000i-of-0000n``
    ``.parquet`` shards (one "text" column, several row groups each) and a README.md, under
    ``root/datasets/repo_id/branch``. ``splits``: shards per split (default ``{"train": 3}``).
    Returns ``{path in repo: documents written}`` in path order."""

    splits = dict(splits or {"train": 3})
    folder = Path(root) / "datasets" / repo_id / branch
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(f"---\nlicense: cc0-1.0\n---\n# {repo_id}\nTest data.\n")
    written = {}
    for k, (split, n) in enumerate(sorted(splits.items())):
        for i in range(n):
            path = f"data/{split}-{i:05d}-of-{n:05d}.parquet"
            docs = web_documents(docs_per_shard, seed=seed * 1000 + k * 100 + i)
            table = pa.table({"text": docs, "id": [f"{split}-{i}-{j}" for j in range(len(docs))]})
            pq.write_table(table, folder / path, row_group_size=row_group_size)
            written[path] = docs
    return dict(sorted(written.items()))


def _tokenizer_into(folder: Path, backend, first: list[Path]) -> None:
    """The tokenizer files into ``folder``: written the first time (``first`` empty), then
    copied from that folder (the same bytes, serialised once)."""
    if not first:
        first.append(write_pythia_tokenizer(folder, backend))
        return
    for p in first[0].glob("*token*.json"):
        shutil.copyfile(p, folder / p.name)


def build_pythia_main_job_hub(root: Path, d_model: int = 8, n_layers: int = 2,
                              docs_per_shard: int = 60) -> Path:
    """The hub the main job reads, in miniature: ``EleutherAI/pythia-1.4b`` with every one of
    Pythia's 154 step branches (and main) holding a tiny GPT-NeoX with Pythia's 50,304 embedding
    rows, a single ``pytorch_model.bin`` as on the real step branches, and a tokenizer in the
    real one's format (50,277 ids); and ``Skylion007/openwebtext`` as parquet shards."""

    config = tiny_config(vocab_size=50304, hidden_size=d_model, num_hidden_layers=n_layers,
                         num_attention_heads=2, intermediate_size=2 * d_model)
    repo = Path(root) / "EleutherAI" / "pythia-1.4b"
    backend, first = pythia_like_backend(), []
    for step in PYTHIA_STEPS:
        folder = repo / f"step{step}"
        if step == 1:  # as on the hub: step1 serves step0's weights
            shutil.copytree(repo / "step0", folder)
            continue
        write_checkpoint(folder, config, random_state_dict(config, seed=step), "bin", 1,
                         with_legacy_buffers=False)
        _tokenizer_into(folder, backend, first)
    shutil.copytree(repo / f"step{PYTHIA_STEPS[-1]}", repo / "main")
    build_dataset_repo(root, "Skylion007/openwebtext", {"train": 2}, docs_per_shard)
    return repo


FINEWEB_DUMPS = ("CC-MAIN-2013-20", "CC-MAIN-2024-10")


def _fineweb_table(docs: list[str], dump: str, tag: str) -> pa.Table:
    """FineWeb's columns: text, id, dump, url, date, file_path, language, language_score,
    token_count."""
    n = len(docs)
    return pa.table({
        "text": docs, "id": [f"<urn:uuid:{tag}-{j:06d}>" for j in range(n)],
        "dump": [dump] * n, "url": [f"https://example.org/{tag}/{j}" for j in range(n)],
        "date": ["2024-02-21T12:00:00Z"] * n,
        "file_path": [f"s3://commoncrawl/crawl-data/{dump}/{tag}.warc.gz"] * n,
        "language": ["en"] * n, "language_score": [0.9] * n,
        "token_count": pa.array([len(d.split()) for d in docs], pa.int64())})


def build_fineweb_repo(root: Path, repo_id: str = "HuggingFaceFW/fineweb",
                       dumps: Sequence[str] = FINEWEB_DUMPS, sample_shards: int = 2,
                       docs_per_shard: int = 40, seed: int = 0) -> dict[str, list[str]]:
    """A FineWeb-shaped dataset repo for the loopback hub, laid out like HuggingFaceFW/fineweb:
    ``data/<dump>/000_00000.parquet`` per crawl dump and ``sample/10BT/00i_00000.parquet``,
    FineWeb's columns, a README whose configs name them (default: data/*/*, sample-10BT:
    sample/10BT/*). The sample's documents differ from the dumps'. Returns ``{path in repo:
    documents written}`` in path order."""
    folder = Path(root) / "datasets" / repo_id / "main"
    files = {f"data/{dump}/000_00000.parquet": (dump, 1 + k) for k, dump in enumerate(dumps)}
    files.update({f"sample/10BT/{i:03d}_00000.parquet": ("CC-MAIN-2024-10", 100 + i)
                  for i in range(sample_shards)})
    configs = "".join(f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {glob}\n"
                      for name, glob in (("default", "data/*/*"),
                                         ("sample-10BT", "sample/10BT/*")))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(f"---\nlicense: odc-by\nconfigs:\n{configs}---\n"
                                      f"# {repo_id}\nTest data shaped like FineWeb.\n")
    written = {}
    for path, (dump, k) in sorted(files.items()):
        docs = web_documents(docs_per_shard, seed=seed * 1000 + 500 + k)
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_fineweb_table(docs, dump, f"{k:03d}"), folder / path, row_group_size=16)
        written[path] = docs
    return written


#: two Pythia-shaped sizes for the suite tests: {hub id: (d_model, n_layers)}
SUITE_MODELS = {"EleutherAI/pythia-70m": (8, 2), "EleutherAI/pythia-160m": (16, 3)}
#: the steps of the paper's Figures 6-7 and two of the later grid
SUITE_STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 143000)


def build_pythia_suite_hub(root: Path, models: Mapping[str, tuple[int, int]] | None = None,
                           steps: Sequence[int] = SUITE_STEPS, docs_per_shard: int = 40,
                           lacking: Mapping[str, Sequence[int]] | None = None,
                           d_vocab: int = PYTHIA_D_VOCAB) -> dict:
    """Several Pythia-shaped models on one hub, sharing one tokenizer in the real one's format
    (50,277 ids, 50,304 embedding rows) as the Pythia sizes do: ``models`` {hub id: (d_model,
    n_layers)} (default :data:`SUITE_MODELS`, two sizes), each with the ``step{N}`` branches of
    ``steps`` (step1 serving step0's weights, ``main`` the last step's) but those in
    ``lacking[model]``; plus ``Skylion007/openwebtext`` and a FineWeb-shaped
    ``HuggingFaceFW/fineweb``. ``d_vocab``: the tokenizer's ids (the embedding rows padded to a
    multiple of 128, as Pythia's). Returns ``{"repos": {id: folder}, "fineweb": {path: docs}}``.
    """
    backend, first = pythia_like_backend(d_vocab), []
    rows = -(-d_vocab // 128) * 128  # 50,304 for Pythia's 50,277 ids
    repos = {}
    for k, (model, (d_model, n_layers)) in enumerate((models or SUITE_MODELS).items()):
        config = tiny_config(vocab_size=rows, hidden_size=d_model, num_hidden_layers=n_layers,
                             num_attention_heads=2, intermediate_size=2 * d_model)
        repo = repos[model] = Path(root) / model
        have = [s for s in steps if s not in set((lacking or {}).get(model, ()))]
        for step in have:
            folder = repo / f"step{step}"
            if step == 1 and 0 in have:  # as on the hub: step1 serves step0's weights
                shutil.copytree(repo / "step0", folder)
                continue
            write_checkpoint(folder, config, random_state_dict(config, seed=1000 * k + step),
                             "bin", 1, with_legacy_buffers=False)
            _tokenizer_into(folder, backend, first)
        shutil.copytree(repo / f"step{max(have)}", repo / "main")
    build_dataset_repo(root, "Skylion007/openwebtext", {"train": 2}, docs_per_shard)
    return {"repos": repos, "fineweb": build_fineweb_repo(root, docs_per_shard=docs_per_shard)}
