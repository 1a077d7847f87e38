"""LLaVA-1.5 ("llava") and LLaVA-1.6 / LLaVA-NeXT ("llava_next"): CLIP, a two-layer projector,
a Llama (Vicuna) or Mistral decoder.

Axes: B batch, T tokens, F frames (or image tiles), C channels, P patches a
tile, D decoder width, M visual rows.

Everything follows transformers' LlavaModel and LlavaNextModel:
- a tile goes through CLIP; the hidden states at `vision_feature_layer`
  (-2 in the checkpoints; several indices are concatenated) are taken, the
  class token dropped under the "default" strategy, then projected: 576 rows
  a 336 px tile;
- LLaVA-1.5 images are one tile each (`pixel_values` [I, C, H, W]);
- LLaVA-NeXT images are the base tile plus the any-res tiles, laid out as one
  grid, unpadded to the image's aspect ratio, with `image_newline` closing
  every row (LLaVA-OneVision's path, without its `anyres_max_N` shrinking);
- the rows replace the <image> token embeddings in order.

Video: neither model has a video path, so each sampled frame is an image.
LLaVA-1.5 gives 576 rows a frame. For LLaVA-NeXT every frame is a base tile
alone, without any-res tiling (transformers' path for a one-tile image: the
tile's rows, then one `image_newline`): 577 rows a frame, where tiling would
give some 2,000 and 100 frames would not fit the context. transformers'
LlavaNextForConditionalGeneration cannot express a one-tile image (it derives
the tile count from `image_sizes`), so these frames arrive under our own key
`pixel_values_videos` [B, F, C, H, W]. With one <image> placeholder a frame,
placed back to back, a request's frames form one contiguous visual block for
the window search.

Params: {"vision": clip params, "projector": {linear_1, linear_2: {w, b}},
"image_newline": [D] (llava_next only), "decoder": qwen2 params}.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from jaxtyping import Array, Float

from models import clip, family, layers, llava_onevision, qwen2

Params = dict

HF_CONFIGS = {"llava": transformers.LlavaConfig, "llava_next": transformers.LlavaNextConfig}


@dataclasses.dataclass(frozen=True)
class LlavaConfig:
  model_type: str  # "llava" or "llava_next"
  vision: clip.ClipConfig
  text: qwen2.Qwen2Config
  image_token_id: int
  feature_layers: tuple[int, ...]  # CLIP hidden-state indices, concatenated
  drop_first_token: bool  # vision_feature_select_strategy == "default": drop the class token
  projector_act: str
  projector_bias: bool
  decoder: str = "llama"  # the text config's model_type ("llama" or "mistral"): picks the fallback chat format
  image_grid_pinpoints: tuple[tuple[int, int], ...] = ()  # llava_next's any-res grids
  max_num_patches: int | None = None  # no anyres_max_N shrinking (LLaVA-OneVision's only)

  @property
  def newline(self) -> bool:
    return self.model_type == "llava_next"

  @property
  def tokens_per_tile(self) -> int:
    return self.vision.grid**2 + (0 if self.drop_first_token else 1)

  @property
  def tokens_per_frame(self) -> int:
    """Rows of one video frame: its tile, and LLaVA-NeXT's newline after it."""
    return self.tokens_per_tile + int(self.newline)


def parse_config(hf: Mapping[str, Any]) -> LlavaConfig:
  """From config.json; transformers' own config class fills the defaults it would use."""
  model_type = hf["model_type"]
  full = HF_CONFIGS[model_type].from_dict(dict(hf)).to_dict()
  vision = full["vision_config"]
  if vision.get("model_type") != "clip_vision_model":
    raise ValueError(f"unsupported {model_type} vision tower {vision.get('model_type')!r}; supported: CLIP")
  layer = full["vision_feature_layer"]
  strategy = full["vision_feature_select_strategy"]
  if strategy not in ("default", "full"):
    raise ValueError(f"unknown vision_feature_select_strategy {strategy!r}")
  pinpoints = full.get("image_grid_pinpoints") if model_type == "llava_next" else None
  return LlavaConfig(
    model_type=model_type,
    vision=clip.ClipConfig.from_hf(vision),
    text=qwen2.Qwen2Config.from_hf(full["text_config"], tie_word_embeddings=full["tie_word_embeddings"]),
    image_token_id=full["image_token_index"],
    feature_layers=(layer,) if isinstance(layer, int) else tuple(layer),
    drop_first_token=strategy == "default",
    projector_act=full["projector_hidden_act"],
    projector_bias=full["multimodal_projector_bias"],
    decoder=full["text_config"]["model_type"],
    image_grid_pinpoints=tuple(tuple(p) for p in pinpoints or ()),
  )


