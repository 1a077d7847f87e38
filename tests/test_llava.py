"""LLaVA-1.5 and LLaVA-NeXT against transformers (torch, float32): CLIP, projector, whole-model logits.

Tiny random-weight checkpoints go through save_pretrained -> python -m convert
--dtype float32 -> load_checkpoint. LLaVA-NeXT video frames (one tile each, a
path transformers' LLaVA-NeXT forward cannot take) are checked against
transformers' own modules: its CLIP, projector and `pack_image_features` on
one-tile images, spliced with `masked_scatter` and run through its forward.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, LlavaNextImageProcessorPil

from convert.__main__ import main as convert_main
from convert.checkpoint import load_checkpoint
from models import clip, llava, preprocess, registry, siglip, testing

# (model_type, decoder): LLaVA-1.5 (Vicuna) and LLaVA-v1.6-mistral; LLaVA-v1.6-vicuna is the
# LLaVA-NeXT path of the one with the Llama decoder of the other.
VARIANTS = [("llava", "llama"), ("llava_next", "mistral")]


@pytest.fixture(scope="module", params=VARIANTS, ids=["-".join(v) for v in VARIANTS])
def tiny(request, tmp_path_factory):
  model_type, decoder = request.param
  root = tmp_path_factory.mktemp(f"{model_type}_{decoder}")
  model = testing.save_tiny_llava(root / "hf", model_type, decoder, seed=2)
  assert convert_main([str(root / "hf"), str(root / "ck"), "--dtype", "float32", "--quiet"]) == 0
  params, cfg, _ = load_checkpoint(root / "ck")
  return types.SimpleNamespace(model=model, params=params, cfg=cfg, family=registry.get(model_type), root=root)


def _np(t):
  return t.detach().numpy()


def _close(got, want, rtol):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  err = np.abs(got - want).max()
  assert err <= rtol * np.abs(want).max(), (err, np.abs(want).max())


def _logits_match(got, want, mask):
  valid = np.asarray(mask, bool)
  got, want = np.asarray(got)[valid], np.asarray(want)[valid]
  _close(got, want, 1e-3)
  assert (got.argmax(-1) == want.argmax(-1)).all()


def _hf_logits(model, **inputs):
  with torch.no_grad():
    return _np(model(**{k: torch.as_tensor(v) for k, v in inputs.items()}).logits)


def hf_frame_embeds(model, ids, pixel_values_videos):
  """transformers' LLaVA-NeXT input embeddings for frames given as one-tile images."""
  m, c = model.model, model.config
  pv = torch.as_tensor(pixel_values_videos)
  with torch.no_grad():
    states = m.vision_tower(pv.flatten(0, 1), output_hidden_states=True).hidden_states
    feats = m.multi_modal_projector(states[c.vision_feature_layer][:, 1:])
    rows, _ = m.pack_image_features(list(feats[:, None]), None, "default", image_newline=m.image_newline)
    ids = torch.as_tensor(ids)
    embeds = m.get_input_embeddings()(ids)
    return embeds.masked_scatter((ids == c.image_token_id)[..., None], torch.cat(rows))


def test_config(tiny):
  cfg = tiny.cfg
  assert cfg.feature_layers == (-2,) and cfg.drop_first_token
  assert isinstance(cfg.vision, clip.ClipConfig) and cfg.vision.hidden_act == "quick_gelu"
  assert cfg.tokens_per_tile == 9 and cfg.tokens_per_frame == 9 + (cfg.model_type == "llava_next")
  assert ("image_newline" in tiny.params) == (cfg.model_type == "llava_next")
  assert not cfg.text.qkv_bias and not cfg.text.o_bias and cfg.text.rms_norm_eps == 1e-5


def test_clip_encoder_layer_matches_transformers(tiny):
  h = np.random.default_rng(1).standard_normal((3, 10, 32)).astype(np.float32)
  with torch.no_grad():
    want = _np(tiny.model.model.vision_tower.encoder.layers[1](torch.tensor(h), attention_mask=None))
  lp = jax.tree.map(lambda x: x[1], tiny.params["vision"]["layers"])
  _close(siglip.encoder_layer(lp, tiny.cfg.vision, jnp.asarray(h)), want, 1e-5)


