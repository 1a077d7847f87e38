"""LLaVA-1.5 and LLaVA-NeXT end to end: a saved HF folder with tokenizer and preprocessor config,
`python -m convert`, `wq_jax.preprocess` on a real mp4 (every frame an image, frames back to back),
`logits` and `generate` against transformers, and every KV method."""

import numpy as np
import pytest
import torch
from test_llava import hf_frame_embeds

import wq_jax
from convert.__main__ import main as convert_main
from models import testing
from wq_jax import WindowQuantConfig, methods
from wq_jax import video as video_io

PROMPT = "What is happening in this video?"
FRAMES = 8  # 8 frames x 9 rows (+ 8 LLaVA-NeXT newlines): 72 or 80 visual tokens
VARIANTS = [("llava", "llama"), ("llava_next", "mistral")]


@pytest.fixture(scope="module", params=VARIANTS, ids=["-".join(v) for v in VARIANTS])
def tiny(request, tmp_path_factory):
  model_type, decoder = request.param
  root = tmp_path_factory.mktemp(f"{model_type}_{decoder}_e2e")
  hf = testing.save_tiny_llava(root / "hf", model_type, decoder, seed=1)
  assert convert_main([str(root / "hf"), str(root / "ck"), "--dtype", "float32", "--quiet"]) == 0
  clips = [
    str(video_io.write_test_video(root / f"clip{s}.mp4", video_io.synthetic_frames(FRAMES, 48, 64, seed=s)))
    for s in range(2)
  ]
  return hf, wq_jax.load(root / "ck"), clips


def hf_inputs(hf, inputs):
  """What transformers' forward and generate take for our inputs (LLaVA-NeXT frames as embeddings)."""
  if "pixel_values_videos" in inputs:
    return {
      "inputs_embeds": hf_frame_embeds(hf, inputs["input_ids"], inputs["pixel_values_videos"]),
      "attention_mask": torch.from_numpy(inputs["attention_mask"]),
    }
  return {k: torch.from_numpy(v) for k, v in inputs.items()}


def test_preprocess_builds_one_visual_block_and_logits_match(tiny):
  hf, model, clips = tiny
  cfg = model.config
  inputs = wq_jax.preprocess(model, clips[0], PROMPT, num_frames=FRAMES)
  ids = inputs["input_ids"][0]
  where = np.nonzero(ids == cfg.image_token_id)[0]
  assert len(where) == FRAMES * cfg.tokens_per_frame and where[-1] - where[0] + 1 == len(where)
  text = model.tokenizer.decode(ids[where[-1] + 1 :])
  assert text.startswith("\n" + PROMPT) and text.endswith("ASSISTANT:")
  with torch.no_grad():
    ref = hf(**hf_inputs(hf, inputs)).logits.numpy()
  ours = np.asarray(wq_jax.logits(model, inputs))
  assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-3


def test_fp16_greedy_equals_transformers_generate(tiny):
  hf, model, clips = tiny
  inputs = wq_jax.preprocess(model, clips[1], PROMPT, num_frames=FRAMES)
  with torch.no_grad():
    want = hf.generate(**hf_inputs(hf, inputs), max_new_tokens=16, do_sample=False)[0]
  if "pixel_values" in inputs:  # given input_ids, generate returns the prompt too
    want = want[inputs["input_ids"].shape[1] :]
  got = wq_jax.generate(model, clips[1], PROMPT, method="fp16", num_frames=FRAMES, max_new_tokens=16)
  assert len(got.token_ids) >= 8
  np.testing.assert_array_equal(got.token_ids, want.numpy()[: len(got.token_ids)])


@pytest.mark.parametrize("method", sorted(set(methods.METHODS) - {"fp16"}))
def test_every_method_generates(tiny, method):
  _, model, clips = tiny
  config = WindowQuantConfig(window_size=8) if method == "windowquant" else None
  out = wq_jax.generate(model, clips[0], PROMPT, method=method, config=config, num_frames=FRAMES, max_new_tokens=4)
  assert out.bit_plan.shape[0] == model.config.text.num_layers and len(out.token_ids) <= 4
  if method == "windowquant":
    assert np.all(out.bit_plan[:, 0] == 16)
