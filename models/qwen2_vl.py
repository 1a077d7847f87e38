"""Qwen2-VL and Qwen2.5-VL: the vision tower's tokens spliced into the Qwen2 decoder under M-RoPE.

Axes: B batch, T tokens, D model width, V vocabulary, I images or videos,
P vision patches, M visual tokens (P / merge²).

Params: {"vision": models.qwen2_vl_vision tree, "decoder": models.qwen2 tree}.

Inputs are the dict the transformers processor returns (numpy arrays):
`input_ids`, `attention_mask`, and as the prompt needs `pixel_values` +
`image_grid_thw`, `pixel_values_videos` + `video_grid_thw`,
`second_per_grid_ts` (Qwen2.5-VL), `mm_token_type_ids`. Everything that
depends only on the grids and token ids (M-RoPE positions, the towers'
attention layouts) is computed on the host in numpy.

After the prefill, transformers places the token at cache position p at
p + delta on all three M-RoPE rows, with delta = max(prefill positions) + 1
- valid tokens (`rope_deltas`, the second result of `get_rope_index`); the
same rule read off `Embedded.positions` gives delta = 0 for plain RoPE.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from jaxtyping import Array, Float, Int

from models import family, qwen2
from models import qwen2_vl_vision as vision

Params = dict[str, Any]

TEXT, IMAGE, VIDEO = 0, 1, 2  # mm_token_type_ids values


@dataclasses.dataclass(frozen=True)
class Qwen2VLConfig:
  model_type: str  # "qwen2_vl" or "qwen2_5_vl"
  text: qwen2.Qwen2Config
  vision: vision.VisionConfig
  image_token_id: int
  video_token_id: int
  # Qwen2.5-VL: temporal M-RoPE ids per second of video; None for Qwen2-VL.
  tokens_per_second: float | None = None


HF_CONFIGS = {"qwen2_vl": transformers.Qwen2VLConfig, "qwen2_5_vl": transformers.Qwen2_5_VLConfig}


def parse_config(hf: Mapping[str, Any]) -> Qwen2VLConfig:
  """From config.json, flat (released checkpoints) or nested (transformers v5); transformers'
  own config class fills the defaults it would use."""
  model_type = hf["model_type"]
  full = HF_CONFIGS[model_type].from_dict(dict(hf)).to_dict()
  vc = full["vision_config"]
  return Qwen2VLConfig(
    model_type=model_type,
    text=qwen2.Qwen2Config.from_hf(full["text_config"], tie_word_embeddings=full["tie_word_embeddings"]),
    vision=vision.VisionConfig.from_hf(model_type, vc),
    image_token_id=full["image_token_id"],
    video_token_id=full["video_token_id"],
    tokens_per_second=vc["tokens_per_second"] if model_type == "qwen2_5_vl" else None,
  )


def init(cfg: Qwen2VLConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  """Random params (tests, `jax.eval_shape`); real weights come from `convert`."""
  kv, kd = jax.random.split(key)
  return {"vision": vision.init_params(cfg.vision, kv, dtype), "decoder": qwen2.init(cfg.text, kd, dtype)}


# --------------------------------------------------------------------------- M-RoPE positions (host)


def token_types(cfg: Qwen2VLConfig, input_ids: np.ndarray) -> np.ndarray:
  """`mm_token_type_ids` as the processor builds it: image tokens 1, video tokens 2, text 0."""
  ids = np.asarray(input_ids)
  return np.where(ids == cfg.image_token_id, IMAGE, np.where(ids == cfg.video_token_id, VIDEO, TEXT))


def vision_positions(start: int, grid_thw, merge: int, time_interval) -> np.ndarray:
  """transformers' `get_vision_position_ids`: [3, t·h·w/merge²] (temporal, row, col) ids.

  `time_interval` is an int, or a float32 for Qwen2.5-VL videos: torch
  multiplies in float32 and truncates with `.long()`.
  """
  t, h, w = (int(g) for g in grid_thw)
  h, w = h // merge, w // merge
  if isinstance(time_interval, (float, np.floating)):
    temporal = (np.arange(t, dtype=np.float32) * np.float32(time_interval)).astype(np.int64)
  else:
    temporal = np.arange(t) * time_interval
  tt, hh, ww = np.meshgrid(temporal, np.arange(h) + start, np.arange(w) + start, indexing="ij")
  pos = np.stack([tt, hh, ww]).reshape(3, -1)
  pos[0] += start  # after the interval multiply, as transformers does
  return pos


def get_rope_index(
  cfg: Qwen2VLConfig,
  input_ids: Int[np.ndarray, "B T"],
  mm_token_type_ids: Int[np.ndarray, "B T"] | None = None,
  image_grid_thw: Int[np.ndarray, "I 3"] | None = None,
  video_grid_thw: Int[np.ndarray, "I 3"] | None = None,
  second_per_grid_ts: Float[np.ndarray, " I"] | None = None,
  attention_mask: Int[np.ndarray, "B T"] | None = None,
) -> tuple[Int[np.ndarray, "3 B T"], Int[np.ndarray, "B 1"]]:
  """M-RoPE position ids and per-row deltas, exactly as transformers' `get_rope_index`.

  Text runs count up by one; each image or video run takes (temporal, row,
  col) ids offset by the running position, and the running position then
  advances by max(rows, cols) / merge. Qwen2.5-VL spaces video frames by
  `tokens_per_second · second_per_grid_ts`. Without any grid (text only)
  every row is 0..T-1 and the deltas are 0, which is what transformers'
  default positions amount to. Padding (attention_mask 0) gets position 0.
  Without `mm_token_type_ids` the types are read off the placeholder ids.
  """
  input_ids = np.asarray(input_ids)
  b, t = input_ids.shape
  if image_grid_thw is None and video_grid_thw is None:
    return np.broadcast_to(np.arange(t), (3, b, t)).copy(), np.zeros((b, 1), np.int64)
  types = token_types(cfg, input_ids) if mm_token_type_ids is None else np.asarray(mm_token_type_ids)
  mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  merge = cfg.vision.spatial_merge_size
  grids = {
    IMAGE: iter(np.asarray(image_grid_thw).reshape(-1, 3)) if image_grid_thw is not None else None,
    VIDEO: iter(np.asarray(video_grid_thw).reshape(-1, 3)) if video_grid_thw is not None else None,
  }
  seconds = iter(np.asarray(second_per_grid_ts, np.float32)) if second_per_grid_ts is not None else None
  positions = np.zeros((3, b, t), np.int64)
  deltas = np.zeros((b, 1), np.int64)
  for row in range(b):
    row_types = types[row][mask[row]]
    parts, current = [], 0
    for kind, run in itertools.groupby(row_types.tolist()):
      length = len(list(run))
      if kind == TEXT:
        parts.append(np.broadcast_to(np.arange(length) + current, (3, length)))
        current += length
      else:
        grid = next(grids[kind])
        interval = 1
        if kind == VIDEO and cfg.tokens_per_second is not None:
          # torch: int · float32 tensor, or int · 1 when no seconds are given.
          interval = cfg.tokens_per_second
          if seconds is not None:
            interval = np.float32(cfg.tokens_per_second) * next(seconds)
        parts.append(vision_positions(current, grid, merge, interval))
        current += max(int(grid[1]), int(grid[2])) // merge
    llm = np.concatenate(parts, axis=1)
    positions[:, row, mask[row]] = llm
    deltas[row, 0] = llm.max() + 1 - len(row_types)
  return positions, deltas


# --------------------------------------------------------------------------- the decoder's inputs


# The tower, compiled once per config and grid layout.
_vision = jax.jit(vision.forward, static_argnums=1)


def visual_features(
  params: Params, cfg: Qwen2VLConfig, pixel_values: Float[np.ndarray, "P E"], grid_thw: Int[np.ndarray, "I 3"]
) -> tuple[Float[Array, "M D"], dict[str, Array]]:
  """Merged visual tokens of all images (or videos) in order, and the tower's intermediates."""
  return _vision(params["vision"], cfg.vision, jnp.asarray(pixel_values), vision.layout(cfg.vision, grid_thw))


