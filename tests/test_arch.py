"""arch.py against transformers' GPTNeoXForCausalLM on tiny random configs (float64)."""

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from pythia_probe import arch


def tiny_model(parallel: bool = True, seed: int = 0) -> GPTNeoXForCausalLM:
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(
        vocab_size=61, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=48, rotary_pct=0.5, rotary_emb_base=100.0, max_position_embeddings=64,
        use_parallel_residual=parallel, tie_word_embeddings=False,
    )
    m = GPTNeoXForCausalLM(cfg).double().eval()
    with torch.no_grad():  # biases are zero at init: make them large like Pythia's Q/K biases
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)
    m.config._attn_implementation = "eager"
    return m


def hub_state_dict(m) -> dict:
    sd = dict(m.state_dict())
    sd["embed_out.weight"] = sd.pop("lm_head.weight")
    return sd


@pytest.mark.parametrize("parallel", [True, False])
def test_attention_probs_match_hf(parallel):
    m = tiny_model(parallel)
    w = arch.NeoXWeights(hub_state_dict(m), arch.NeoXConfig.from_hf(m.config))
    assert w.cfg.rotary_dim == 4 and w.cfg.d_head == 8 and w.cfg.parallel_residual == parallel
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        out = m(ids, output_attentions=True, output_hidden_states=True)
    for layer in range(3):
        probs = arch.attention_probs(w, layer, out.hidden_states[layer])
        # HF computes the rotary tables and the softmax in float32: agreement to ~1e-7
        torch.testing.assert_close(probs, out.attentions[layer], rtol=0, atol=1e-6)


@pytest.mark.parametrize("parallel", [True, False])
def test_single_token_residuals_match_hf_hidden_states(parallel):
    m = tiny_model(parallel, seed=1)
    w = arch.NeoXWeights(hub_state_dict(m), arch.NeoXConfig.from_hf(m.config))
    tokens = torch.arange(61)
    r = arch.single_token_residuals(w, tokens, batch_size=16, dtype=torch.float64)
    assert r["pre"].shape == (3, 61, 32)
    with torch.no_grad():
        hs = m(tokens[:, None], output_hidden_states=True).hidden_states
    for layer in range(3):
        torch.testing.assert_close(r["pre"][layer], hs[layer][:, 0], rtol=1e-10, atol=1e-10)
    for layer in range(2):
        torch.testing.assert_close(r["post"][layer], hs[layer + 1][:, 0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(arch.final_ln(w, r["post"][2]), hs[3][:, 0], rtol=1e-10, atol=1e-10)


def test_attn_residual_matches_hf_attention_module():
    m = tiny_model(True, seed=2)
    w = arch.NeoXWeights(hub_state_dict(m), arch.NeoXConfig.from_hf(m.config))
    tokens = torch.tensor([3, 0, 60, 7])
    r = arch.single_token_residuals(w, tokens, dtype=torch.float64)
    layer = m.gpt_neox.layers[1]
    x = r["pre"][1][:, None]
    pos = m.gpt_neox.rotary_emb(x, torch.zeros(1, 1, dtype=torch.long))
    with torch.no_grad():
        h = layer.input_layernorm(x)
        a, _ = layer.attention(h, attention_mask=None, position_embeddings=pos)
    torch.testing.assert_close(r["attn"][1], (x + a)[:, 0], rtol=1e-10, atol=1e-10)


def test_W_E_W_U_are_views_of_loaded_tensors():
    m = tiny_model()
    sd = hub_state_dict(m)
    w = arch.NeoXWeights(sd, arch.NeoXConfig.from_hf(m.config))
    assert w.W_E.data_ptr() == sd["gpt_neox.embed_in.weight"].data_ptr()
    assert w.W_U.untyped_storage().data_ptr() == sd["embed_out.weight"].untyped_storage().data_ptr()
    assert w.W_U.shape == (32, 61) and torch.equal(w.W_U, sd["embed_out.weight"].T)
    L = w.layer(0)
    qkv = sd["gpt_neox.layers.0.attention.query_key_value.weight"]
    assert L.W_Q.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()


def test_split_qkv_against_per_head_reference():
    m = tiny_model()
    sd = hub_state_dict(m)
    w = arch.NeoXWeights(sd, arch.NeoXConfig.from_hf(m.config))
    qkv = sd["gpt_neox.layers.2.attention.query_key_value.weight"]
    b = sd["gpt_neox.layers.2.attention.query_key_value.bias"]
    dense = sd["gpt_neox.layers.2.attention.dense.weight"]
    L = w.layer(2)
    for h in range(4):  # rows of head h: [q(8), k(8), v(8)] at offset 24*h
        rows = slice(24 * h, 24 * h + 8)
        assert torch.equal(L.W_Q[h], qkv[rows].T) and torch.equal(L.b_Q[h], b[rows])
        assert torch.equal(L.W_K[h], qkv[24 * h + 8 : 24 * h + 16].T)
        assert torch.equal(L.W_V[h], qkv[24 * h + 16 : 24 * h + 24].T)
        assert torch.equal(L.W_O[h], dense[:, 8 * h : 8 * h + 8].T)


def test_legacy_buffers_and_name_filter():
    assert arch.is_legacy_buffer("gpt_neox.layers.3.attention.bias")
    assert arch.is_legacy_buffer("gpt_neox.layers.0.attention.rotary_emb.inv_freq")
    assert not arch.is_legacy_buffer("gpt_neox.layers.3.attention.dense.bias")
    f = arch.name_filter("embed", "unembed")
    assert f("gpt_neox.embed_in.weight") and f("embed_out.weight")
    assert not f("gpt_neox.layers.0.mlp.dense_h_to_4h.weight")
    with pytest.raises(ValueError, match="valid: embed"):
        arch.name_filter("embedding")


PYTHIA_14B = {
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 16, "num_hidden_layers": 24,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
    "use_parallel_residual": True, "vocab_size": 50304,
}


def test_pythia_config_json():
    c = arch.NeoXConfig.from_dict(PYTHIA_14B)
    assert (c.d_model, c.n_heads, c.d_head, c.rotary_dim, c.d_vocab) == (2048, 16, 128, 32, 50304)
    assert c.parallel_residual and not c.tied_embeddings


@pytest.mark.parametrize(
    "change, match",
    [
        ({"sliding_window": 4}, "unknown fields: sliding_window"),
        ({"rope_scaling": {"type": "linear", "factor": 2}}, "rope_scaling"),
        ({"model_type": "llama"}, "model_type"),
        ({"hidden_act": "swiglu"}, "hidden_act"),
        ({"attention_bias": False}, "attention_bias"),
        ({"head_dim": 64}, "head_dim"),
    ],
)
def test_refuses_configs_it_does_not_understand(change, match):
    with pytest.raises(arch.UnsupportedConfigError, match=match):
        arch.NeoXConfig.from_dict({**PYTHIA_14B, **change})


def test_from_hf_module_uses_its_parameters():
    m = tiny_model(False, seed=3)
    w = arch.NeoXWeights.from_module(m)
    assert w.W_U.data_ptr() == m.lm_head.weight.data_ptr()
    assert w.W_E.data_ptr() == m.gpt_neox.embed_in.weight.data_ptr()
    r = arch.single_token_residuals(w, torch.tensor([5, 9]), dtype=torch.float64)
    with torch.no_grad():
        logits = m(torch.tensor([[5], [9]])).logits[:, 0]
    ours = arch.final_ln(w, r["post"][-1]) @ w.W_U
    torch.testing.assert_close(ours, logits, rtol=1e-10, atol=1e-10)
