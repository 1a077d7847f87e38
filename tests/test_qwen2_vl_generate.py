"""Qwen2-VL and Qwen2.5-VL end to end: a saved HF folder with tokenizer and processor configs,
`python -m convert`, `wq_jax.preprocess` on a real mp4, `logits` and `generate` against transformers."""
import numpy as np
import pytest
import torch

import wq_jax
from convert.__main__ import main as convert_main
from models import testing
from wq_jax import WindowQuantConfig
from wq_jax import video as video_io

PROMPT = "What is happening in this video?"
FRAMES = 16  # 64x64 frames -> 32x32 -> 8 x 4 x 4 merged tokens = 128 visual tokens


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def qwen(request, tmp_path_factory):
  root = tmp_path_factory.mktemp(request.param)
  hf = testing.save_tiny_qwen2_vl(root / "hf", request.param, seed=1)
  assert convert_main([str(root / "hf"), str(root / "ck"), "--dtype", "float32", "--quiet"]) == 0
  clips = [str(video_io.write_test_video(root / f"clip{s}.mp4", video_io.synthetic_frames(FRAMES, 64, 64, seed=s)))
           for s in range(2)]
  return hf, wq_jax.load(root / "ck"), clips


def torch_inputs(inputs):
  return {k: torch.from_numpy(v) for k, v in inputs.items()}


def test_preprocess_and_logits_match_transformers(qwen):
  hf, model, clips = qwen
  inputs = wq_jax.preprocess(model, clips[0], PROMPT, num_frames=FRAMES)
  assert {"input_ids", "attention_mask", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids"} <= set(inputs)
  np.testing.assert_array_equal(inputs["video_grid_thw"], [[FRAMES // 2, 8, 8]])
  with torch.no_grad():
    ref = hf(**torch_inputs(inputs)).logits.numpy()
  ours = np.asarray(wq_jax.logits(model, inputs))
  assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-3


def test_fp16_greedy_equals_transformers_generate(qwen):
  hf, model, clips = qwen
  inputs = wq_jax.preprocess(model, clips[1], PROMPT, num_frames=FRAMES)
  with torch.no_grad():
    want = hf.generate(**torch_inputs(inputs), max_new_tokens=16, do_sample=False)[0, inputs["input_ids"].shape[1]:]
  got = wq_jax.generate(model, clips[1], PROMPT, method="fp16", num_frames=FRAMES, max_new_tokens=16)
  np.testing.assert_array_equal(got.token_ids, want.numpy()[: len(got.token_ids)])


def test_windowquant_and_its_unreordered_layout(qwen):
  _, model, clips = qwen
  kw = dict(num_frames=FRAMES, max_new_tokens=8, method="windowquant")
  fp16 = wq_jax.generate(model, clips[0], PROMPT, num_frames=FRAMES, max_new_tokens=8, method="fp16")
  wq = wq_jax.generate(model, clips[0], PROMPT, config=WindowQuantConfig(window_size=8), **kw)
  c = wq_jax.generate(model, clips[0], PROMPT, config=WindowQuantConfig(window_size=8, reorder=False), **kw)
  assert np.all(wq.bit_plan[:, 0] == 16) and wq.bit_plan.shape == (2, 128 // 8)
  if (wq.bit_plan < 16).any():
    assert wq.kv_cache_bytes < fp16.kv_cache_bytes
  np.testing.assert_array_equal(wq.token_ids, c.token_ids)


def test_batch_requests_generate_what_they_generate_alone(qwen):
  _, model, clips = qwen
  prompts = [PROMPT, "Describe the video in detail, every person and animal in it."]
  batch = wq_jax.generate(model, clips, prompts, method="fp16", num_frames=FRAMES, max_new_tokens=8)
  for i in range(2):
    alone = wq_jax.generate(model, clips[i], prompts[i], method="fp16", num_frames=FRAMES, max_new_tokens=8)
    np.testing.assert_array_equal(batch.token_ids[i], alone.token_ids)