def test_clip_tower_returns_transformers_hidden_states(tiny):
  pixels = np.random.default_rng(2).standard_normal((2, 3, 42, 42)).astype(np.float32)
  with torch.no_grad():
    out = tiny.model.model.vision_tower(torch.tensor(pixels), output_hidden_states=True)
  last, states = clip.forward(tiny.params["vision"], tiny.cfg.vision, jnp.asarray(pixels), (0, 1, 2, -2))
  _close(last, _np(out.last_hidden_state), 1e-5)
  for got, i in zip(states, (0, 1, 2, -2)):
    _close(got, _np(out.hidden_states[i]), 1e-5)
  with torch.no_grad():
    feats = tiny.model.model.multi_modal_projector(out.hidden_states[-2][:, 1:])
  _close(llava.tile_features(tiny.params, tiny.cfg, jnp.asarray(pixels)), _np(feats), 1e-5)


def test_text_prefill_logits_match_on_a_long_prompt(tiny):
  ids = np.random.default_rng(4).integers(5, tiny.cfg.text.vocab_size, (2, 520))
  mask = np.ones_like(ids)
  mask[1, 470:] = 0
  got = tiny.family.logits(tiny.params, tiny.cfg, {"input_ids": ids, "attention_mask": mask})
  _logits_match(got, _hf_logits(tiny.model, input_ids=ids, attention_mask=mask), mask)


def test_frames_prefill_logits_match(tiny):
  """Two requests of 4 frames each, frames back to back; LLaVA-1.5 straight through transformers'
  forward, LLaVA-NeXT through its modules (see the module docstring)."""
  cfg = tiny.cfg
  rng = np.random.default_rng(5)
  frames, count = 4, 4 * cfg.tokens_per_frame
  ids = rng.integers(5, cfg.text.vocab_size, (2, count + 40))
  ids[:, 6 : 6 + count] = cfg.image_token_id
  mask = np.ones_like(ids)
  mask[0, count + 30 :] = 0
  pixels = rng.standard_normal((2, frames, 3, 42, 42)).astype(np.float32)
  if cfg.model_type == "llava":
    inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels.reshape(8, 3, 42, 42)}
    want = _hf_logits(tiny.model, **inputs)
  else:
    inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values_videos": pixels}
    want = _hf_logits(tiny.model, inputs_embeds=hf_frame_embeds(tiny.model, ids, pixels), attention_mask=mask)
  _logits_match(tiny.family.logits(tiny.params, cfg, inputs), want, mask)
  embedded = tiny.family.embed_inputs(tiny.params, cfg, inputs)
  np.testing.assert_array_equal(embedded.visual_mask, ids == cfg.image_token_id)


def test_anyres_images_logits_match(tiny):
  """LLaVA-NeXT images straight through transformers: a 100x230 image (2x3 grid after the base tile,
  unpadded) and a square one (2x2), batched with zero-padded tiles."""
  if tiny.cfg.model_type != "llava_next":
    pytest.skip("any-res images are LLaVA-NeXT's")
  cfg = tiny.cfg
  rng = np.random.default_rng(6)
  images = [rng.integers(0, 256, (100, 230, 3), np.uint8), rng.integers(0, 256, (64, 60, 3), np.uint8)]
  config = preprocess.read_processor_config(tiny.root / "hf")
  pixels, sizes = preprocess.llava_next_images(images, config)
  counts = [r.shape[0] for r in llava.anyres_rows(tiny.params, cfg, pixels, sizes)]
  ids = rng.integers(5, cfg.text.vocab_size, (2, max(counts) + 12))
  mask = np.zeros_like(ids)
  for b, n in enumerate(counts):
    ids[b, 3 : 3 + n] = cfg.image_token_id
    mask[b, : n + 12] = 1
  inputs = {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "image_sizes": sizes}
  _logits_match(tiny.family.logits(tiny.params, cfg, inputs), _hf_logits(tiny.model, **inputs), mask)


