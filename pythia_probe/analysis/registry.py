"""Every analysis by name. Adding one: a module defining its :class:`Analysis`, and a line here."""

from __future__ import annotations

from collections.abc import Sequence

from pythia_probe.analysis.attention import ATTENTION, ATTENTION_LNFOLD
from pythia_probe.analysis.attention_text import ATTENTION_TEXT
from pythia_probe.analysis.base import Analysis
from pythia_probe.analysis.embedding import EMBEDDING, UNEMBEDDING
from pythia_probe.errors import BadInputError

REGISTRY: dict[str, Analysis] = {a.name: a for a in (
    EMBEDDING,
    ATTENTION,
    UNEMBEDDING,
    ATTENTION_TEXT,
    ATTENTION_LNFOLD,
)}


def get_analyses(names: Sequence[str]) -> list[Analysis]:
    """Look analyses up by name; unknown names raise a BadInputError listing the valid ones."""
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names:
        raise BadInputError(f"unknown analysis name(s) {unknown or list(names)}; valid: "
                            f"{', '.join(REGISTRY)}")
    return [REGISTRY[n] for n in names]
