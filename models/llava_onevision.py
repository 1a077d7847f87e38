"""LLaVA-OneVision: SigLIP, a two-layer projector, the Qwen2 decoder; video and any-res images.

Axes: B batch, T tokens, F frames (or image tiles), C channels, P patches a
frame, Y/X patch rows/columns, D decoder width, M visual rows.

Everything follows transformers' LlavaOnevisionModel:
- a frame or tile goes through SigLIP; the hidden states at
  `vision_feature_layer` (one index or several, concatenated) are taken,
  the first token dropped under the "default" strategy, then projected;
- video: each frame's Y x X grid is resized bilinearly to ceil(Y/2) x ceil(X/2)
  (`F.interpolate(mode="bilinear")`, 27x27 -> 14x14 = 196 tokens at 384 px),
  frames are concatenated and one `image_newline` row is appended per video;
- images: the base tile, then the any-res tiles laid out as one grid,
  unpadded to the image's aspect ratio, shrunk bilinearly when larger than
  `anyres_max_N` tiles, with `image_newline` closing every row; an image of
  a multi-image sample is its base tile plus one newline;
- the rows replace the <image> / <video> token embeddings in order.

Params: {"vision": siglip params, "projector": {linear_1, linear_2: {w, b}},
"image_newline": [D], "decoder": qwen2 params}.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from jaxtyping import Array, Float
from transformers.image_processing_utils import select_best_resolution

from models import family, layers, qwen2, siglip

Params = dict


@dataclasses.dataclass(frozen=True)
class LlavaOnevisionConfig:
  vision: siglip.SiglipConfig
  text: qwen2.Qwen2Config
  image_token_id: int
  video_token_id: int
  feature_layers: tuple[int, ...]  # SigLIP hidden-state indices, concatenated
  drop_first_token: bool  # vision_feature_select_strategy == "default"
  projector_act: str
  projector_bias: bool
  image_grid_pinpoints: tuple[tuple[int, int], ...]
  max_num_patches: int  # N of vision_aspect_ratio "anyres_max_N"

  @property
  def pooled_grid(self) -> int:
    return math.ceil(self.vision.grid / 2)

  @property
  def tokens_per_frame(self) -> int:
    return self.pooled_grid ** 2


def parse_config(hf: Mapping[str, Any]) -> LlavaOnevisionConfig:
  """From config.json; transformers' own config class fills the defaults it would use."""
  full = transformers.LlavaOnevisionConfig.from_dict(dict(hf)).to_dict()
  layer = full["vision_feature_layer"]
  strategy = full["vision_feature_select_strategy"]
  if strategy not in ("default", "full"):
    raise ValueError(f"unknown vision_feature_select_strategy {strategy!r}")
  return LlavaOnevisionConfig(
      vision=siglip.SiglipConfig.from_hf(full["vision_config"]),
      text=qwen2.Qwen2Config.from_hf(full["text_config"], tie_word_embeddings=full["tie_word_embeddings"]),
      image_token_id=full["image_token_index"],
      video_token_id=full["video_token_index"],
      feature_layers=(layer,) if isinstance(layer, int) else tuple(layer),
      drop_first_token=strategy == "default",
      projector_act=full["projector_hidden_act"],
      projector_bias=full["multimodal_projector_bias"],
      image_grid_pinpoints=tuple(tuple(p) for p in full["image_grid_pinpoints"]),
      max_num_patches=int(full["vision_aspect_ratio"].strip("anyres_max_")),  # as transformers parses it
  )


