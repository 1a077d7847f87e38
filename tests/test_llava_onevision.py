"""LLaVA-OneVision against transformers (torch, float32): SigLIP, projector, pooling, whole-model logits.

The whole-model checks go through save_pretrained -> python -m convert
--dtype float32 -> load_checkpoint (the `llava_converted` fixture).
"""
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionModel

from models import llava_onevision, registry, siglip

FAMILY = registry.get("llava_onevision")


def _np(t):
  return t.detach().numpy()


def _layer(stack, i):
  return jax.tree.map(lambda x: x[i], stack)


def _assert_close(got, want, rtol=1e-3):
  """Max error within rtol of the max |reference|."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  err = np.abs(got - want).max()
  assert err <= rtol * np.abs(want).max(), (err, np.abs(want).max())


def _hf_logits(model, **inputs):
  with torch.no_grad():
    args = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    return _np(model(**args).logits)


def _assert_logits_match(got, want, mask):
  valid = np.asarray(mask, bool)
  got, want = np.asarray(got)[valid], want[valid]
  err = np.abs(got - want).max()
  assert err <= 1e-3 * np.abs(want).max(), (err, np.abs(want).max())
  assert (got.argmax(-1) == want.argmax(-1)).mean() == 1.0


def test_siglip_encoder_layer_matches_transformers(llava_hf, llava_converted):
  rng = np.random.default_rng(1)
  h = rng.standard_normal((3, 25, 32)).astype(np.float32)
  with torch.no_grad():
    want = _np(llava_hf.model.model.vision_tower.encoder.layers[1](torch.tensor(h), attention_mask=None))
  lp = _layer(llava_converted.params["vision"]["layers"], 1)
  _assert_close(siglip.encoder_layer(lp, llava_converted.cfg.vision, jnp.asarray(h)), want, rtol=1e-5)


def test_siglip_tower_returns_transformers_hidden_states(llava_hf, llava_converted):
  cfg = llava_converted.cfg
  pixels = np.random.default_rng(2).standard_normal((2, 3, 70, 70)).astype(np.float32)
  with torch.no_grad():
    out = llava_hf.model.model.vision_tower(torch.tensor(pixels), output_hidden_states=True)
  features, states = siglip.forward(llava_converted.params["vision"], cfg.vision, jnp.asarray(pixels), (0, 1, 2, -2))
  _assert_close(features, _np(out.last_hidden_state), rtol=1e-5)
  for got, i in zip(states, (0, 1, 2, -2)):
    _assert_close(got, _np(out.hidden_states[i]), rtol=1e-5)


def test_projector_matches_transformers(llava_hf, llava_converted):
  x = np.random.default_rng(3).standard_normal((4, 9, 32)).astype(np.float32)
  with torch.no_grad():
    want = _np(llava_hf.model.model.multi_modal_projector(torch.tensor(x)))
  _assert_close(llava_onevision.project(llava_converted.params, llava_converted.cfg, jnp.asarray(x)), want, 1e-5)


@pytest.mark.parametrize("grid", [27, 5, 4])
def test_video_pooling_matches_apply_pooling(llava_converted, grid):
  cfg = llava_converted.cfg
  cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, image_size=grid * 14))
  x = np.random.default_rng(grid).standard_normal((3, grid * grid, 8)).astype(np.float32)
  hf_self = types.SimpleNamespace(config=types.SimpleNamespace(
      vision_config=types.SimpleNamespace(image_size=grid * 14, patch_size=14)))
  want = _np(LlavaOnevisionModel.apply_pooling(hf_self, torch.tensor(x)))
  got = llava_onevision.pool_frames(cfg, jnp.asarray(x))
  assert got.shape == (3, cfg.tokens_per_frame, 8) == want.shape
  _assert_close(got, want, rtol=1e-6)


@pytest.mark.parametrize("size_in,size_out", [((9, 13), (4, 6)), ((5, 7), (11, 3)), ((27, 27), (14, 14))])
def test_bilinear_resize_matches_torch_interpolate(size_in, size_out):
  x = np.random.default_rng(0).standard_normal((2, *size_in, 3)).astype(np.float32)
  want = torch.nn.functional.interpolate(torch.tensor(x).permute(0, 3, 1, 2), size_out, mode="bilinear")
  got = llava_onevision.bilinear_resize(jnp.asarray(x), size_out)
  _assert_close(got, _np(want.permute(0, 2, 3, 1)), rtol=1e-6)


def test_text_prefill_logits_match_on_a_long_prompt(llava_hf, llava_converted):
  rng = np.random.default_rng(4)
  ids = rng.integers(5, llava_converted.cfg.text.vocab_size, (2, 520))
  mask = np.ones_like(ids)
  mask[1, 470:] = 0  # right padding
  got = FAMILY.logits(llava_converted.params, llava_converted.cfg, {"input_ids": ids, "attention_mask": mask})
  _assert_logits_match(got, _hf_logits(llava_hf.model, input_ids=ids, attention_mask=mask), mask)


def _with_media(rng, cfg, token_id, count, length, vocab):
  ids = rng.integers(5, vocab, length)
  ids[7:7 + count] = token_id
  return ids


def test_video_prefill_logits_match(llava_hf, llava_converted):
  cfg = llava_converted.cfg
  rng = np.random.default_rng(5)
  frames = 3
  count = frames * cfg.tokens_per_frame + 1
  ids = np.stack([_with_media(rng, cfg, cfg.video_token_id, count, 70, cfg.text.vocab_size) for _ in range(2)])
  mask = np.ones_like(ids)
  mask[0, 60:] = 0
  pixels = rng.standard_normal((2, frames, 3, 70, 70)).astype(np.float32)
  inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values_videos": pixels}
  got = FAMILY.logits(llava_converted.params, cfg, inputs)
  _assert_logits_match(got, _hf_logits(llava_hf.model, **inputs), mask)
  embedded = FAMILY.embed_inputs(llava_converted.params, cfg, inputs)
  np.testing.assert_array_equal(embedded.visual_mask, ids == cfg.video_token_id)


@pytest.mark.parametrize("aspect", ["anyres_max_9", "anyres_max_1"])
def test_anyres_image_logits_match(llava_hf, llava_converted, aspect):
  """One image of 100x230 px: base tile + a 2x3 tile grid, unpadded (and shrunk under anyres_max_1)."""
  cfg = dataclasses.replace(llava_converted.cfg, max_num_patches=int(aspect.strip("anyres_max_")))
  rng = np.random.default_rng(6)
  sizes = np.array([[100, 230]])
  tiles = llava_onevision.num_tiles(cfg, (100, 230))
  pixels = rng.standard_normal((1, tiles, 3, 70, 70)).astype(np.float32)
  count = llava_onevision.image_features(llava_converted.params, cfg, pixels, sizes)[0].shape[0]
  ids = _with_media(rng, cfg, cfg.image_token_id, count, count + 20, cfg.text.vocab_size)[None]
  inputs = {"input_ids": ids, "pixel_values": pixels, "image_sizes": sizes}
  got = FAMILY.logits(llava_converted.params, cfg, inputs)
  hf_config = llava_hf.model.model.config  # the forward reads the ratio from its config only
  saved, hf_config.vision_aspect_ratio = hf_config.vision_aspect_ratio, aspect
  try:
    want = _hf_logits(llava_hf.model, **inputs)
  finally:
    hf_config.vision_aspect_ratio = saved
  _assert_logits_match(got, want, np.ones_like(ids))


def test_multi_image_logits_match(llava_hf, llava_converted):
  """Two images in one sample: one tile each, plus a newline."""
  cfg = llava_converted.cfg
  rng = np.random.default_rng(7)
  pixels = rng.standard_normal((2, 4, 3, 70, 70)).astype(np.float32)
  sizes = np.array([[70, 70], [90, 150]])
  count = 2 * (cfg.vision.grid ** 2 + 1)
  ids = _with_media(rng, cfg, cfg.image_token_id, count, count + 15, cfg.text.vocab_size)[None]
  inputs = {"input_ids": ids, "pixel_values": pixels, "image_sizes": sizes, "batch_num_images": np.array([2])}
  got = FAMILY.logits(llava_converted.params, cfg, inputs)
  _assert_logits_match(got, _hf_logits(llava_hf.model, **inputs), np.ones_like(ids))


def test_token_count_mismatch_is_an_error(llava_converted):
  cfg = llava_converted.cfg
  ids = np.full((1, 10), 7)
  ids[0, :5] = cfg.video_token_id
  pixels = np.zeros((1, 1, 3, 70, 70), np.float32)
  with pytest.raises(ValueError, match="tokens: 5, features: 10"):
    FAMILY.embed_inputs(llava_converted.params, cfg, {"input_ids": ids, "pixel_values_videos": pixels})


def test_variant_config_through_convert(tmp_path, tiny_tokenizer):
  """Tied embeddings, explicit head_dim, two feature layers, no projector bias, SigLIP's unused
  pooling head present in the checkpoint, exact GELU: video and text logits still match."""
  from convert.__main__ import main as convert_main
  from convert.checkpoint import load_checkpoint
  from models import testing

  model = testing.save_tiny_llava_onevision(
      tmp_path / "hf", seed=1, tie_word_embeddings=True, vision_feature_layer=[0, -1],
      multimodal_projector_bias=False, vision_config={"vision_use_head": True, "hidden_act": "gelu"},
      text_config={"head_dim": 24, "tie_word_embeddings": True, "num_key_value_heads": 1})
  assert convert_main([str(tmp_path / "hf"), str(tmp_path / "out"), "--dtype", "float32", "--quiet"]) == 0
  params, cfg, _ = load_checkpoint(tmp_path / "out")
  assert cfg.text.tie_word_embeddings and cfg.text.head_dim == 24 and "lm_head" not in params["decoder"]
  rng = np.random.default_rng(8)
  count = 2 * cfg.tokens_per_frame + 1
  ids = np.stack([_with_media(rng, cfg, cfg.video_token_id, count, 40, cfg.text.vocab_size) for _ in range(2)])
  inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "pixel_values_videos": rng.standard_normal((2, 2, 3, 70, 70)).astype(np.float32)}
  _assert_logits_match(FAMILY.logits(params, cfg, inputs), _hf_logits(model, **inputs), inputs["attention_mask"])
