"""The Qwen2 decoder against transformers (torch, float32): one layer, M-RoPE, sensitivities, greedy decode."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import GenerationConfig
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

from models import family, qwen2, registry
from wq_jax import cache as kv_cache
from wq_jax import methods

FAMILY = registry.get("llava_onevision")


def _np(t):
  return t.detach().numpy()


def _assert_close(got, want, rtol):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  err = np.abs(got - want).max()
  assert err <= rtol * np.abs(want).max(), (err, np.abs(want).max())


def _causal_padding_mask(mask):
  """transformers' additive 4-D mask for a right-padded batch."""
  t = mask.shape[1]
  allowed = np.tril(np.ones((t, t), bool))[None] & mask[:, None, :].astype(bool)
  return torch.tensor(np.where(allowed, 0.0, np.finfo(np.float32).min)[:, None], dtype=torch.float32)


def test_decoder_layer_matches_transformers(llava_hf, llava_converted):
  cfg = llava_converted.cfg.text
  lm = llava_hf.model.model.language_model
  rng = np.random.default_rng(0)
  b, t = 2, 37
  h = rng.standard_normal((b, t, cfg.hidden_size)).astype(np.float32)
  mask = np.ones((b, t), np.int32)
  mask[1, 30:] = 0
  pos = np.broadcast_to(np.arange(t), (b, t)) + 100  # offset positions: RoPE must use them
  layer_hf = lm.layers[1]
  with torch.no_grad():
    ht, pt = torch.tensor(h), torch.tensor(pos)
    cos_sin = lm.rotary_emb(ht, pt)
    want = _np(layer_hf(ht, attention_mask=_causal_padding_mask(mask), position_embeddings=cos_sin))
    x = layer_hf.input_layernorm(ht)
    heads = lambda y: y.view(b, t, -1, cfg.head_dim).transpose(1, 2)
    _, k_want = apply_rotary_pos_emb(heads(layer_hf.self_attn.q_proj(x)), heads(layer_hf.self_attn.k_proj(x)),
                                     *cos_sin)
    v_want = heads(layer_hf.self_attn.v_proj(x))
  lp = jax.tree.map(lambda x: x[1], llava_converted.params["decoder"]["layers"])
  cos, sin = qwen2.rope(cfg, jnp.asarray(pos))
  got, k, v, _ = qwen2.layer(lp, cfg, jnp.asarray(h), cos, sin, jnp.asarray(mask))
  valid = mask.astype(bool)
  _assert_close(np.asarray(got)[valid], want[valid], 1e-5)
  _assert_close(k, _np(k_want), 1e-5)  # post-RoPE, head-major [B, K, T, H]
  _assert_close(v, _np(v_want), 1e-5)


def test_mrope_matches_qwen2_vl_rotary_embedding():
  section = [2, 3, 3]  # head dim 16
  hf_cfg = Qwen2VLTextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                             intermediate_size=32, vocab_size=50,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section})
  cfg = qwen2.Qwen2Config.from_hf(hf_cfg.to_dict())
  assert cfg.mrope_section == tuple(section)
  pos = np.random.default_rng(1).integers(0, 600, (3, 2, 29))
  with torch.no_grad():
    cos_want, sin_want = Qwen2VLRotaryEmbedding(hf_cfg)(torch.zeros(1, dtype=torch.float32), torch.tensor(pos))
  cos, sin = qwen2.rope(cfg, jnp.asarray(pos))
  _assert_close(cos, _np(cos_want), 1e-5)
  _assert_close(sin, _np(sin_want), 1e-5)
  # Text-only positions [B, T] stand for three equal rows.
  cos2, _ = qwen2.rope(cfg, jnp.asarray(pos[0]))
  np.testing.assert_array_equal(cos2, qwen2.rope(cfg, jnp.asarray(np.stack([pos[0]] * 3)))[0])


