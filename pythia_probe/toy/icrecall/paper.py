"""What the IC-recall paper states (Huang, Nichani, Lee, Ge 2026; only its abstract and a summary
were available), and one run's numbers beside it with the settings that produced them."""

from __future__ import annotations

from pythia_probe.toy.icrecall.memory import MemoryConfig
from pythia_probe.toy.icrecall.task import TaskConfig
from pythia_probe.toy.icrecall.train import TrainConfig

#: the paper's claims the command reports against
RELATION = 0.999  # ">= 99.9% accuracy on relation inference"
ANSWER = "near-perfect"
PATTERN = "v* = (a, a, 1/2-a, 1/2-a, 0, 0) over (s1, a1, s2, a2, s3, ?)"
SAMPLES = "often about 8"


def settings_line(task: TaskConfig, mem: MemoryConfig, tr: TrainConfig, n_test: int) -> str:
    """The settings of one run, in the words of the spec."""
    if mem.kind == "constructed":
        memory = (f"constructed {mem.vote} memory (threshold {mem.threshold:g}, smooth "
                  f"{mem.smooth:g})")
    else:
        memory = (f"pre-trained MLP memory (d_hidden {mem.d_hidden}, {mem.pretrain_epochs} "
                  f"epochs, rows {mem.pretrain_rows:g} {mem.pretrain_row_law}, AND threshold "
                  f"{mem.pretrain_threshold:g})")
    method = (f"PGD (eta0 {tr.eta0:g}, rho_p {tr.rho_p:g}, eta {tr.eta:g})" if tr.method == "pgd"
              else f"GD (eta {tr.eta:g})")
    return (f"settings: n = {task.n_triples} triples (|S| {task.n_subjects}, |R| "
            f"{task.n_relations}, N_A {task.n_answers}, rho {task.rho:g}, k {task.k_pairs} "
            f"pairs), {memory}, d {mem.d_model}, beta {mem.inverse_temperature:g}; {method}, "
            f"{tr.steps} steps on N = {tr.n_train} prompts; {n_test} fresh test prompts")


def comparison_lines(m: dict[str, float], task: TaskConfig, mem: MemoryConfig, tr: TrainConfig,
                     n_test: int) -> list[str]:
    """Our headline numbers beside the paper's, then the settings."""
    k = task.k_pairs
    row = [m[f"attn_{x}{i}"] for i in range(1, k + 1) for x in "sa"]
    row += [m["attn_s_query"], m["attn_last"]]
    ours_row = "(" + ", ".join(f"{v:.3f}" for v in row) + ")"
    lines = [f"{'':34s} {'ours':>26s}   paper",
             f"{'relation accuracy (sampled)':34s} {m['relation_sampled']:>26.5f}   >= {RELATION}",
             f"{'  on confusing prompts':34s} {m['relation_sampled_confusing']:>26.5f}"]
    if m.get("answer_sampled") == m.get("answer_sampled"):
        lines.append(f"{'answer accuracy (sampled)':34s} {m['answer_sampled']:>26.5f}   {ANSWER}")
    lines += [f"{'relation / answer accuracy (argmax)':34s} "
              f"{m['relation_acc']:>12.5f} / {m.get('answer_acc', float('nan')):<11.5f}   "
              "(low-temperature decoding)",
              f"{'attention row at ?':34s} {ours_row}   {PATTERN}",
              f"{'  within-pair gap, mass on s3 + ?':34s} "
              f"{m['pair_gap_max']:>12.3f}, {m['offpair_mass']:<11.3f}   0, 0",
              f"{'fine-tuning prompts N':34s} {tr.n_train:>26d}   {SAMPLES}",
              settings_line(task, mem, tr, n_test)]
    return lines
