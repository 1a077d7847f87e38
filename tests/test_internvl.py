"""InternVL against transformers (torch, float32), in both checkpoint layouts.

transformers' native layout ("internvl", over Llama or Qwen2) is checked against
InternVLForConditionalGeneration: InternViT layer and tower, pixel shuffle,
projector, whole-model logits. The original InternVL2 layout ("internvl_chat",
InternLM2 with fused wqkv) has no reference implementation here (remote code):
the same random weights are written in that layout, converted, and must give
the very same params, hence the same logits as transformers' model.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import GotOcr2ImageProcessorPil
from transformers.models.internvl.modeling_internvl import InternVLModel

from convert.__main__ import main as convert_main
from convert.checkpoint import load_checkpoint
from convert.framework import tree_paths
from models import intern_vit, internvl, preprocess, registry, testing

DECODERS = ["llama", "qwen2"]


def _convert(hf_folder, out):
  assert convert_main([str(hf_folder), str(out), "--dtype", "float32", "--quiet"]) == 0
  return load_checkpoint(out)


@pytest.fixture(scope="module", params=DECODERS)
def tiny(request, tmp_path_factory):
  root = tmp_path_factory.mktemp(f"internvl_{request.param}")
  model = testing.save_tiny_internvl(root / "hf", request.param, seed=4)
  params, cfg, _ = _convert(root / "hf", root / "ck")
  return types.SimpleNamespace(model=model, params=params, cfg=cfg, root=root)


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


def _frames_inputs(cfg, seed, frames=3):
  rng = np.random.default_rng(seed)
  count = frames * cfg.tokens_per_frame
  ids = rng.integers(8, cfg.text.vocab_size, (2, count + 30))
  ids[:, 4 : 4 + count] = cfg.image_token_id
  mask = np.ones_like(ids)
  mask[1, count + 20 :] = 0
  pixels = rng.standard_normal((2 * frames, 3, 56, 56)).astype(np.float32)
  return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


def test_config(tiny):
  cfg = tiny.cfg
  assert cfg.tokens_per_frame == 16 and cfg.feature_layer == -1 and cfg.drop_first_token
  assert cfg.text.qkv_bias == (cfg.decoder == "qwen2") and cfg.vision.qkv_bias and not cfg.vision.post_norm


def test_intern_vit_layer_and_tower_match_transformers(tiny):
  rng = np.random.default_rng(1)
  tower = tiny.model.model.vision_tower
  h = rng.standard_normal((3, 65, 32)).astype(np.float32)
  with torch.no_grad():
    want = _np(tower.encoder.layer[1](torch.tensor(h)))
  lp = jax.tree.map(lambda x: x[1], tiny.params["vision"]["layers"])
  _close(intern_vit.encoder_layer(lp, tiny.cfg.vision, jnp.asarray(h)), want, 1e-5)
  pixels = rng.standard_normal((2, 3, 56, 56)).astype(np.float32)
  with torch.no_grad():
    out = tower(torch.tensor(pixels), output_hidden_states=True)
  last, states = intern_vit.forward(tiny.params["vision"], tiny.cfg.vision, jnp.asarray(pixels), (0, 1, -1))
  _close(last, _np(out.last_hidden_state), 1e-5)
  for got, i in zip(states, (0, 1, -1)):
    _close(got, _np(out.hidden_states[i]), 1e-5)


def test_pixel_shuffle_and_projector_match_transformers(tiny):
  x = np.random.default_rng(2).standard_normal((3, 8, 8, 5)).astype(np.float32)
  want = _np(InternVLModel.pixel_shuffle(None, torch.tensor(x), 0.5))
  np.testing.assert_array_equal(internvl.pixel_shuffle(jnp.asarray(x), 2), want)
  pixels = np.random.default_rng(3).standard_normal((2, 3, 56, 56)).astype(np.float32)
  with torch.no_grad():
    want = _np(tiny.model.model.get_image_features(torch.tensor(pixels)).pooler_output)
  _close(internvl.tile_features(tiny.params, tiny.cfg, jnp.asarray(pixels)), want, 1e-5)


def test_text_prefill_logits_match_on_a_long_prompt(tiny):
  ids = np.random.default_rng(4).integers(8, tiny.cfg.text.vocab_size, (2, 520))
  mask = np.ones_like(ids)
  mask[0, 480:] = 0
  got = internvl.INTERNVL.logits(tiny.params, tiny.cfg, {"input_ids": ids, "attention_mask": mask})
  _logits_match(got, _hf_logits(tiny.model, input_ids=ids, attention_mask=mask), mask)


def test_frames_prefill_logits_match(tiny):
  inputs = _frames_inputs(tiny.cfg, 5)
  got = internvl.INTERNVL.logits(tiny.params, tiny.cfg, inputs)
  _logits_match(got, _hf_logits(tiny.model, **inputs), inputs["attention_mask"])


def test_original_layout_converts_to_the_same_params(tiny, tmp_path):
  """InternVL2's layout (fused qkv / wqkv, InternLM2 names) of the same weights: equal params, so the
  logits equal transformers'. Only an InternLM2 (Llama) decoder exists in that layout."""
  if tiny.cfg.decoder != "llama":
    pytest.skip("the original InternVL2 layout holds an InternLM2 decoder")
  testing.save_internvl_chat_layout(tmp_path / "orig", tiny.model)
  params, cfg, _ = _convert(tmp_path / "orig", tmp_path / "ck")
  assert cfg.model_type == "internvl_chat" and cfg.decoder == "internlm2"
  assert cfg.text == tiny.cfg.text and cfg.vision == tiny.cfg.vision
  got, want = tree_paths(params), tree_paths(tiny.params)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)
  inputs = _frames_inputs(cfg, 6)
  family = registry.get("internvl_chat")
  _logits_match(family.logits(params, cfg, inputs), _hf_logits(tiny.model, **inputs), inputs["attention_mask"])


def test_frames_preprocessing_equals_got_ocr2_pil():
  rng = np.random.default_rng(7)
  frames = rng.integers(0, 256, (3, 50, 90, 3), np.uint8)
  config = {"image_mean": list(preprocess.IMAGENET_MEAN), "image_std": list(preprocess.IMAGENET_STD)}
  hf = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, crop_to_patches=False, **config)
  want = hf([Image.fromarray(f) for f in frames], return_tensors="np")["pixel_values"]
  np.testing.assert_array_equal(preprocess.internvl_frames(frames, None, 448), want)


def test_internvl2_8b_original_config_equals_the_native_preset():
  """The released InternVL2-8B config.json parses to the transformers-layout preset's model."""
  from models import presets

  fam, native = presets.config("internvl2-8b")
  original = registry.get("internvl_chat").parse_config(presets.INTERNVL2_8B_ORIGINAL)
  assert (original.text, original.vision, original.image_token_id) == (native.text, native.vision, 92546)
  assert original.tokens_per_frame == native.tokens_per_frame == 256
  shapes = lambda cfg: jax.tree.map(lambda x: x.shape, fam.abstract_params(cfg))
  assert shapes(original) == shapes(native)
