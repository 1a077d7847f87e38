"""The public entry points: `load` a converted checkpoint, `preprocess` a video and a prompt,
`logits` of the prefill. `wq_jax.generate` builds on them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
from flax import struct

from wq_jax import video as video_io

DEFAULT_FRAMES = 32  # frames sampled from a video file when `num_frames` is not given (lmms-eval's default)


@struct.dataclass
class Model:
  """The params pytree of a converted checkpoint, carrying what it needs to run.

  Only `params` is a pytree child, so `jax.tree.map` and sharding see the weights alone.
  """
  params: dict
  config: Any = struct.field(pytree_node=False)  # the family's frozen config
  model_type: str = struct.field(pytree_node=False)
  root: Path = struct.field(pytree_node=False)  # the converted folder
  hf_config: dict = struct.field(pytree_node=False)
  dtype: str = struct.field(pytree_node=False)

  @property
  def family(self):
    from models import registry
    return registry.get(self.model_type)

  @property
  def tokenizer(self):
    return _tokenizer(self.root)

  @property
  def processor_config(self) -> dict:
    from models import preprocess
    return preprocess.read_processor_config(self.root, modality="video")

  @property
  def max_positions(self) -> int | None:
    text = self.hf_config.get("text_config", self.hf_config)
    return text.get("max_position_embeddings")

  def __hash__(self):  # a jit static argument only by identity
    return id(self)


_TOKENIZERS: dict[Path, Any] = {}


def _tokenizer(root: Path):
  if root not in _TOKENIZERS:
    from transformers import AutoTokenizer
    _TOKENIZERS[root] = AutoTokenizer.from_pretrained(str(root))
  return _TOKENIZERS[root]


def load(path) -> Model:
  """Loads a folder written by `python -m convert` (raises if it is not one)."""
  from convert.checkpoint import WQ_CONFIG, load_checkpoint
  params, cfg, files = load_checkpoint(path)
  meta = json.loads((files.root / WQ_CONFIG).read_text())
  return Model(params=params, config=cfg, model_type=meta["model_type"], root=files.root,
               hf_config=meta["hf_config"], dtype=meta["dtype"])


def as_batch(video, prompt) -> tuple[list, list[str]]:
  """One request, or a list of videos with a list of prompts; prompts are checked here."""
  if isinstance(prompt, (list, tuple)):
    prompts = list(prompt)
    videos = list(video) if isinstance(video, (list, tuple)) and not _is_frame_list(video) else None
    if videos is None or len(videos) != len(prompts):
      raise ValueError("a batch needs a list of videos and a list of prompts of the same length")
  else:
    videos, prompts = [video], [prompt]
  for p in prompts:
    if not isinstance(p, str) or not p.strip():
      raise ValueError("the prompt is empty: ask something about the video")
  return videos, prompts


def _is_frame_list(x) -> bool:
  """A list of frames (arrays [H, W, 3] or PIL images), as opposed to a list of videos."""
  first = x[0] if len(x) else None
  return first is not None and (getattr(first, "ndim", None) == 3 or type(first).__module__.startswith("PIL"))


def load_frames(videos: Sequence, num_frames: int | None) -> list[np.ndarray]:
  """Decodes every video of a batch (files are sampled to DEFAULT_FRAMES unless told)."""
  out = []
  for v in videos:
    n = num_frames
    if n is None and isinstance(v, (str, Path)):
      n = DEFAULT_FRAMES
    out.append(video_io.load_video(v, n))
  return out


def preprocess(model: Model, video, prompt, num_frames: int | None = None) -> dict[str, np.ndarray]:
  """The model inputs, as numpy arrays with the keys and layouts transformers' forward takes."""
  from models.inputs import INPUT_BUILDERS
  videos, prompts = as_batch(video, prompt)
  frames = load_frames(videos, num_frames)
  build = INPUT_BUILDERS[model.model_type]
  return build(model.config, model.tokenizer, model.processor_config, frames, prompts)


def logits(model: Model, inputs: dict) -> jax.Array:
  """Prefill logits [B, T, V] (float32) for inputs as `preprocess` builds them."""
  return model.family.logits(model.params, model.config, inputs)