def embed_inputs(params: Params, cfg: Qwen2VLConfig, inputs: Mapping[str, Any]) -> family.Embedded:
  """Decoder inputs from the keys transformers' forward takes (see the module docstring)."""
  ids = np.asarray(inputs["input_ids"])
  mask = np.asarray(inputs.get("attention_mask", np.ones_like(ids)), np.int32)
  media = []
  for kind, pixels, grid, token_id in (
    ("Image", "pixel_values", "image_grid_thw", cfg.image_token_id),
    ("Video", "pixel_values_videos", "video_grid_thw", cfg.video_token_id),
  ):
    if inputs.get(pixels) is None:
      continue
    hit, grid_thw = ids == token_id, np.asarray(inputs[grid]).reshape(-1, 3)
    rows = int(grid_thw.prod(-1).sum()) // cfg.vision.merge_unit
    if int(hit.sum()) != rows:
      raise ValueError(
        f"{kind} features and {kind.lower()} tokens do not match, tokens: {int(hit.sum())}, features: {rows}"
      )
    media.append((hit, inputs[pixels], grid_thw))
  positions, _ = get_rope_index(
    cfg,
    ids,
    inputs.get("mm_token_type_ids"),
    inputs.get("image_grid_thw"),
    inputs.get("video_grid_thw"),
    inputs.get("second_per_grid_ts"),
    mask,
  )
  embeds = qwen2.embed(params["decoder"], jnp.asarray(ids))
  visual = np.zeros(ids.shape, bool)
  for hit, pixels, grid_thw in media:
    rows, _ = visual_features(params, cfg, pixels, grid_thw)
    embeds = family.scatter_rows(embeds, jnp.asarray(hit), rows)
    visual |= hit
  return family.Embedded(embeds, jnp.asarray(positions, jnp.int32), jnp.asarray(mask), jnp.asarray(visual))


def _family(model_type: str, architecture: str) -> family.Family:
  return family.Family(
    model_type=model_type,
    hf_architecture=architecture,
    parse_config=parse_config,
    init_params=init,
    embed_inputs=embed_inputs,
  )


QWEN2_VL = _family("qwen2_vl", "Qwen2VLForConditionalGeneration")
QWEN2_5_VL = _family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration")
