"""`python -m pythia_probe.sweep --conventions authors` reproduces the authors' own numbers.

Everything on the reference side is an independent float64 rendering of what the authors'
scripts compute (deeplearning-wisc/attn-dynamics-basis, read as a specification):
- the statistics: pythia.py's compute_theoretical_matrices and find_top_tokens, and
  pythia-per-head.py's Q_bar (the rendering of tests/test_stats_conventions.py);
- the model side: TransformerLens' HookedTransformer with its defaults (fold_ln,
  center_writing_weights) fed each kept token alone, rendered here with transformers'
  GPTNeoXForCausalLM in float64 and literal hooks (resid_pre, resid_pre + attn_out, resid_post)
  and the per-head W_Q, W_K split from query_key_value by hand, LN-folded and centred as
  TransformerLens does (W' = P diag(ln1_w) W, residual rows E P);
- the scores: compute_frobenius_cosine_similarity(_mids) and compute_attention_comparison, and
  the per-head script's compute_per_head_attention_comparison, with V x V covariances.
The sweep's table must equal them: embedding cos_post / cos_attn, attention_lnfold
cos_mean_authors (pythia.py) and cos_head_authors (pythia-per-head.py), and the theory's
orientation cos_mean (against Qbar, i.e. the rows of Q_bar^T).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from test_stats_conventions import T, authors, find_top_tokens, to_tokens

from pythia_probe.builtin_corpus import story
from pythia_probe.results import read_results
from pythia_probe.sweep.__main__ import main as sweep_main
from pythia_probe.testing.repos import random_state_dict, tiny_config, write_checkpoint
from pythia_probe.testing.tokenizers import pythia_like_backend, write_pythia_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

D_TOK, D_MODEL_ROWS, DOCS = 300, 320, 30  # the model pads the tokenizer's ids, as Pythia does


def _covariance(X: torch.Tensor) -> torch.Tensor:
    """compute_covariance_batched: rows centred by their own mean, C C^T / (ncols - 1)."""
    C = X - X.mean(dim=1, keepdim=True)
    return C @ C.T / (X.shape[1] - 1)


def _rownorm(M: torch.Tensor) -> torch.Tensor:
    """Their theoretical_matrix_scaled: rows divided by their L2 norm, zero rows left zero."""
    norms = M.norm(dim=1, keepdim=True)
    out = torch.zeros_like(M)
    keep = norms.squeeze(1) != 0
    out[keep] = M[keep] / norms[keep]
    return out


def _cosine(actual: torch.Tensor, theory: torch.Tensor) -> float:
    """cos(cov(actual) / ||.||, cov(rownorm(theory)) / ||.||) as their scripts compute it."""
    A, B = _covariance(actual), _covariance(_rownorm(theory))
    A, B = A / A.norm(), B / B.norm()
    return float(torch.trace(A.T @ B) / (A.norm() * B.norm()))


def _tl_model_side(folder, ids: list[int]):
    """TransformerLens' resid_pre, resid_pre + attn_out, resid_post of each token fed alone,
    and its folded, centred per-head W_Q, W_K, all float64 (see the module docstring)."""
    from transformers import GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM.from_pretrained(str(folder), dtype=torch.float64).eval()
    cfg = model.config
    d, H = cfg.hidden_size, cfg.num_attention_heads
    dh = d // H
    P = torch.eye(d, dtype=torch.float64) - 1.0 / d
    seen: dict[str, list] = {"pre": [], "attn_out": [], "post": []}

    def block(module, args, out) -> None:  # resid_pre in, resid_post out
        seen["pre"].append(args[0][:, 0])
        seen["post"].append(out[:, 0])

    def attention(module, args, out) -> None:  # (attn_output, weights)
        seen["attn_out"].append(out[0][:, 0])

    hooks = []
    for layer in model.gpt_neox.layers:
        hooks.append(layer.register_forward_hook(block))
        hooks.append(layer.attention.register_forward_hook(attention))
    with torch.no_grad():
        model(input_ids=torch.tensor(ids)[:, None])
    for h in hooks:
        h.remove()
    L = cfg.num_hidden_layers
    pre = [seen["pre"][i] @ P for i in range(L)]  # center_writing_weights: rows E P
    mid = [(seen["pre"][i] + seen["attn_out"][i]) @ P for i in range(L)]
    post = [seen["post"][i] @ P for i in range(L)]
    WQ, WK = [], []
    for layer in model.gpt_neox.layers:
        W = layer.attention.query_key_value.weight.detach().view(H, 3 * dh, d)
        fold = P @ torch.diag(layer.input_layernorm.weight.detach())  # fold_ln, centred
        WQ.append(torch.stack([fold @ W[h, :dh].T for h in range(H)]))
        WK.append(torch.stack([fold @ W[h, dh:2 * dh].T for h in range(H)]))
    return pre, mid, post, WQ, WK


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("authors")
    backend = pythia_like_backend(D_TOK, D_TOK, n_stories=60)
    model = root / "tiny"
    config = tiny_config(vocab_size=D_MODEL_ROWS, hidden_size=16, num_attention_heads=2,
                         intermediate_size=32, num_hidden_layers=2)
    for step in (0, 2):
        folder = model / f"step{step}"
        write_checkpoint(folder, config, random_state_dict(config, seed=step, dtype=torch.float32),
                         fmt="safetensors")
        write_pythia_tokenizer(folder, backend)
    corpus = root / "docs.jsonl"
    docs = [story(i, 0) for i in range(DOCS + 10)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return root, model, corpus, backend


@pytest.mark.parametrize("top_k", ["full", "40"])
def test_sweep_equals_the_authors_scripts(setup, top_k, tmp_path):
    from transformers import AutoTokenizer

    root, model, corpus, backend = setup
    out = tmp_path / "run"
    argv = ["--model", str(model), "--steps", "0,2", "--conventions", "authors",
            "--dataset", str(corpus), "--docs", str(DOCS), "--min-chars", str(4 * T),
            "--seq-len", str(T), "--top-k", top_k, "--groups", "0",
            "--analyses", "embedding,attention_lnfold", "--dtype", "float64",
            "--out", str(out), "--no-progress", "--no-plots"]
    assert sweep_main(argv) == 0
    df = read_results(out)
    tok = AutoTokenizer.from_pretrained(str(model / "step0"))
    texts = [t for t in (json.loads(line)["text"] for line in corpus.read_text().splitlines())
             if len(t) >= 4 * T][:DOCS]  # load_openwebtext_subset's rule: >= 4 max_length
    docs = [to_tokens(tok, t) for t in texts]
    ids = list(range(D_MODEL_ROWS)) if top_k == "full" else find_top_tokens(docs, int(top_k))
    th = authors(docs, ids, D_MODEL_ROWS)  # pythia.py's B_bar ... Q_bar, the per-head Q_bar
    for step in (0, 2):
        pre, mid, post, WQ, WK = _tl_model_side(model / f"step{step}", ids)
        got = df[df.step == step].set_index(["analysis", "metric", "layer", "head"])["value"]
        assert len(got) == len(pre) * (3 + 2 * (1 + WQ[0].shape[0]))
        for layer in range(len(pre)):
            A = torch.stack([WQ[layer][h] @ WK[layer][h].T
                             for h in range(WQ[layer].shape[0])]).mean(0)
            A = pre[layer] @ A @ pre[layer].T
            want = {("embedding", "cos_post"): _cosine(post[layer], th["B_bar_Phi_bar"]),
                    ("embedding", "cos_attn"): _cosine(mid[layer], th["B_bar_Phi_bar"]),
                    ("attention_lnfold", "cos_mean_authors"): _cosine(A, th["Q_bar"]),
                    ("attention_lnfold", "cos_mean"): _cosine(A, th["Q_bar"].T)}
            for (analysis, metric), v in want.items():
                assert got[(analysis, metric, layer + 1, pd.NA)] == pytest.approx(v, abs=1e-9), \
                    (step, layer, analysis, metric)
            for h in range(WQ[layer].shape[0]):
                Ah = pre[layer] @ WQ[layer][h] @ WK[layer][h].T @ pre[layer].T
                assert got[("attention_lnfold", "cos_head_authors", layer + 1, h)] == \
                    pytest.approx(_cosine(Ah, th["Q_bar_head"]), abs=1e-9), (step, layer, h)


def test_conventions_bad_input_is_one_line(setup, tmp_path, capsys, monkeypatch):
    """An unknown --conventions names the valid ones; --stats built under the paper's
    conventions is refused for --conventions authors (identity by content, never reused)."""
    from pythia_probe.cli import run_main
    from pythia_probe.stats.job import StatsConfig, compute

    root, model, corpus, _ = setup
    base = ["--model", str(model), "--steps", "0", "--out", str(tmp_path / "o"), "--no-progress"]
    with pytest.raises(SystemExit) as exit_:
        sweep_main([*base, "--conventions", "theirs"])
    assert exit_.value.code == 2
    assert "'paper', 'authors'" in capsys.readouterr().err
    paper = tmp_path / "paper.safetensors"
    compute(StatsConfig(dataset=str(corpus), tokenizer=str(model / "step0"), seq_len=T,
                        docs=DOCS, groups=0, progress=False, out=str(paper)))
    monkeypatch.delenv("PYTHIA_PROBE_TRACEBACK", raising=False)
    argv = [*base, "--stats", str(paper), "--conventions", "authors"]
    assert run_main(lambda: sweep_main(argv), "sweep") == 2
    err = [e for e in capsys.readouterr().err.splitlines() if e.startswith("sweep: error: ")]
    assert len(err) == 1 and "built with --conventions paper, not authors" in err[0]
