"""The settings of the in-context recall experiment, one frozen dataclass per concern (each
field a flag of ``python -m pythia_probe.toy.icrecall``), in a module that imports no torch so
that ``--help`` stays quick: :class:`TaskConfig` (``task.py``), :class:`MemoryConfig`
(``memory.py``), :class:`TrainConfig` (``train.py``), :class:`EvalConfig` (``experiment.py``);
each is also a name of the module it configures."""

from __future__ import annotations

from dataclasses import dataclass, field

from pythia_probe.errors import BadInputError


@dataclass(frozen=True)
class TaskConfig:
    """Knowledge base and prompt shape.

    n_subjects: |S|; n_relations: |R| (even: relations are paired r <-> r^1); n_answers: N_A,
    shared by all relations; rho: probability that a subject has the same answer under r and its
    partner; k_pairs: in-context (subject, answer) pairs per prompt; seed: knowledge-base seed.
    """

    n_subjects: int = 100
    n_relations: int = 20
    n_answers: int = 1000
    rho: float = 0.2
    k_pairs: int = 2
    seed: int = field(default=0, metadata={"flag": "kb_seed"})

    def __post_init__(self) -> None:
        if self.n_relations < 2 or self.n_relations % 2:
            raise BadInputError(f"n_relations must be even and >= 2, got {self.n_relations}")
        if self.n_subjects < self.k_pairs + 1:
            raise BadInputError(f"n_subjects must be >= k_pairs + 1 = {self.k_pairs + 1}, "
                             f"got {self.n_subjects}")
        if self.n_answers < 2:
            raise BadInputError(f"n_answers must be >= 2, got {self.n_answers}")
        if not 0.0 <= self.rho < 1.0:
            raise BadInputError(f"rho must be in [0, 1), got {self.rho}")
        if self.k_pairs < 1:
            raise BadInputError(f"k_pairs must be >= 1, got {self.k_pairs}")

    @property
    def n_triples(self) -> int:
        """n = |S| |R| stored triples."""
        return self.n_subjects * self.n_relations

    @property
    def d_vocab(self) -> int:
        return self.n_subjects + self.n_answers + self.n_relations + 1

    @property
    def seq_len(self) -> int:
        """Positions s1 a1 .. sk ak s_{k+1} ? r*."""
        return 2 * self.k_pairs + 3


VOTES = ("product", "minpow", "andprod")
ROW_LAWS = ("softmax", "dirichlet")  # pre-training's attention-like rows (pretrained.py)
EMBEDDINGS = ("random", "onehot")
BETA_DEFAULT = {"constructed": 400.0, "pretrained": 2.0}


