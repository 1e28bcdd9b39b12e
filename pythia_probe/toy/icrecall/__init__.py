"""In-context factual recall (Huang, Nichani, Lee, Ge 2026): task, memories, PGD fine-tuning."""

from pythia_probe.toy.icrecall.curvature import classify_state, loss_grad_hessian
from pythia_probe.toy.icrecall.evaluate import accuracy_metrics, evaluate, pattern_metrics
from pythia_probe.toy.icrecall.experiment import EvalConfig, run_experiment
from pythia_probe.toy.icrecall.memory import ConstructedMemory, MemoryConfig
from pythia_probe.toy.icrecall.model import ICRecallModel
from pythia_probe.toy.icrecall.pretrained import PretrainedMemory, pretrain
from pythia_probe.toy.icrecall.task import (
                                            KnowledgeBase,
                                            Prompts,
                                            TaskConfig,
                                            expected_confusing_fraction,
                                            make_kb,
                                            sample_prompts,
)
from pythia_probe.toy.icrecall.train import TrainConfig, TrainResult, train

__all__ = ["ConstructedMemory", "EvalConfig", "ICRecallModel", "KnowledgeBase", "MemoryConfig",
           "PretrainedMemory", "Prompts", "TaskConfig", "TrainConfig", "TrainResult",
           "accuracy_metrics", "classify_state", "evaluate", "expected_confusing_fraction",
           "loss_grad_hessian", "make_kb", "pattern_metrics", "pretrain", "run_experiment",
           "sample_prompts", "train"]
