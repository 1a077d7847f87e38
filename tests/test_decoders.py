"""Llama (Vicuna), Mistral and InternLM2-style decoders are `models.qwen2` under other configs:
one layer and a whole 520-token prefill against transformers' LlamaForCausalLM / MistralForCausalLM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from convert.framework import Table, convert_tensors
from convert.tables import qwen2 as qwen2_table
from models import family, qwen2, testing

# model_type -> config overrides: a plain Llama, Llama with attention biases (q, k, v and o),
# Mistral with a 64-token sliding window (exercised by the 520-token prompt).
VARIANTS = {
  "llama": ("llama", {"rms_norm_eps": 1e-5}),
  "llama_bias": ("llama", {"attention_bias": True, "head_dim": 24}),
  "mistral": (
    "mistral",
    {"sliding_window": 64, "num_key_value_heads": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
  ),
}
BASE = {
  "vocab_size": 300,
  "hidden_size": 64,
  "intermediate_size": 96,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "max_position_embeddings": 4096,
  "tie_word_embeddings": False,
}


def _close(got, want, rtol):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  err = np.abs(got - want).max()
  assert err <= rtol * np.abs(want).max(), (err, np.abs(want).max())


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def decoder(request):
  """(torch model, our config, our params) from the same random weights."""
  model_type, overrides = VARIANTS[request.param]
  hf_cfg = transformers.CONFIG_MAPPING[model_type](**{**BASE, **overrides})
  torch.manual_seed(0)
  model = getattr(transformers, f"{model_type.capitalize()}ForCausalLM")(hf_cfg)
  testing.randomize_(model, seed=1)
  model.eval()
  cfg = qwen2.Qwen2Config.from_hf(hf_cfg.to_dict())
  table = Table(rules=qwen2_table.rules(cfg, path="decoder", hf="model."))
  abstract = {"decoder": jax.eval_shape(lambda k: qwen2.init(cfg, k), jax.random.key(0))}
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  params = jax.tree.map(jnp.asarray, convert_tensors(table, abstract, state))["decoder"]
  return model, cfg, params


def test_configs_parse_to_the_right_biases_and_window(decoder):
  model, cfg, params = decoder
  c = model.config
  assert cfg.qkv_bias == cfg.o_bias == bool(getattr(c, "attention_bias", False))
  assert ("b" in params["layers"]["o"]) == cfg.o_bias
  assert cfg.sliding_window == getattr(c, "sliding_window", None)
  assert cfg.rms_norm_eps == c.rms_norm_eps and cfg.head_dim == c.head_dim


def test_decoder_layer_matches_transformers(decoder):
  model, cfg, params = decoder
  lm = model.model
  rng = np.random.default_rng(0)
  b, t = 2, 37
  h = rng.standard_normal((b, t, cfg.hidden_size)).astype(np.float32)
  pos = np.broadcast_to(np.arange(t), (b, t)) + 100
  layer_hf = lm.layers[1]
  causal = np.tril(np.ones((t, t), bool))
  mask4 = torch.tensor(np.where(causal, 0.0, np.finfo(np.float32).min)[None, None], dtype=torch.float32)
  with torch.no_grad():
    ht = torch.tensor(h)
    cos_sin = lm.rotary_emb(ht, torch.tensor(pos))
    want = layer_hf(ht, attention_mask=mask4, position_embeddings=cos_sin).numpy()
    x = layer_hf.input_layernorm(ht)
    heads = lambda y: y.view(b, t, -1, cfg.head_dim).transpose(1, 2)
    _, k_want = apply_rotary_pos_emb(heads(layer_hf.self_attn.q_proj(x)), heads(layer_hf.self_attn.k_proj(x)), *cos_sin)
  lp = jax.tree.map(lambda x: x[1], params["layers"])
  cos, sin = qwen2.rope(cfg, jnp.asarray(pos))
  full = qwen2.Qwen2Config(**{**cfg.__dict__, "sliding_window": None})  # the 37 tokens fit any window
  got, k, _, _ = qwen2.layer(lp, full, jnp.asarray(h), cos, sin, jnp.ones((b, t), jnp.int32))
  _close(got, want, 1e-5)
  _close(k, k_want.numpy(), 1e-5)


def test_long_prompt_prefill_logits_match(decoder):
  model, cfg, params = decoder
  rng = np.random.default_rng(4)
  ids = rng.integers(0, cfg.vocab_size, (2, 520))
  mask = np.ones_like(ids)
  mask[1, 470:] = 0
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
  embeds = qwen2.embed(params, jnp.asarray(ids))
  m = jnp.asarray(mask)
  got = np.asarray(family.prefill(params, cfg, embeds, qwen2.text_positions(m), m).logits)
  valid = mask.astype(bool)
  _close(got[valid], want[valid], 1e-3)
  assert (got[valid].argmax(-1) == want[valid].argmax(-1)).all()