def init(cfg: LlavaOnevisionConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  kv, kp, kn, kd = jax.random.split(key, 4)
  d_in, d = cfg.vision.hidden_size * len(cfg.feature_layers), cfg.text.hidden_size
  proj = {"linear_1": {"w": (d_in, d)}, "linear_2": {"w": (d, d)}}
  if cfg.projector_bias:
    proj["linear_1"]["b"], proj["linear_2"]["b"] = (d,), (d,)
  return {
      "vision": siglip.init(cfg.vision, kv, dtype),
      "projector": layers.init_tree(kp, proj, dtype),
      "image_newline": layers.normal(kn, (d,), dtype, std=d ** -0.5),
      "decoder": qwen2.init(cfg.text, kd, dtype),
  }


# ----------------------------------------------------------------------------- vision features


def project(params: Params, cfg: LlavaOnevisionConfig, x: Float[Array, "... E"]) -> Float[Array, "... D"]:
  """The multimodal projector: linear, activation, linear."""
  act = layers.activation(cfg.projector_act)
  return layers.dense(params["projector"]["linear_2"], act(layers.dense(params["projector"]["linear_1"], x)))


def frame_features(params: Params, cfg: LlavaOnevisionConfig, pixel_values: Float[Array, "F C H W"], *,
                   implementation: str | None = None) -> Float[Array, "F P D"]:
  """SigLIP, the selected hidden states, the projector: one row a patch."""
  _, states = siglip.forward(params["vision"], cfg.vision, pixel_values, cfg.feature_layers,
                             implementation=implementation)
  x = jnp.concatenate(states, axis=-1)
  if cfg.drop_first_token:
    x = x[:, 1:]
  return project(params, cfg, x)


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in] weights of torch's bilinear resize (align_corners=False, no antialias) on one axis.

  Follows `upsample_bilinear2d` in float32: src = scale * (dst + 0.5) - 0.5 with
  scale = n_in / n_out, clamped at 0, mixing floor(src) and the next index
  (clamped to the edge). torch evaluates src as one fused multiply-add; the
  float64 product rounded once to float32 reproduces it bit for bit.
  """
  scale = np.float32(n_in / n_out)
  src = np.maximum((np.float64(scale) * (np.arange(n_out) + 0.5) - 0.5).astype(np.float32), 0)
  i0 = src.astype(np.int64)
  i1 = np.minimum(i0 + 1, n_in - 1)
  w1 = src - i0.astype(np.float32)
  m = np.zeros((n_out, n_in), np.float32)
  np.add.at(m, (np.arange(n_out), i0), 1 - w1)
  np.add.at(m, (np.arange(n_out), i1), w1)
  return m


def bilinear_resize(x: Float[Array, "B Y X D"], size: tuple[int, int]) -> Float[Array, "B U V D"]:
  wy = jnp.asarray(bilinear_matrix(x.shape[1], size[0]), x.dtype)
  wx = jnp.asarray(bilinear_matrix(x.shape[2], size[1]), x.dtype)
  return jnp.einsum("UY,BYXD,VX->BUVD", wy, x, wx)


def pool_frames(cfg: LlavaOnevisionConfig, feats: Float[Array, "F P D"]) -> Float[Array, "F Q D"]:
  """transformers' `apply_pooling`: the patch grid resized to ceil(grid / 2) a side."""
  f, _, d = feats.shape
  g = cfg.vision.grid
  pooled = bilinear_resize(feats.reshape(f, g, g, d), (cfg.pooled_grid, cfg.pooled_grid))
  return pooled.reshape(f, -1, d)


def video_features(params: Params, cfg: LlavaOnevisionConfig, pixel_values_videos: Float[Array, "B F C H W"], *,
                   implementation: str | None = None) -> Float[Array, "B M D"]:
  """[B, F * tokens_per_frame + 1, D]: pooled frames, then the newline row."""
  b, f = pixel_values_videos.shape[:2]
  feats = frame_features(params, cfg, pixel_values_videos.reshape(b * f, *pixel_values_videos.shape[2:]),
                         implementation=implementation)
  feats = pool_frames(cfg, feats).reshape(b, -1, feats.shape[-1])
  newline = jnp.broadcast_to(params["image_newline"].astype(feats.dtype), (b, 1, feats.shape[-1]))
  return jnp.concatenate([feats, newline], axis=1)


def _select_best_resolution(size: tuple[int, int], pinpoints: Sequence[tuple[int, int]]) -> tuple[int, int]:
  return tuple(select_best_resolution(list(size), [list(p) for p in pinpoints]))


def num_tiles(cfg, size: tuple[int, int]) -> int:
  """transformers' `image_size_to_num_patches`: the any-res tiles plus the base tile."""
  h, w = _select_best_resolution(size, cfg.image_grid_pinpoints)
  s = cfg.vision.image_size
  return math.ceil(h / s) * math.ceil(w / s) + 1


def _unpad(x: Float[Array, "Y X D"], size: tuple[int, int]) -> Float[Array, "U V D"]:
  """transformers' `unpad_image` on a [rows, cols, D] grid."""
  oh, ow = size
  ch, cw = x.shape[:2]
  if ow / oh > cw / ch:
    pad = (ch - int(round(oh * (cw / ow), 7))) // 2
    return x[pad: ch - pad]
  pad = (cw - int(round(ow * (ch / oh), 7))) // 2
  return x[:, pad: cw - pad]


