"""Video decoding and uniform frame sampling (PyAV), plus a writer for test videos.

Axes: T frames, H frame height, W frame width, 3 RGB channels.

Sampling rule (the one LLaVA-OneVision's evaluation code uses, lmms-eval
`llava_onevision.load_video`): with F frames in the video and T wanted,

    indices = np.linspace(0, F - 1, T, dtype=int)

so the first and the last frame are always taken and the rest are spread
evenly, truncated toward zero. When T > F indices repeat (as decord's
`get_batch` returns them), so the result always has T frames. `num_frames=None`
keeps every frame.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from jaxtyping import UInt8
from PIL import Image

VideoSource = str | os.PathLike | np.ndarray | Sequence[np.ndarray | Image.Image]

# Container extension -> encoders to try, best first (PyAV builds differ).
_ENCODERS = {
  ".mp4": ("libx264", "mpeg4"),
  ".mkv": ("libx264", "mpeg4", "ffv1"),
  ".webm": ("libvpx-vp9", "libvpx"),
  ".avi": ("mpeg4", "mjpeg"),
}


class VideoDecodeError(ValueError):
  """A file that exists but yields no video frames; the message names the path."""

  def __init__(self, path: str | os.PathLike, reason: str):
    super().__init__(f"cannot decode video {os.fspath(path)!r}: {reason}")
    self.path = os.fspath(path)
    self.reason = reason


@dataclasses.dataclass(frozen=True)
class VideoInfo:
  """What a video file declares: frame count (counted from packets when the
  container does not store it), average frame rate and frame size."""

  num_frames: int
  fps: float
  height: int
  width: int


def sample_indices(total_frames: int, num_frames: int | None) -> np.ndarray:
  """Uniform sampling indices (module docstring): int64 [num_frames]."""
  if total_frames < 1:
    raise ValueError(f"cannot sample from {total_frames} frames")
  if num_frames is None:
    return np.arange(total_frames)
  if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
    raise ValueError(f"num_frames must be a positive int or None, got {num_frames!r}")
  return np.linspace(0, total_frames - 1, int(num_frames), dtype=int)


def load_video(source: VideoSource, num_frames: int | None = None) -> UInt8[np.ndarray, "T H W 3"]:
  """Frames of `source`, uniformly sampled to `num_frames` (all when None).

  `source` is a path to a video file (mp4, webm, avi, mkv, anything FFmpeg
  reads), a uint8 array [T, H, W, 3], or a list of frames (uint8 [H, W, 3]
  arrays or PIL images, converted to RGB). Files are decoded once, in order,
  and only the sampled frames are converted to RGB and kept.

  Raises FileNotFoundError for a missing path, VideoDecodeError (a
  ValueError) for a file that is not a readable video or has no decodable
  frame, and ValueError for arrays of the wrong dtype or shape.
  """
  if isinstance(source, (str, os.PathLike)):
    return _load_file(Path(source), num_frames)
  frames = _stack_frames(source)
  return frames[sample_indices(len(frames), num_frames)]


def to_rgb_array(image: np.ndarray | Image.Image) -> UInt8[np.ndarray, "H W 3"]:
  """A PIL image as uint8 RGB (transparency composited onto white, as
  transformers' `convert_to_rgb` does), or a uint8 [H, W, 3] array checked."""
  if isinstance(image, Image.Image):
    if "A" in image.getbands() or image.info.get("transparency") is not None:
      white = Image.new("RGBA", image.size, (255, 255, 255, 255))
      image = Image.alpha_composite(white, image.convert("RGBA"))
    return np.asarray(image.convert("RGB"))
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3 or 0 in image.shape:
    raise ValueError(f"image has dtype {image.dtype} and shape {image.shape}; expected uint8 [H, W, 3] or a PIL image")
  return image


def probe_video(path: str | os.PathLike) -> VideoInfo:
  """Header facts of a video file, without decoding any frame."""
  path = _existing_file(Path(path))
  with _open(path) as container:
    stream = _video_stream(container, path)
    return VideoInfo(
      num_frames=stream.frames or _count_packets(container, stream, path),
      fps=float(stream.average_rate or stream.guessed_rate or 0.0),
      height=stream.codec_context.height,
      width=stream.codec_context.width,
    )


def write_test_video(path: str | os.PathLike, frames: UInt8[np.ndarray, "T H W 3"], fps: int = 8) -> Path:
  """Encode uint8 RGB frames into `path`; the extension (.mp4, .mkv, .webm,
  .avi) picks the first encoder this PyAV build has. Frames need even H and
  W (4:2:0 chroma). For tests and the demo; the encoding is lossy."""
  av = _av()
  path = Path(path)
  frames = _stack_frames(frames)
  _, height, width, _ = frames.shape
  if height % 2 or width % 2:
    raise ValueError(f"write_test_video needs even frame height and width, got {height}x{width}")
  codec = _pick_encoder(path.suffix.lower())
  with av.open(str(path), mode="w") as container:
    stream = container.add_stream(codec, rate=fps)
    stream.width, stream.height = width, height
    stream.pix_fmt = "yuv420p" if codec != "mjpeg" else "yuvj420p"
    for frame in frames:
      container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
    container.mux(stream.encode(None))
  return path


def synthetic_frames(
  num_frames: int = 16, height: int = 96, width: int = 128, seed: int = 0
) -> UInt8[np.ndarray, "T H W 3"]:
  """Test and demo content: red/green gradients, blue rising with time, a
  white square moving left to right, and random noise in the bottom-right
  quarter (fresh per frame)."""
  rng = np.random.default_rng(seed)
  t, y, x = np.meshgrid(
    np.linspace(0, 1, num_frames), np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij"
  )
  frames = np.round(np.stack([x, y, t], axis=-1) * 255).astype(np.uint8)
  side = max(height // 4, 1)
  for i, left in enumerate(np.linspace(0, width - side, num_frames, dtype=int)):
    frames[i, height // 8 : height // 8 + side, left : left + side] = 255
  frames[:, height // 2 :, width // 2 :] = rng.integers(0, 256, frames[:, height // 2 :, width // 2 :].shape)
  return frames


def _load_file(path: Path, num_frames: int | None) -> np.ndarray:
  path = _existing_file(path)
  total = probe_video(path).num_frames
  if total == 0:
    raise VideoDecodeError(path, "the video stream has zero frames")
  indices = sample_indices(total, num_frames)
  frames, decoded = _decode_indices(path, indices)
  if frames is None:
    # The header overstated the count: resample over the frames that decode.
    if decoded == 0:
      raise VideoDecodeError(path, f"zero decodable frames (header declares {total})")
    frames, _ = _decode_indices(path, sample_indices(decoded, num_frames))
  return frames


def _decode_indices(path: Path, indices: np.ndarray) -> tuple[np.ndarray | None, int]:
  """Decode in order up to the last wanted index, converting and keeping only
  `indices` (sorted, possibly repeated). Returns (frames, or None if the
  video ran out first; number of frames decoded)."""
  av = _av()
  out, filled, decoded = None, 0, 0
  with _open(path) as container:
    stream = _video_stream(container, path)
    stream.thread_type = "AUTO"
    try:
      for frame in container.decode(stream):
        if indices[filled] == decoded:
          rgb = frame.to_ndarray(format="rgb24")
          if out is None:
            out = np.empty((len(indices), *rgb.shape), np.uint8)
          while filled < len(indices) and indices[filled] == decoded:
            out[filled] = rgb
            filled += 1
        decoded += 1
        if filled == len(indices):
          return out, decoded
    except av.FFmpegError as e:
      raise VideoDecodeError(path, f"decoder error after {decoded} frames: {e}") from e
  return None, decoded


def _existing_file(path: Path) -> Path:
  if not path.exists():
    raise FileNotFoundError(errno.ENOENT, "video file not found", str(path))
  if not path.is_file():
    raise VideoDecodeError(path, "not a regular file")
  return path


def _open(path: Path):
  av = _av()
  try:
    return av.open(str(path), mode="r")
  except (av.FFmpegError, EOFError) as e:
    raise VideoDecodeError(path, str(e)) from e


def _video_stream(container, path: Path):
  if not container.streams.video:
    raise VideoDecodeError(path, "the file has no video stream")
  return container.streams.video[0]


def _count_packets(container, stream, path: Path) -> int:
  """Frame count by demuxing (no decoding): one packet per video frame;
  the flush packet at the end has no data."""
  av = _av()
  try:
    return sum(1 for packet in container.demux(stream) if packet.size)
  except av.FFmpegError as e:
    raise VideoDecodeError(path, f"demuxer error: {e}") from e


def _stack_frames(source) -> np.ndarray:
  layout = "a uint8 array [T, H, W, 3] or a non-empty list of uint8 [H, W, 3] arrays / PIL images"
  if isinstance(source, np.ndarray):
    frames = source
  elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)) and len(source) > 0:
    frames = []
    for i, frame in enumerate(source):
      try:
        frames.append(to_rgb_array(frame))
      except ValueError as e:
        raise ValueError(f"video frame {i}: {e}; a video is {layout}") from None
    if len({f.shape for f in frames}) > 1:
      raise ValueError(f"video frames differ in shape {sorted({f.shape for f in frames})}; expected {layout}")
    frames = np.stack(frames)
  else:
    raise ValueError(f"unsupported video source of type {type(source).__name__}; expected a path or {layout}")
  if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or 0 in frames.shape:
    raise ValueError(f"video array has dtype {frames.dtype} and shape {frames.shape}; expected {layout}")
  return frames


def _pick_encoder(suffix: str) -> str:
  av = _av()
  if suffix not in _ENCODERS:
    raise ValueError(f"write_test_video supports {sorted(_ENCODERS)}, got {suffix!r}")
  for name in _ENCODERS[suffix]:
    try:
      av.codec.Codec(name, "w")
      return name
    except av.codec.codec.UnknownCodecError:
      continue
  raise RuntimeError(f"this PyAV build has none of the encoders {_ENCODERS[suffix]} for {suffix}")


def _av():
  """PyAV, imported when a file is read or written (arrays and frame lists need no decoder)."""
  try:
    import av
  except ImportError as e:  # pragma: no cover - av is a dependency
    raise ImportError("reading or writing video files needs PyAV: pip install av") from e
  return av