@dataclass(frozen=True)
class MemoryConfig:
    """kind: constructed | pretrained. embedding: random | onehot; d_model for random.
    vote, threshold, power, smooth: the constructed memory's AND unit (see module doc).
    beta: inverse temperature applied to memory logits (None: the kind's default, BETA_DEFAULT:
    400 for the constructed votes; 2 for the pre-trained MLP, i.e. twice its logits as trained,
    sharp enough that sampling from the ideal row is near-certain). Pre-trained MLP: d_hidden,
    pretrain_epochs, pretrain_lr, pretrain_mix (fraction of the pair examples that are two-pair
    prompts), pretrain_rows (fraction of all relation and answer examples that are whole prompts,
    s3 and '?' included, read through a random attention row), pretrain_threshold (a pair counts
    in a relation example's label when the product of its two weights exceeds it; none counted:
    the blank label, uniform over relations), pretrain_row_law ('softmax': rows softmax(s z),
    s ~ U(0, pretrain_row_sigma); 'dirichlet': Dirichlet(1) rows); see pretrained.py."""

    kind: str = "constructed"
    embedding: str = "random"
    d_model: int = 1024
    vote: str = "andprod"
    threshold: float = 0.035
    power: float = 1.0
    smooth: float = 0.0025
    beta: float | None = None
    d_hidden: int = 1024
    pretrain_epochs: int = 300
    pretrain_lr: float = 1e-2
    pretrain_mix: float = 0.75
    pretrain_rows: float = 0.5
    pretrain_threshold: float = 0.05
    pretrain_row_law: str = "softmax"
    pretrain_row_sigma: float = 3.0
    seed: int = field(default=0, metadata={"flag": "memory_seed"})

    def __post_init__(self) -> None:
        if self.kind not in ("constructed", "pretrained"):
            raise BadInputError("memory kind must be 'constructed' or 'pretrained', "
                             f"got {self.kind!r}")
        if self.embedding not in EMBEDDINGS:
            raise BadInputError(f"embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")
        if self.vote not in VOTES:
            raise BadInputError(f"vote must be one of {VOTES}, got {self.vote!r}")
        if self.kind == "pretrained" and self.embedding != "random":
            raise BadInputError("the pre-trained memory needs embedding='random'")
        for name in ("d_model", "d_hidden", "pretrain_epochs"):
            if getattr(self, name) < 1:
                raise BadInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad_beta = self.beta is not None and self.beta <= 0
        if bad_beta or self.power <= 0 or self.threshold < 0 or self.smooth < 0:
            raise BadInputError("beta and power must be > 0 and threshold, smooth >= 0, got "
                             f"beta={self.beta}, power={self.power}, threshold={self.threshold}, "
                             f"smooth={self.smooth}")
        if self.pretrain_row_law not in ROW_LAWS:
            raise BadInputError(f"pretrain_row_law must be one of {ROW_LAWS}, got "
                                f"{self.pretrain_row_law!r}")
        if self.pretrain_row_sigma < 0:
            raise BadInputError(f"pretrain_row_sigma must be >= 0, got {self.pretrain_row_sigma}")
        for name in ("pretrain_mix", "pretrain_rows", "pretrain_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BadInputError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def inverse_temperature(self) -> float:
        """beta, or the kind's default when beta is None."""
        return BETA_DEFAULT[self.kind] if self.beta is None else float(self.beta)


METHODS = ("pgd", "gd")
PERTURBATIONS = ("ball", "gaussian")


@dataclass(frozen=True)
class TrainConfig:
    """method: pgd | gd. n_train: N fine-tuning prompts (fixed, full batch). steps: total gradient
    steps (the large step counts as one). eta: small step size; eta0: PGD's first step; rho_p:
    perturbation radius; perturb: ball | gaussian. answer_weight: weight of the answer loss.
    log_every: history interval (steps). seed: training prompts and perturbation."""

    method: str = "pgd"
    n_train: int = 8
    steps: int = 2000
    eta: float = 0.1
    eta0: float = 2.0
    rho_p: float = 0.5
    perturb: str = "ball"
    answer_weight: float = 1.0
    log_every: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BadInputError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.perturb not in PERTURBATIONS:
            raise BadInputError(f"perturb must be one of {PERTURBATIONS}, got {self.perturb!r}")
        if self.n_train < 1 or self.steps < 1 or self.log_every < 1:
            raise BadInputError("n_train, steps and log_every must be >= 1, got "
                             f"{self.n_train}, {self.steps}, {self.log_every}")
        if self.eta <= 0 or self.eta0 <= 0 or self.rho_p < 0 or self.answer_weight < 0:
            raise BadInputError("eta, eta0 must be > 0 and rho_p, answer_weight >= 0")


@dataclass(frozen=True)
class EvalConfig:
    """n_test fresh prompts (seed test_seed, disjoint from training seeds by construction of the
    stream), n_monitor prompts for the curves (0 = none), decoding temperature (0 = argmax)."""

    n_test: int = 20000
    test_seed: int = 10**6
    n_monitor: int = 1000
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.n_test < 1 or self.n_monitor < 0 or self.temperature < 0:
            raise BadInputError(f"need n_test >= 1, n_monitor >= 0, temperature >= 0; got "
                             f"{self.n_test}, {self.n_monitor}, {self.temperature}")
