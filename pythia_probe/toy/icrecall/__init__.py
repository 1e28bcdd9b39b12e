"""In-context factual recall (Huang, Nichani, Lee, Ge 2026): task, memories, PGD fine-tuning."""

from pythia_probe.lazy import faces

__all__ = ["ConstructedMemory", "EvalConfig", "ICRecallModel", "KnowledgeBase", "MemoryConfig",
           "PretrainedMemory", "Prompts", "TaskConfig", "TrainConfig", "TrainResult",
           "accuracy_metrics", "classify_state", "evaluate", "expected_confusing_fraction",
           "loss_grad_hessian", "make_kb", "pattern_metrics", "pretrain", "run_experiment",
           "sample_prompts", "train"]
__getattr__, __dir__ = faces(__name__, {
    ".curvature": ("classify_state", "loss_grad_hessian"),
    ".evaluate": ("accuracy_metrics", "evaluate", "pattern_metrics"),
    ".experiment": ("EvalConfig", "run_experiment"),
    ".memory": ("ConstructedMemory", "MemoryConfig"),
    ".model": ("ICRecallModel",),
    ".pretrained": ("PretrainedMemory", "pretrain"),
    ".task": (
        "KnowledgeBase",
        "Prompts",
        "TaskConfig",
        "expected_confusing_fraction",
        "make_kb",
        "sample_prompts",
    ),
    ".train": ("TrainConfig", "TrainResult", "train"),
})
