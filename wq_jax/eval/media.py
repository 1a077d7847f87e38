"""A question's media as frames: uint8 [T, H, W, 3], ready for `generate`.

Axes: T frames, H frame height, W frame width, 3 RGB channels.

Every kind samples with the project's rule (`wq_jax.video.sample_indices`:
uniform, first and last frame kept) over the frames it has, so `num_frames`
means the same thing everywhere; None keeps them all.

    video    a file; with a `bound` (start, end) in seconds, only the frames in
             it (MVBench's STAR, STA and TVQA tasks), from the header's frame rate
    frames   a folder of JPEG / PNG frames in name order at `fps` (MVBench's TVQA)
    images   image files (MileBench), each resized to the first one's size so
             they stack; the video processors resize every frame anyway
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from wq_jax import video as video_io
from wq_jax.eval.tasks import Media

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def bound_range(bound: tuple[float, float] | None, fps: float, count: int) -> tuple[int, int]:
  """[first, last] frame indices of a (start, end) bound in seconds; the whole clip when it is empty."""
  if bound is None or fps <= 0:
    return 0, count - 1
  first = max(0, round(bound[0] * fps))
  last = min(count - 1, round(bound[1] * fps))
  return (first, last) if first <= last else (0, count - 1)


def _indices(bound, fps: float, count: int, num_frames: int | None) -> np.ndarray:
  first, last = bound_range(bound, fps, count)
  return first + video_io.sample_indices(last - first + 1, num_frames)


def _video(media: Media, num_frames: int | None) -> np.ndarray:
  path = media.paths[0]
  if media.bound is None:
    return video_io.load_video(path, num_frames)
  info = video_io.probe_video(path)
  indices = _indices(media.bound, info.fps, info.num_frames, num_frames)
  # The decoder keeps only the sampled frames (load_video has no bound argument).
  frames, decoded = video_io._decode_indices(Path(path), indices)
  if frames is None:  # the header overstated the count: sample within what decodes
    if decoded == 0:
      raise video_io.VideoDecodeError(path, "zero decodable frames")
    frames, _ = video_io._decode_indices(Path(path), _indices(media.bound, info.fps, decoded, num_frames))
  return frames


def _open_rgb(path: str, size: tuple[int, int] | None = None) -> np.ndarray:
  with Image.open(path) as image:
    image = video_io.to_rgb_array(image)
  if size is not None and image.shape[1::-1] != size:
    image = np.asarray(Image.fromarray(image).resize(size, Image.BICUBIC))
  return image


def _frames(media: Media, num_frames: int | None) -> np.ndarray:
  folder = Path(media.paths[0])
  if not folder.is_dir():
    raise FileNotFoundError(f"frame folder not found: {folder}")
  files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
  if not files:
    raise video_io.VideoDecodeError(folder, "the folder holds no JPEG or PNG frame")
  indices = _indices(media.bound, media.fps or 0.0, len(files), num_frames)
  return video_io.load_video([_open_rgb(str(files[i])) for i in indices])


def _images(media: Media, num_frames: int | None) -> np.ndarray:
  paths = media.paths
  if not paths:
    raise ValueError("the question has no image")
  chosen = [paths[i] for i in video_io.sample_indices(len(paths), num_frames)]
  first = _open_rgb(chosen[0])
  size = first.shape[1::-1]  # (width, height), as PIL counts
  return np.stack([first] + [_open_rgb(p, size) for p in chosen[1:]])


LOADERS = {"video": _video, "frames": _frames, "images": _images}


def load_media(media: Media, num_frames: int | None) -> np.ndarray:
  """The media's frames, sampled to `num_frames` (all when None): uint8 [T, H, W, 3]."""
  return LOADERS[media.kind](media, num_frames)