def init(cfg: LlavaConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  kv, kp, kn, kd = jax.random.split(key, 4)
  d_in, d = cfg.vision.hidden_size * len(cfg.feature_layers), cfg.text.hidden_size
  proj = {"linear_1": {"w": (d_in, d)}, "linear_2": {"w": (d, d)}}
  if cfg.projector_bias:
    proj["linear_1"]["b"], proj["linear_2"]["b"] = (d,), (d,)
  params = {
    "vision": clip.init(cfg.vision, kv, dtype),
    "projector": layers.init_tree(kp, proj, dtype),
    "decoder": qwen2.init(cfg.text, kd, dtype),
  }
  if cfg.newline:
    params["image_newline"] = layers.normal(kn, (d,), dtype, std=d**-0.5)
  return params


# ----------------------------------------------------------------------------- vision features


def tile_features(
  params: Params, cfg: LlavaConfig, pixel_values: Float[Array, "F C H W"], *, implementation: str | None = None
) -> Float[Array, "F P D"]:
  """CLIP, the selected hidden states, the projector: one row a patch (and the class token under "full")."""
  _, states = clip.forward(
    params["vision"], cfg.vision, pixel_values, cfg.feature_layers, implementation=implementation
  )
  x = jnp.concatenate(states, axis=-1)
  if cfg.drop_first_token:
    x = x[:, 1:]
  return llava_onevision.project(params, cfg, x)


_tile_features = jax.jit(tile_features, static_argnames=("cfg", "implementation"))


def frame_rows(
  params: Params, cfg: LlavaConfig, pixel_values: Float[Array, "F C H W"], *, implementation: str | None = None
) -> Float[Array, "M D"]:
  """Every frame as one tile, frames back to back; LLaVA-NeXT closes each frame with its newline."""
  feats = _tile_features(params, cfg, jnp.asarray(pixel_values), implementation=implementation)
  if cfg.newline:
    newline = params["image_newline"].astype(feats.dtype)
    feats = jnp.concatenate([feats, jnp.broadcast_to(newline, (feats.shape[0], 1, feats.shape[-1]))], axis=1)
  return feats.reshape(-1, feats.shape[-1])


def anyres_rows(
  params: Params, cfg: LlavaConfig, pixel_values, image_sizes, *, implementation: str | None = None
) -> list[Float[Array, "M D"]]:
  """LLaVA-NeXT: one [rows, D] array per image; pixel_values [I, tiles, C, H, W] (padded) or [all tiles, C, H, W]."""
  sizes = [tuple(int(v) for v in s) for s in np.asarray(image_sizes)]
  counts = [llava_onevision.num_tiles(cfg, s) for s in sizes]
  pixel_values = jnp.asarray(pixel_values)
  if pixel_values.ndim == 5:
    pixel_values = jnp.concatenate([p[:n] for p, n in zip(pixel_values, counts)], axis=0)
  elif pixel_values.ndim != 4:
    raise ValueError(f"pixel_values of shape {pixel_values.shape}, expect to be of 4 or 5 dimensions")
  feats = _tile_features(params, cfg, pixel_values, implementation=implementation)
  starts = np.cumsum([0, *counts])
  return [llava_onevision.pack_image(params, cfg, feats[a:b], s) for a, b, s in zip(starts[:-1], starts[1:], sizes)]


# ----------------------------------------------------------------------------- the decoder's inputs


def embed_inputs(
  params: Params, cfg: LlavaConfig, inputs: Mapping[str, Any], *, implementation: str | None = None
) -> family.Embedded:
  """Decoder inputs from input_ids, attention_mask and the pixels:
  "llava": pixel_values [I, C, H, W] (images or frames);
  "llava_next": pixel_values [I, tiles, C, H, W] + image_sizes (any-res images), or our
  pixel_values_videos [B, F, C, H, W] (frames, one tile each)."""
  ids = np.asarray(inputs["input_ids"])
  mask = jnp.asarray(np.asarray(inputs.get("attention_mask", np.ones_like(ids)), np.int32))
  embeds = qwen2.embed(params["decoder"], jnp.asarray(ids))
  image_mask = ids == cfg.image_token_id
  images, videos = inputs.get("pixel_values"), inputs.get("pixel_values_videos")
  if images is not None and videos is not None:
    raise ValueError(
      "pass images (pixel_values) or video frames (pixel_values_videos), not both: both fill the <image> tokens"
    )
  rows = None
  if images is not None and cfg.newline:
    rows = jnp.concatenate(anyres_rows(params, cfg, images, inputs["image_sizes"], implementation=implementation))
  elif images is not None:
    rows = frame_rows(params, cfg, images, implementation=implementation)
  elif videos is not None:
    if not cfg.newline:
      raise ValueError("LLaVA-1.5 takes video frames as images: pass them as pixel_values [frames, C, H, W]")
    videos = np.asarray(videos)
    rows = frame_rows(params, cfg, videos.reshape(-1, *videos.shape[2:]), implementation=implementation)
  if rows is not None:
    family.check_count("Image", image_mask, rows.shape[0])
    embeds = family.scatter_rows(embeds, jnp.asarray(image_mask), rows)
  return family.Embedded(embeds, qwen2.text_positions(mask), mask, jnp.asarray(image_mask))


LLAVA = family.Family(
  model_type="llava",
  hf_architecture="LlavaForConditionalGeneration",
  parse_config=parse_config,
  init_params=init,
  embed_inputs=embed_inputs,
)

LLAVA_NEXT = family.Family(
  model_type="llava_next",
  hf_architecture="LlavaNextForConditionalGeneration",
  parse_config=parse_config,
  init_params=init,
  embed_inputs=embed_inputs,
)
