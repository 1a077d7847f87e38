"""models.preprocess against transformers' PIL image processors, on frames
decoded from a real encoded mp4 and on fresh random images of odd sizes."""

import ast
import inspect
import json

import numpy as np
import pytest
import torch
import transformers.models.qwen2_vl as hf_qwen2_vl
from PIL import Image
from transformers import LlavaOnevisionImageProcessorPil, Qwen2VLImageProcessorPil, SiglipImageProcessorPil

from models import preprocess
from wq_jax.video import load_video, synthetic_frames, write_test_video

# LLaVA-OneVision checkpoints' preprocessor_config.json (SigLIP normalization).
LLAVA_OV_CHECKPOINT = {
  "image_mean": [0.5, 0.5, 0.5],
  "image_std": [0.5, 0.5, 0.5],
  "resample": 3,
  "rescale_factor": 0.00392156862745098,
  "size": {"height": 384, "width": 384},
}
# A small any-res grid keeps the tests fast while exercising tiling and padding.
LLAVA_OV_SMALL = {
  **LLAVA_OV_CHECKPOINT,
  "size": {"height": 32, "width": 32},
  "image_grid_pinpoints": [[32, 32], [32, 64], [64, 32], [64, 64], [32, 96], [96, 64]],
}
QWEN_SMALL = {
  "min_pixels": 28 * 28 * 4,
  "max_pixels": 28 * 28 * 30,
  "patch_size": 14,
  "merge_size": 2,
  "temporal_patch_size": 2,
}


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
  """Five frames (not a multiple of the temporal patch) from an encoded mp4."""
  path = write_test_video(tmp_path_factory.mktemp("v") / "clip.mp4", synthetic_frames(12, 90, 160), fps=6)
  return load_video(path, 5)


def random_images(seed, shapes=((37, 91), (200, 61), (64, 64), (17, 300))):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for shape in shapes]


@pytest.mark.parametrize("config", [None, LLAVA_OV_CHECKPOINT])
def test_llava_onevision_video_equals_pil_frame_by_frame(decoded, config):
  # LlavaOnevisionVideoProcessor's steps are SiglipImageProcessorPil's with
  # LLaVA-OV's settings; its defaults are LlavaOnevisionImageProcessorPil's.
  defaults = LlavaOnevisionImageProcessorPil()
  settings = config or {"image_mean": defaults.image_mean, "image_std": defaults.image_std}
  hf = SiglipImageProcessorPil(**{"size": {"height": 384, "width": 384}, "resample": 3, **settings})
  expected = hf([Image.fromarray(f) for f in decoded], return_tensors="np")["pixel_values"]
  ours = preprocess.llava_onevision_video(decoded, config)
  assert ours.dtype == np.float32 and ours.shape == (1, 5, 3, 384, 384)
  np.testing.assert_array_equal(ours[0], expected)


def test_llava_onevision_anyres_images(decoded):
  images = [decoded[0], *random_images(1)]
  for config in (LLAVA_OV_SMALL, LLAVA_OV_CHECKPOINT):
    hf = LlavaOnevisionImageProcessorPil(**config)
    expected = hf([Image.fromarray(i) for i in images], return_tensors="np")
    pixel_values, image_sizes = preprocess.llava_onevision_images(images, config)
    assert pixel_values.dtype == np.float32 and image_sizes.dtype == np.int64
    np.testing.assert_array_equal(pixel_values, expected["pixel_values"])
    np.testing.assert_array_equal(image_sizes, expected["image_sizes"])


def test_llava_onevision_defaults_and_saved_config(tmp_path):
  images = random_images(2, shapes=((300, 500), (51, 40)))
  expected = LlavaOnevisionImageProcessorPil()([Image.fromarray(i) for i in images], return_tensors="np")
  np.testing.assert_array_equal(preprocess.llava_onevision_images(images)[0], expected["pixel_values"])
  LlavaOnevisionImageProcessorPil(**LLAVA_OV_SMALL).save_pretrained(tmp_path)
  config = preprocess.read_processor_config(tmp_path, "video")  # falls back to preprocessor_config.json
  expected = LlavaOnevisionImageProcessorPil.from_pretrained(tmp_path)(
    [Image.fromarray(i) for i in images], return_tensors="np"
  )
  np.testing.assert_array_equal(preprocess.llava_onevision_images(images, config)[0], expected["pixel_values"])


def test_select_best_resolution_prefers_effective_then_least_waste():
  pinpoints = preprocess.LLAVA_ONEVISION_PINPOINTS
  assert preprocess.select_best_resolution((300, 500), pinpoints) == (384, 768)
  assert preprocess.select_best_resolution((384, 384), pinpoints) == (384, 384)
  assert preprocess.select_best_resolution((2000, 100), pinpoints) == (2304, 384)


@pytest.mark.parametrize("config", [None, QWEN_SMALL, {**QWEN_SMALL, "image_mean": [0.5] * 3, "merge_size": 1}])
def test_qwen2_vl_image_equals_pil(decoded, config):
  hf = Qwen2VLImageProcessorPil(**(config or {}))
  for image in [decoded[2], *random_images(3)]:
    expected = hf([Image.fromarray(image)], return_tensors="np")
    pixel_values, grid_thw = preprocess.qwen2_vl_image(image, config)
    assert pixel_values.dtype == np.float32 and grid_thw.dtype == np.int64
    np.testing.assert_array_equal(pixel_values, expected["pixel_values"])
    np.testing.assert_array_equal(grid_thw, expected["image_grid_thw"])