def test_preprocessing_equals_the_pil_processors(tiny):
  """The saved preprocessor config through our numpy path and through transformers' PIL class."""
  config = preprocess.read_processor_config(tiny.root / "hf")
  rng = np.random.default_rng(7)
  frames = rng.integers(0, 256, (3, 50, 90, 3), np.uint8)
  pil = [Image.fromarray(f) for f in frames]
  if tiny.cfg.model_type == "llava":
    want = CLIPImageProcessorPil(**config)(pil, return_tensors="np")["pixel_values"]
    np.testing.assert_array_equal(preprocess.clip_images(list(frames), config), want)
  else:
    want = LlavaNextImageProcessorPil(**config)(pil, return_tensors="np")
    np.testing.assert_array_equal(preprocess.llava_next_frames(frames, config), want["pixel_values"][:, 0])
    got = preprocess.llava_next_images(list(frames), config)
    np.testing.assert_array_equal(got[0], want["pixel_values"])
    np.testing.assert_array_equal(got[1], want["image_sizes"])


@pytest.mark.parametrize("config", [None, {"size": {"shortest_edge": 336}, "crop_size": 336}])
def test_clip_and_llava_next_defaults_equal_the_pil_processors(config):
  """Checkpoint-size (336 px) and class-default settings on odd image sizes."""
  rng = np.random.default_rng(8)
  images = [rng.integers(0, 256, shape + (3,), np.uint8) for shape in ((37, 91), (200, 61), (360, 640))]
  pil = [Image.fromarray(i) for i in images]
  want = CLIPImageProcessorPil(**(config or {}))(pil, return_tensors="np")["pixel_values"]
  np.testing.assert_array_equal(preprocess.clip_images(images, config), want)
  want = LlavaNextImageProcessorPil(**(config or {}))(pil, return_tensors="np")
  got = preprocess.llava_next_images(images, config)
  np.testing.assert_array_equal(got[0], want["pixel_values"])
  np.testing.assert_array_equal(got[1], want["image_sizes"])


def test_variant_config_through_convert(tmp_path):
  """Two feature layers, the "full" strategy (class token kept), no projector bias, tied
  embeddings, attention biases on the Llama: logits still match."""
  model = testing.save_tiny_llava(
    tmp_path / "hf",
    "llava",
    "llama",
    seed=3,
    vision_feature_layer=[0, -1],
    vision_feature_select_strategy="full",
    multimodal_projector_bias=False,
    tie_word_embeddings=True,
    text_config={"attention_bias": True, "tie_word_embeddings": True},
  )
  assert convert_main([str(tmp_path / "hf"), str(tmp_path / "ck"), "--dtype", "float32", "--quiet"]) == 0
  params, cfg, _ = load_checkpoint(tmp_path / "ck")
  assert cfg.tokens_per_tile == 10 and cfg.text.o_bias and "lm_head" not in params["decoder"]
  rng = np.random.default_rng(9)
  ids = rng.integers(5, cfg.text.vocab_size, (1, 40))
  ids[0, 2:22] = cfg.image_token_id
  inputs = {"input_ids": ids, "pixel_values": rng.standard_normal((2, 3, 42, 42)).astype(np.float32)}
  _logits_match(llava.LLAVA.logits(params, cfg, inputs), _hf_logits(model, **inputs), np.ones_like(ids))


def test_token_count_mismatch_is_an_error(tiny):
  cfg = tiny.cfg
  ids = np.full((1, 12), 7)
  ids[0, :5] = cfg.image_token_id
  key = "pixel_values" if cfg.model_type == "llava" else "pixel_values_videos"
  pixels = np.zeros((1, 3, 42, 42) if cfg.model_type == "llava" else (1, 1, 3, 42, 42), np.float32)
  with pytest.raises(ValueError, match=f"tokens: 5, features: {cfg.tokens_per_frame}"):
    tiny.family.embed_inputs(tiny.params, cfg, {"input_ids": ids, key: pixels})
