"""Frame and image preprocessing in numpy, equal to transformers' PIL processors.

Axes: T frames, H/W pixel height/width, C channels (3), S processor size
(384 for LLaVA-OneVision), P any-res patches of one image, B images,
N flattened vision patches (Qwen2-VL), E = C·tp·p·p values per patch.

Every step is the one transformers' PIL backend takes, in the same order and
dtypes, so the results are bit-identical to `LlavaOnevisionImageProcessorPil`,
`CLIPImageProcessorPil`, `LlavaNextImageProcessorPil` and
`Qwen2VLImageProcessorPil` on uint8 input:
- resize: PIL `Image.resize((w, h), resample)` on the uint8 image, result
  kept as uint8 (transformers converts uint8 arrays to PIL untouched);
- center crop (CLIP): a slice of the resized uint8 image;
- rescale: `(x.astype(float64) * rescale_factor).astype(float32)`;
- normalize: `(x - mean) / std` in float32.
Videos are processed frame by frame with the image path. transformers' own
video processors resize with torchvision instead (not available here); their
output differs from PIL's by interpolation rounding only.

Each public function takes the parsed processor config (a dict such as
preprocessor_config.json, or None); keys it lacks take the defaults of the
matching transformers class, so a config produces what transformers produces.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from jaxtyping import Float32, Int64, UInt8
from PIL import Image

from wq_jax.video import to_rgb_array

ImageLike = UInt8[np.ndarray, "H W 3"] | Image.Image

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
BICUBIC = int(Image.Resampling.BICUBIC)

# LlavaOnevisionImageProcessorPil.image_grid_pinpoints: multiples of 384 up to 6x6.
LLAVA_ONEVISION_PINPOINTS = tuple((384 * i, 384 * j) for i in range(1, 7) for j in range(1, 7))


@dataclasses.dataclass(frozen=True)
class PixelSteps:
  """Resize filter plus the rescale / normalize steps shared by all families."""

  do_resize: bool = True
  resample: int = BICUBIC
  do_rescale: bool = True
  rescale_factor: float = 1 / 255
  do_normalize: bool = True
  image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
  image_std: tuple[float, float, float] = OPENAI_CLIP_STD

  @classmethod
  def from_config(cls, config: Mapping) -> PixelSteps:
    defaults = cls()
    kw = {f.name: config.get(f.name) for f in dataclasses.fields(cls)}
    kw = {k: getattr(defaults, k) if v is None else v for k, v in kw.items()}
    kw["resample"] = int(kw["resample"])
    kw["image_mean"] = _per_channel(kw["image_mean"])
    kw["image_std"] = _per_channel(kw["image_std"])
    return cls(**kw)

  def finish(self, image: UInt8[np.ndarray, "H W C"]) -> Float32[np.ndarray, "C H W"]:
    """Rescale and normalize one resized image; channels-first float32."""
    x = np.moveaxis(image, -1, 0)
    if self.do_rescale:
      x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
    if self.do_normalize:
      x = x.astype(np.float32) if not np.issubdtype(x.dtype, np.floating) else x
      mean = np.asarray(self.image_mean, dtype=x.dtype)[:, None, None]
      std = np.asarray(self.image_std, dtype=x.dtype)[:, None, None]
      x = (x - mean) / std
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------- LLaVA-OneVision


@dataclasses.dataclass(frozen=True)
class LlavaOnevisionSettings:
  """`LlavaOnevisionImageProcessorPil` / `LlavaOnevisionVideoProcessor` settings.

  `size` is a transformers size dict: {"height", "width"} (a fixed size, the
  checkpoints' 384x384) or {"shortest_edge"} (aspect-preserving)."""

  steps: PixelSteps = PixelSteps()
  size: Mapping[str, int] = dataclasses.field(default_factory=lambda: {"height": 384, "width": 384})
  patch_size: int = 384
  image_grid_pinpoints: tuple[tuple[int, int], ...] = LLAVA_ONEVISION_PINPOINTS
  do_pad: bool = True

  @classmethod
  def from_config(cls, config: Mapping | None) -> LlavaOnevisionSettings:
    config = config or {}
    if config.get("do_center_crop"):
      raise ValueError("LLaVA-OneVision preprocessing with do_center_crop=True is not supported")
    size = _size_dict(config.get("size") or {"height": 384, "width": 384})
    crop = _size_dict(config["crop_size"]) if config.get("crop_size") else {}
    # The any-res tile edge, chosen as LlavaOnevisionImageProcessorPil._preprocess does.
    patch_size = crop.get("height") or size.get("height") or size["shortest_edge"]
    pinpoints = config.get("image_grid_pinpoints") or LLAVA_ONEVISION_PINPOINTS
    return cls(
      steps=PixelSteps.from_config(config),
      size=size,
      patch_size=patch_size,
      image_grid_pinpoints=tuple((int(h), int(w)) for h, w in pinpoints),
      do_pad=config.get("do_pad", True) is not False,
    )


def llava_onevision_video(
  frames: UInt8[np.ndarray, "T H W 3"], processor_config: Mapping | None = None
) -> Float32[np.ndarray, "1 T 3 S S"]:
  """`pixel_values_videos` for one video, as LlavaOnevisionForConditionalGeneration
  takes it: each frame resized to `size` (384x384), rescaled, normalized."""
  settings = LlavaOnevisionSettings.from_config(processor_config)
  frames = _check_frames(frames)
  out = [settings.steps.finish(_resize_to_size(f, settings.size, settings.steps)) for f in frames]
  return np.stack(out)[None]


def llava_onevision_images(
  images: Sequence[ImageLike], processor_config: Mapping | None = None
) -> tuple[Float32[np.ndarray, "B P 3 S S"], Int64[np.ndarray, "B 2"]]:
  """(`pixel_values`, `image_sizes`) for a batch of single images, any-res:
  each image gives its whole view resized to S x S followed by the S x S tiles
  of the best grid resolution (aspect-preserving resize, centered zero pad);
  the batch is zero-padded to the largest tile count when `do_pad`."""
  settings = LlavaOnevisionSettings.from_config(processor_config)
  pixel_values, sizes = [], []
  for image in images:
    image = to_rgb_array(image)
    tiles = [_resize(image, _pair(settings.size), settings.steps.resample)]
    tiles += _anyres_tiles(image, settings)
    tiles = [settings.steps.finish(_resize_to_size(t, settings.size, settings.steps)) for t in tiles]
    pixel_values.append(np.stack(tiles))
    sizes.append(image.shape[:2])
  if settings.do_pad:
    most = max(len(p) for p in pixel_values)
    pixel_values = [np.pad(p, ((0, most - len(p)), (0, 0), (0, 0), (0, 0))) for p in pixel_values]
  return np.stack(pixel_values), np.asarray(sizes, dtype=np.int64)


def select_best_resolution(size: tuple[int, int], resolutions: Sequence[tuple[int, int]]) -> tuple[int, int]:
  """The (height, width) grid resolution that keeps the most of the image's
  pixels, then wastes the least (transformers' `select_best_resolution`)."""
  height, width = size
  best, best_effective, best_wasted = None, 0, float("inf")
  for res_h, res_w in resolutions:
    scale = min(res_w / width, res_h / height)
    effective = min(int(width * scale) * int(height * scale), width * height)
    wasted = res_w * res_h - effective
    if effective > best_effective or (effective == best_effective and wasted < best_wasted):
      best, best_effective, best_wasted = (res_h, res_w), effective, wasted
  return best


def _anyres_tiles(image: np.ndarray, settings: LlavaOnevisionSettings | ClipSettings) -> list[np.ndarray]:
  target = select_best_resolution(image.shape[:2], settings.image_grid_pinpoints)
  resized = _resize(image, _fit_inside(image.shape[:2], target), settings.steps.resample)
  # Padding is computed from the resized size, as transformers does.
  fit_h, fit_w = _fit_inside(resized.shape[:2], target)
  top, left = (target[0] - fit_h) // 2, (target[1] - fit_w) // 2
  padded = np.pad(resized, ((top, target[0] - fit_h - top), (left, target[1] - fit_w - left), (0, 0)))
  p = settings.patch_size
  return [padded[i : i + p, j : j + p] for i in range(0, target[0], p) for j in range(0, target[1], p)]


def _fit_inside(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
  """Aspect-preserving size inside `target` (transformers' `get_patch_output_size`)."""
  (height, width), (target_h, target_w) = size, target
  scale_w, scale_h = target_w / width, target_h / height
  if scale_w < scale_h:
    return min(math.ceil(height * scale_w), target_h), target_w
  return target_h, min(math.ceil(width * scale_h), target_w)


# ---------------------------------------------------------------- LLaVA-1.5 (CLIP) / LLaVA-NeXT

# LlavaNextImageProcessorPil.image_grid_pinpoints (336 px tiles).
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclasses.dataclass(frozen=True)
class ClipSettings:
  """`CLIPImageProcessorPil` settings (LLaVA-1.5): resize the short side, then center-crop.
  LLaVA-NeXT adds the any-res grid (`LlavaNextImageProcessorPil`)."""

  steps: PixelSteps = PixelSteps()
  size: Mapping[str, int] = dataclasses.field(default_factory=lambda: {"shortest_edge": 224})
  do_center_crop: bool = True
  crop_size: Mapping[str, int] = dataclasses.field(default_factory=lambda: {"height": 224, "width": 224})
  image_grid_pinpoints: tuple[tuple[int, int], ...] = LLAVA_NEXT_PINPOINTS
  do_pad: bool = True

  @classmethod
  def from_config(cls, config: Mapping | None) -> ClipSettings:
    config = config or {}
    defaults = cls()
    pinpoints = config.get("image_grid_pinpoints") or defaults.image_grid_pinpoints
    crop = config.get("crop_size") or defaults.crop_size
    return cls(
      steps=PixelSteps.from_config(config),
      size=_size_dict(config.get("size") or defaults.size),
      do_center_crop=config.get("do_center_crop", True) is not False,
      crop_size={"height": crop, "width": crop} if isinstance(crop, int) else _size_dict(crop),
      image_grid_pinpoints=tuple((int(h), int(w)) for h, w in pinpoints),
      do_pad=config.get("do_pad", True) is not False,
    )

  @property
  def patch_size(self) -> int:
    """The any-res tile edge, chosen as LlavaNextImageProcessorPil._preprocess does."""
    return self.crop_size.get("height") or self.size.get("height") or self.size["shortest_edge"]

  def tile(self, image: UInt8[np.ndarray, "H W 3"]) -> Float32[np.ndarray, "3 S S"]:
    """Resize to `size`, center-crop, rescale, normalize: one CLIP input."""
    image = _resize_to_size(image, self.size, self.steps)
    if self.do_center_crop:
      image = _center_crop(image, (self.crop_size["height"], self.crop_size["width"]))
    return self.steps.finish(image)


def clip_images(images: Sequence[ImageLike], processor_config: Mapping | None = None) -> Float32[np.ndarray, "B 3 S S"]:
  """`pixel_values` for LLaVA-1.5 (`CLIPImageProcessorPil`): one tile an image or video frame."""
  settings = ClipSettings.from_config(processor_config)
  return np.stack([settings.tile(to_rgb_array(image)) for image in images])


def llava_next_images(
  images: Sequence[ImageLike], processor_config: Mapping | None = None
) -> tuple[Float32[np.ndarray, "B P 3 S S"], Int64[np.ndarray, "B 2"]]:
  """(`pixel_values`, `image_sizes`) for LLaVA-NeXT, any-res: each image gives its whole view
  squashed to a square, then the tiles of the best grid resolution (aspect-preserving resize,
  centered zero pad), each tile resized and center-cropped; zero-padded to the largest tile
  count when `do_pad`."""
  settings = ClipSettings.from_config(processor_config)
  pixel_values, sizes = [], []
  for image in images:
    image = to_rgb_array(image)
    tiles = [_resize(image, _pair(settings.size), settings.steps.resample)] + _anyres_tiles(image, settings)
    pixel_values.append(np.stack([settings.tile(t) for t in tiles]))
    sizes.append(image.shape[:2])
  if settings.do_pad:
    most = max(len(p) for p in pixel_values)
    pixel_values = [np.pad(p, ((0, most - len(p)), (0, 0), (0, 0), (0, 0))) for p in pixel_values]
  return np.stack(pixel_values), np.asarray(sizes, dtype=np.int64)


def llava_next_frames(
  frames: UInt8[np.ndarray, "T H W 3"], processor_config: Mapping | None = None
) -> Float32[np.ndarray, "T 3 S S"]:
  """Video frames for LLaVA-NeXT, each as its base tile alone (tile 0 of `llava_next_images`):
  the frame squashed to a square, resized, center-cropped, rescaled, normalized."""
  settings = ClipSettings.from_config(processor_config)
  size = _pair(settings.size)
  return np.stack([settings.tile(_resize(f, size, settings.steps.resample)) for f in _check_frames(frames)])


# ---------------------------------------------------------------- InternVL

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def internvl_frames(
  frames: UInt8[np.ndarray, "T H W 3"], processor_config: Mapping | None, image_size: int
) -> Float32[np.ndarray, "T 3 S S"]:
  """`pixel_values` for InternVL video frames, one tile each: every frame squashed to
  image_size x image_size (InternVL's `T.Resize((448, 448))`, transformers'
  `GotOcr2ImageProcessorPil` without `crop_to_patches`), rescaled, normalized (ImageNet
  mean and std unless the config names others). The config's size is not read: the
  original checkpoints' preprocessor_config.json describes a CLIP crop InternVL never used."""
  config = {"image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD, **(processor_config or {})}
  steps = PixelSteps.from_config(config)
  return np.stack(
    [
      steps.finish(_resize_to_size(f, {"height": image_size, "width": image_size}, steps))
      for f in _check_frames(frames)
    ]
  )


# ---------------------------------------------------------------- Qwen2-VL / Qwen2.5-VL


@dataclasses.dataclass(frozen=True)
class Qwen2VLSettings:
  """`Qwen2VLImageProcessorPil` / `Qwen2VLVideoProcessor` settings (Qwen2.5-VL uses the same)."""

  steps: PixelSteps = PixelSteps()
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  cap_pixels_per_frame: bool = False
  max_video_tokens: int = 128000

  @classmethod
  def from_config(cls, config: Mapping | None, video: bool = False) -> Qwen2VLSettings:
    """Top-level min_pixels / max_pixels override `size` as in the
    processors' __init__. Video defaults are Qwen2VLVideoProcessor's; the
    per-frame pixel cap exists for video only."""
    config = config or {}
    defaults = cls(min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768) if video else cls()
    size = config.get("size") or {}

    def pick(*values, default):
      return next((int(v) for v in values if v is not None), default)

    return cls(
      steps=PixelSteps.from_config(config),
      min_pixels=pick(config.get("min_pixels"), size.get("shortest_edge"), default=defaults.min_pixels),
      max_pixels=pick(config.get("max_pixels"), size.get("longest_edge"), default=defaults.max_pixels),
      patch_size=pick(config.get("patch_size"), default=defaults.patch_size),
      temporal_patch_size=pick(config.get("temporal_patch_size"), default=defaults.temporal_patch_size),
      merge_size=pick(config.get("merge_size"), default=defaults.merge_size),
      cap_pixels_per_frame=video and bool(config.get("cap_pixels_per_frame")),
      max_video_tokens=pick(config.get("max_video_tokens"), default=defaults.max_video_tokens),
    )


def smart_resize(
  height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
  """Qwen2-VL's target (height, width): multiples of `factor`, pixel count
  within [min_pixels, max_pixels], aspect ratio kept as closely as possible."""
  ratio = max(height, width) / min(height, width)
  if ratio > 200:
    raise ValueError(f"absolute aspect ratio must be smaller than 200, got {ratio}")
  h_bar = round(height / factor) * factor
  w_bar = round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt((height * width) / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def qwen2_vl_image(
  image: ImageLike, processor_config: Mapping | None = None
) -> tuple[Float32[np.ndarray, "N E"], Int64[np.ndarray, "1 3"]]:
  """(`pixel_values`, `image_grid_thw`) for one image; the image is repeated
  over the temporal patch. Concatenate along axis 0 for a batch."""
  settings = Qwen2VLSettings.from_config(processor_config)
  return _qwen2_vl_patches(to_rgb_array(image)[None], settings)


def qwen2_vl_video(
  frames: UInt8[np.ndarray, "T H W 3"], processor_config: Mapping | None = None
) -> tuple[Float32[np.ndarray, "N E"], Int64[np.ndarray, "1 3"]]:
  """(`pixel_values_videos`, `video_grid_thw`) for one video: every frame
  resized to one smart_resize size, rescaled, normalized; the last frame
  repeated up to a multiple of temporal_patch_size; frames t·tp … t·tp+tp−1
  form temporal patch t. Concatenate along axis 0 for a batch."""
  settings = Qwen2VLSettings.from_config(processor_config, video=True)
  return _qwen2_vl_patches(_check_frames(frames), settings)


def _qwen2_vl_patches(frames: np.ndarray, s: Qwen2VLSettings) -> tuple[np.ndarray, np.ndarray]:
  if s.steps.do_resize:
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:
      # Qwen2VLVideoProcessor.resize: each frame gets an even share of the video's budget.
      total = int(s.max_video_tokens * (s.patch_size * s.merge_size) ** 2 * 0.9)
      max_pixels = max(min(max_pixels, total * s.temporal_patch_size // len(frames)), int(s.min_pixels * 1.05))
    size = smart_resize(*frames.shape[1:3], s.patch_size * s.merge_size, s.min_pixels, max_pixels)
    frames = [_resize(f, size, s.steps.resample) for f in frames]
  x = np.stack([s.steps.finish(f) for f in frames])  # [T, C, H, W]
  tp, p, m = s.temporal_patch_size, s.patch_size, s.merge_size
  x = np.concatenate([x, np.repeat(x[-1:], -len(x) % tp, axis=0)])
  num_t, channels, height, width = x.shape
  grid = (num_t // tp, height // p, width // p)
  x = x.reshape(grid[0], tp, channels, grid[1] // m, m, p, grid[2] // m, m, p)
  # -> [t, h-block, w-block, h-in-block, w-in-block, C, tp, p, p]: the merger's
  # m x m neighbours are adjacent rows; each row is one Conv3d input patch.
  x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
  return x.reshape(math.prod(grid), channels * tp * p * p), np.asarray([grid], dtype=np.int64)


# ---------------------------------------------------------------- config files and shared steps


def read_processor_config(folder: str | os.PathLike, modality: str = "image") -> dict:
  """The processor settings a checkpoint folder holds for `modality`
  ("image" or "video"), found as transformers finds them: the nested entry
  of processor_config.json, else video_preprocessor_config.json (video
  only), else preprocessor_config.json. Empty when there is none."""
  if modality not in ("image", "video"):
    raise ValueError(f"modality must be 'image' or 'video', got {modality!r}")
  folder = Path(folder)
  nested = folder / "processor_config.json"
  if nested.is_file():
    entry = json.loads(nested.read_text()).get(f"{modality}_processor")
    if entry is not None:
      return entry
  names = ["video_preprocessor_config.json"] if modality == "video" else []
  for name in names + ["preprocessor_config.json"]:
    if (folder / name).is_file():
      return json.loads((folder / name).read_text())
  return {}


def _resize(image: np.ndarray, size: tuple[int, int], resample: int) -> np.ndarray:
  """PIL resize of a uint8 [H, W, 3] image to (height, width), as uint8."""
  height, width = size
  return np.asarray(Image.fromarray(image).resize((width, height), resample=resample))


def _resize_to_size(image: np.ndarray, size: Mapping[str, int], steps: PixelSteps) -> np.ndarray:
  if not steps.do_resize:
    return image
  if "height" in size:
    return _resize(image, (size["height"], size["width"]), steps.resample)
  # {"shortest_edge": s}: short side to s, long side truncated (torchvision's rule).
  height, width = image.shape[:2]
  short, long = sorted((height, width))
  new_short, new_long = size["shortest_edge"], int(size["shortest_edge"] * long / short)
  target = (new_long, new_short) if width <= height else (new_short, new_long)
  return _resize(image, target, steps.resample)


def _center_crop(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """transformers' `center_crop` of an image at least as large as the crop."""
  (height, width), (crop_h, crop_w) = image.shape[:2], size
  if crop_h > height or crop_w > width:
    raise ValueError(f"cannot center-crop a {height}x{width} image to {crop_h}x{crop_w}: resize it larger first")
  top, left = (height - crop_h) // 2, (width - crop_w) // 2
  return image[top : top + crop_h, left : left + crop_w]


def _pair(size: Mapping[str, int]) -> tuple[int, int]:
  return (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2


def _size_dict(size) -> dict[str, int]:
  """transformers' get_size_dict with default_to_square=False."""
  if isinstance(size, Mapping):
    if {"height", "width"} <= size.keys() or "shortest_edge" in size:
      return dict(size)
    raise ValueError(f"unsupported size {dict(size)}: expected height/width or shortest_edge")
  if isinstance(size, int):
    return {"shortest_edge": size}
  height, width = size
  return {"height": height, "width": width}


def _per_channel(value) -> tuple[float, float, float]:
  values = (value,) * 3 if isinstance(value, (int, float)) else tuple(value)
  if len(values) != 3:
    raise ValueError(f"image_mean / image_std need 3 channel values, got {value!r}")
  return tuple(float(v) for v in values)


def _check_frames(frames) -> np.ndarray:
  frames = np.asarray(frames)
  if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or 0 in frames.shape:
    raise ValueError(f"frames have dtype {frames.dtype} and shape {frames.shape}; expected uint8 [T, H, W, 3]")
  return frames