def pack_image(params: Params, cfg, tiles: Float[Array, "F P D"], size: tuple[int, int]):
  """transformers' `pack_image_features` for one image: [rows of the image, D].

  Shared with LLaVA-NeXT, whose config has no `anyres_max_N` (max_num_patches None): no shrinking.
  """
  newline = params["image_newline"].astype(tiles.dtype)
  if tiles.shape[0] == 1:
    return jnp.concatenate([tiles[0], newline[None]], axis=0)
  g, d = cfg.vision.grid, tiles.shape[-1]
  if g * g != tiles.shape[1]:
    raise ValueError("The number of patches is not consistent with the image size.")
  bh, bw = _select_best_resolution(size, cfg.image_grid_pinpoints)
  rows, cols = bh // cfg.vision.image_size, bw // cfg.vision.image_size
  grid = tiles[1:].reshape(rows, cols, g, g, d).transpose(0, 2, 1, 3, 4).reshape(rows * g, cols * g, d)
  grid = _unpad(grid, size)
  ch, cw = grid.shape[:2]
  ratio = 0.0 if cfg.max_num_patches is None else math.sqrt(ch * cw / (cfg.max_num_patches * g ** 2))
  if ratio > 1.1:
    grid = bilinear_resize(grid[None], (int(ch // ratio), int(cw // ratio)))[0]
  grid = jnp.concatenate([grid, jnp.broadcast_to(newline, (grid.shape[0], 1, d))], axis=1)
  return jnp.concatenate([tiles[0], grid.reshape(-1, d)], axis=0)


def image_features(params: Params, cfg: LlavaOnevisionConfig, pixel_values, image_sizes, batch_num_images=None, *,
                   implementation: str | None = None) -> list[Float[Array, "M D"]]:
  """One [rows, D] array per image; pixel_values [I, tiles, C, H, W] (padded) or [all tiles, C, H, W]."""
  sizes = [tuple(int(v) for v in s) for s in np.asarray(image_sizes)]
  if batch_num_images is None:
    tiled = [True] * len(sizes)
  else:
    tiled = [int(n) == 1 for n in np.asarray(batch_num_images) for _ in range(int(n))]
  counts = [num_tiles(cfg, s) if t else 1 for s, t in zip(sizes, tiled)]
  pixel_values = jnp.asarray(pixel_values)
  if pixel_values.ndim == 5:
    pixel_values = jnp.concatenate([p[:n] for p, n in zip(pixel_values, counts)], axis=0)
  elif pixel_values.ndim != 4:
    raise ValueError(f"pixel_values of shape {pixel_values.shape}, expect to be of 4 or 5 dimensions")
  feats = _frame_features(params, cfg, pixel_values, implementation=implementation)
  starts = np.cumsum([0, *counts])
  return [pack_image(params, cfg, feats[a:b], s) for a, b, s in zip(starts[:-1], starts[1:], sizes)]


_frame_features = jax.jit(frame_features, static_argnames=("cfg", "implementation"))
_video_features = jax.jit(video_features, static_argnames=("cfg", "implementation"))


# ----------------------------------------------------------------------------- the decoder's inputs


def embed_inputs(params: Params, cfg: LlavaOnevisionConfig, inputs: Mapping[str, Any], *,
                 implementation: str | None = None) -> family.Embedded:
  """Decoder inputs from the keys transformers' forward takes: input_ids, attention_mask,
  pixel_values_videos, and pixel_values + image_sizes (+ batch_num_images)."""
  ids = np.asarray(inputs["input_ids"])
  mask = np.asarray(inputs.get("attention_mask", np.ones_like(ids)), np.int32)
  embeds = qwen2.embed(params["decoder"], jnp.asarray(ids))
  image_mask, video_mask = ids == cfg.image_token_id, ids == cfg.video_token_id
  if inputs.get("pixel_values") is not None:
    rows = jnp.concatenate(image_features(params, cfg, inputs["pixel_values"], inputs["image_sizes"],
                                          inputs.get("batch_num_images"), implementation=implementation))
    family.check_count("Image", image_mask, rows.shape[0])
    embeds = family.scatter_rows(embeds, jnp.asarray(image_mask), rows)
  if inputs.get("pixel_values_videos") is not None:
    rows = _video_features(params, cfg, jnp.asarray(inputs["pixel_values_videos"]), implementation=implementation)
    rows = rows.reshape(-1, rows.shape[-1])
    family.check_count("Video", video_mask, rows.shape[0])
    embeds = family.scatter_rows(embeds, jnp.asarray(video_mask), rows)
  mask = jnp.asarray(mask)
  return family.Embedded(embeds, qwen2.text_positions(mask), mask, jnp.asarray(image_mask | video_mask))


FAMILY = family.Family(
    model_type="llava_onevision",
    hf_architecture="LlavaOnevisionForConditionalGeneration",
    parse_config=parse_config,
    init_params=init,
    embed_inputs=embed_inputs,
)