def test_sensitivity_is_the_cosine_across_each_attention_block(llava_hf, llava_converted):
  """SPEC Eq. 9 from the hidden states transformers computes, captured with hooks."""
  cfg = llava_converted.cfg.text
  lm = llava_hf.model.model.language_model
  rng = np.random.default_rng(2)
  ids = rng.integers(5, cfg.vocab_size, (2, 48))
  mask = np.ones_like(ids)
  mask[0, 40:] = 0
  seen = {}
  hooks = []
  for i, layer in enumerate(lm.layers):
    hooks.append(layer.register_forward_pre_hook(
        functools.partial(lambda i, m, args, kwargs: seen.__setitem__(("in", i), args[0] if args else
                                                                      kwargs["hidden_states"]), i), with_kwargs=True))
    hooks.append(layer.self_attn.register_forward_hook(
        functools.partial(lambda i, m, args, out: seen.__setitem__(("attn", i), out[0]), i)))
  try:
    with torch.no_grad():
      llava_hf.model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  finally:
    for h in hooks:
      h.remove()
  want = []
  for i in range(cfg.num_layers):
    h_in = _np(seen["in", i])
    h_out = h_in + _np(seen["attn", i])
    cos = (h_in * h_out).sum(-1) / (np.linalg.norm(h_in, axis=-1) * np.linalg.norm(h_out, axis=-1))
    want.append(np.clip((cos * mask).sum(-1) / mask.sum(-1), 0, 1))
  e = FAMILY.embed_inputs(llava_converted.params, llava_converted.cfg, {"input_ids": ids, "attention_mask": mask})
  out = family.prefill(llava_converted.params["decoder"], cfg, e.embeds, e.positions, e.attention_mask)
  np.testing.assert_allclose(out.sensitivity, np.stack(want), atol=1e-5)
  last = family.prefill(llava_converted.params["decoder"], cfg, e.embeds, e.positions, e.attention_mask,
                        last_only=True)
  np.testing.assert_allclose(last.logits, np.asarray(out.logits)[[0, 1], [39, 47]], rtol=1e-6, atol=1e-6)
  assert out.keys.shape == (cfg.num_layers, 2, cfg.num_kv_heads, 48, cfg.head_dim)


def test_greedy_decode_matches_transformers_for_16_steps(llava_hf, llava_converted):
  """Video prompt, prefill -> fp16-method cache -> 15 decode steps; tokens equal, logits close."""
  params, cfg = llava_converted.params, llava_converted.cfg
  rng = np.random.default_rng(3)
  frames, steps, start = 8, 16, 7
  num_visual = frames * cfg.tokens_per_frame + 1
  ids = rng.integers(5, cfg.text.vocab_size, (2, num_visual + 30))
  ids[:, start:start + num_visual] = cfg.video_token_id
  pixels = rng.standard_normal((2, frames, 3, 70, 70)).astype(np.float32)
  inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "pixel_values_videos": pixels}

  with torch.no_grad():
    gen = llava_hf.model.generate(
        **{k: torch.tensor(v) for k, v in inputs.items()},
        generation_config=GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0),
        output_logits=True, return_dict_in_generate=True)
  want_tokens = _np(gen.sequences[:, ids.shape[1]:])
  want_logits = np.stack([_np(x) for x in gen.logits], axis=1)
  assert len(np.unique(want_tokens)) > 8  # a varied continuation, not one repeated token

  e = FAMILY.embed_inputs(params, cfg, inputs)
  out = family.prefill(params["decoder"], cfg.text, e.embeds, e.positions, e.attention_mask, last_only=True)
  method, mcfg = methods.resolve("fp16")
  seq_lens = [ids.shape[1]] * 2
  plan_inputs = methods.PlanInputs(
      scores=np.zeros((2, num_visual // mcfg.window_size)), sensitivity=np.asarray(out.sensitivity).mean(-1),
      num_layers=cfg.text.num_layers, visual_start=start, num_visual=num_visual, seq_lens=seq_lens)
  opts = method.cache_options(mcfg)
  cache = kv_cache.build_cache(out.keys, out.values, method.plan(mcfg, plan_inputs), visual_start=start,
                               num_visual=num_visual, seq_lens=seq_lens, max_new_tokens=steps,
                               window_size=opts.window_size, value_channel_group=opts.value_channel_group,
                               meta_dtype=opts.meta_dtype)
  step = jax.jit(qwen2.decode_step, static_argnames=("cfg", "implementation", "norms"))

  def decode(norms, cache):
    logits = [out.logits]
    for i in range(steps - 1):
      token = jnp.argmax(logits[-1], axis=-1).astype(jnp.int32)
      position = jnp.full((2,), ids.shape[1] + i, jnp.int32)
      nxt, cache = step(params["decoder"], cfg.text, token, position, cache, norms=norms)
      logits.append(nxt)
    return np.stack([np.asarray(x) for x in logits], axis=1)

  logits = decode("xla", cache)
  np.testing.assert_array_equal(logits.argmax(-1), want_tokens)
  _assert_close(logits, want_logits, 1e-3)
  # Each residual add fused with the norm after it (one Pallas launch; interpret mode here): the same logits
  fused = decode("pallas", cache)
  np.testing.assert_array_equal(fused.argmax(-1), want_tokens)
  np.testing.assert_allclose(fused, logits, rtol=0, atol=1e-4)
