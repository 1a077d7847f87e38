"""InternVL end to end, in transformers' layout and in the original InternVL2 layout (the same
weights): `python -m convert`, `wq_jax.preprocess` on a real mp4 (every frame one tile, frames back
to back in one <img>…</img>), `logits` and `generate` against transformers, and every KV method."""

import numpy as np
import pytest
import torch

import wq_jax
from convert.__main__ import main as convert_main
from models import testing
from wq_jax import WindowQuantConfig, methods
from wq_jax import video as video_io

PROMPT = "What is happening in this video?"
FRAMES = 6  # 6 frames x 16 rows = 96 visual tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(transformers model, {layout: loaded model}, clips)."""
  root = tmp_path_factory.mktemp("internvl_e2e")
  hf = testing.save_tiny_internvl(root / "hf", "llama", seed=5)
  testing.save_internvl_chat_layout(root / "orig", hf)
  models = {}
  for layout, folder in (("internvl", "hf"), ("internvl_chat", "orig")):
    assert convert_main([str(root / folder), str(root / layout), "--dtype", "float32", "--quiet"]) == 0
    models[layout] = wq_jax.load(root / layout)
  clips = [
    str(video_io.write_test_video(root / f"clip{s}.mp4", video_io.synthetic_frames(FRAMES, 40, 72, seed=s)))
    for s in range(2)
  ]
  return hf, models, clips


@pytest.mark.parametrize("layout", ["internvl", "internvl_chat"])
def test_preprocess_builds_one_visual_block_and_logits_match(tiny, layout):
  hf, models, clips = tiny
  model = models[layout]
  inputs = wq_jax.preprocess(model, clips[0], PROMPT, num_frames=FRAMES)
  ids, tok = inputs["input_ids"][0], model.tokenizer
  where = np.nonzero(ids == model.config.image_token_id)[0]
  assert len(where) == FRAMES * 16 and where[-1] - where[0] + 1 == len(where)
  assert tok.convert_ids_to_tokens([int(ids[where[0] - 1]), int(ids[where[-1] + 1])]) == ["<img>", "</img>"]
  assert inputs["pixel_values"].shape == (FRAMES, 3, 56, 56)
  with torch.no_grad():
    ref = hf(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.numpy()
  ours = np.asarray(wq_jax.logits(model, inputs))
  assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-3


@pytest.mark.parametrize("layout", ["internvl", "internvl_chat"])
def test_fp16_greedy_equals_transformers_generate(tiny, layout):
  hf, models, clips = tiny
  inputs = wq_jax.preprocess(models[layout], clips[1], PROMPT, num_frames=FRAMES)
  with torch.no_grad():
    want = hf.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=16, do_sample=False)
  want = want[0, inputs["input_ids"].shape[1] :].numpy()
  got = wq_jax.generate(models[layout], clips[1], PROMPT, method="fp16", num_frames=FRAMES, max_new_tokens=16)
  assert len(got.token_ids) >= 8
  np.testing.assert_array_equal(got.token_ids, want[: len(got.token_ids)])


@pytest.mark.parametrize("method", sorted(set(methods.METHODS) - {"fp16"}))
def test_every_method_generates(tiny, method):
  _, models, clips = tiny
  model = models["internvl_chat"]
  config = WindowQuantConfig(window_size=8) if method == "windowquant" else None
  out = wq_jax.generate(model, clips[0], PROMPT, method=method, config=config, num_frames=FRAMES, max_new_tokens=4)
  assert out.bit_plan.shape[0] == model.config.text.num_layers and len(out.token_ids) <= 4
  if method == "windowquant":
    assert np.all(out.bit_plan[:, 0] == 16) and out.bit_plan.shape[1] == FRAMES * 16 // 8