def test_qwen2_vl_saved_config(tmp_path, decoded):
  Qwen2VLImageProcessorPil(**QWEN_SMALL).save_pretrained(tmp_path)
  config = json.loads((tmp_path / "preprocessor_config.json").read_text())
  assert preprocess.read_processor_config(tmp_path) == config
  expected = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)([Image.fromarray(decoded[0])], return_tensors="np")
  np.testing.assert_array_equal(preprocess.qwen2_vl_image(decoded[0], config)[0], expected["pixel_values"])


def hf_video_patchify():
  """Qwen2VLVideoProcessor.patchify, taken from the installed transformers
  source (its module imports torchvision, so it cannot be imported)."""
  path = inspect.getfile(hf_qwen2_vl).replace("__init__.py", "video_processing_qwen2_vl.py")
  tree = ast.parse(open(path).read())
  cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2VLVideoProcessor")
  fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "patchify")
  namespace = {"torch": torch}
  exec(ast.unparse(fn), namespace)
  return namespace["patchify"]


@pytest.mark.parametrize("config", [None, QWEN_SMALL])
def test_qwen2_vl_video_matches_transformers_patchify(decoded, config):
  settings = preprocess.Qwen2VLSettings.from_config(config, video=True)
  # Per-frame resize / rescale / normalize by the PIL image processor, with the video's size bounds.
  hf = Qwen2VLImageProcessorPil(min_pixels=settings.min_pixels, max_pixels=settings.max_pixels)
  factor = settings.patch_size * settings.merge_size
  frames = []
  for frame in decoded:
    x = hf.resize(np.moveaxis(frame, -1, 0), size=hf.size, resample=hf.resample, factor=factor)
    frames.append(hf.normalize(hf.rescale(x, hf.rescale_factor), hf.image_mean, hf.image_std))
  videos = torch.from_numpy(np.stack(frames)[None])
  patches, grid_t, grid_h, grid_w = hf_video_patchify()(
    None, videos, settings.patch_size, settings.merge_size, settings.temporal_patch_size
  )
  pixel_values, grid_thw = preprocess.qwen2_vl_video(decoded, config)
  np.testing.assert_array_equal(pixel_values, patches[0].numpy())
  np.testing.assert_array_equal(grid_thw, [[grid_t, grid_h, grid_w]])
  assert grid_t == 3  # 5 frames -> last frame repeated once


def test_qwen2_vl_video_temporal_grouping_by_hand(decoded):
  """Row r of temporal patch t holds frames 2t and 2t+1 at the same spatial
  patch, each of which is the image path's patch of that frame."""
  pixel_values, grid_thw = preprocess.qwen2_vl_video(decoded, QWEN_SMALL)
  (grid_t, grid_h, grid_w), tp = grid_thw[0], 2
  video = pixel_values.reshape(grid_t, grid_h * grid_w, 3, tp, 14, 14)
  for t in range(grid_t):
    for k in range(tp):
      frame = decoded[min(t * tp + k, len(decoded) - 1)]
      image, image_grid = preprocess.qwen2_vl_image(frame, QWEN_SMALL)
      np.testing.assert_array_equal(image_grid, [[1, grid_h, grid_w]])
      np.testing.assert_array_equal(video[t, :, :, k], image.reshape(-1, 3, tp, 14, 14)[:, :, 0])


def test_qwen2_vl_video_defaults_and_pixel_cap(decoded):
  _, grid_thw = preprocess.qwen2_vl_video(decoded)
  # Qwen2VLVideoProcessor's bounds: at least 128 * 28 * 28 pixels a frame.
  expected = preprocess.smart_resize(90, 160, 28, 128 * 28 * 28, 28 * 28 * 768)
  np.testing.assert_array_equal(grid_thw[0, 1:] * 14, expected)
  capped = {"cap_pixels_per_frame": True, "max_video_tokens": 500, "min_pixels": 28 * 28 * 4}
  budget = int(500 * 28 * 28 * 0.9) * 2 // 5
  _, grid_thw = preprocess.qwen2_vl_video(decoded, capped)
  np.testing.assert_array_equal(grid_thw[0, 1:] * 14, preprocess.smart_resize(90, 160, 28, 28 * 28 * 4, budget))


def test_read_processor_config_precedence(tmp_path):
  (tmp_path / "preprocessor_config.json").write_text(json.dumps({"from": "image file"}))
  assert preprocess.read_processor_config(tmp_path, "video") == {"from": "image file"}
  (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"from": "video file"}))
  assert preprocess.read_processor_config(tmp_path, "video") == {"from": "video file"}
  nested = {"image_processor": {"from": "nested image"}, "video_processor": {"from": "nested video"}}
  (tmp_path / "processor_config.json").write_text(json.dumps(nested))
  assert preprocess.read_processor_config(tmp_path, "video") == {"from": "nested video"}
  assert preprocess.read_processor_config(tmp_path, "image") == {"from": "nested image"}
  assert preprocess.read_processor_config(tmp_path / "missing") == {}


def test_bad_frames_name_expected_layout():
  for frames in (np.zeros((2, 8, 8, 3), np.float32), np.zeros((8, 8, 3), np.uint8)):
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
      preprocess.llava_onevision_video(frames)
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
      preprocess.qwen2_vl_video(frames)
  with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\]"):
    preprocess.qwen2_vl_image(np.zeros((8, 8), np.uint8))
