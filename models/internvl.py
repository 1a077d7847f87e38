"""InternVL: InternViT, pixel shuffle, an MLP projector and its LLM (Qwen2, Llama or InternLM2).

Axes: B batch, T tokens, F tiles (images or video frames), C channels, Y/X
patch rows/columns, E vision width, D decoder width, M visual rows.

Two checkpoint layouts, one model:
- "internvl": transformers' native format (InternVLForConditionalGeneration;
  its InternLM2 checkpoints were converted to Llama, q/k/v split);
- "internvl_chat": the original release (InternVL2-8B: InternLM2-chat with a
  fused `wqkv`, remote code), converted by `convert.tables.internvl`.

A tile goes through InternViT; the hidden state of `vision_feature_layer`
(-1: the last one) loses its class token, its Y x X grid is pixel-shuffled to
Y/2 x X/2 with 4E channels (each output row is the 2x2 block of patches
(2i, 2j), (2i, 2j+1), (2i+1, 2j), (2i+1, 2j+1), concatenated), then LayerNorm,
linear, GELU, linear: 256 rows a 448 px tile. The rows replace the
<IMG_CONTEXT> tokens in order (`pixel_values` [F, C, H, W]).

Video: every sampled frame is one 448 px tile, without InternVL's dynamic
tiling (as InternVL's own video inference does). InternVL writes
"Frame{i}: <img>…</img>" per frame; here all frames' <IMG_CONTEXT> tokens sit
back to back inside one <img>…</img>, so that they form one contiguous visual
block for the window search (`models.inputs`).

Params: {"vision": intern_vit params, "projector": {norm {scale, bias},
linear_1, linear_2 {w, b}}, "decoder": qwen2 params}.
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

from models import family, intern_vit, layers, qwen2

Params = dict

# <IMG_CONTEXT> in InternVL2's InternLM2 tokenizer (the original config.json does not name it).
INTERNLM2_IMG_CONTEXT_ID = 92546
PROJECTOR_EPS = 1e-5  # the projector's nn.LayerNorm default


@dataclasses.dataclass(frozen=True)
class InternVLConfig:
  model_type: str  # "internvl" or "internvl_chat"
  vision: intern_vit.InternViTConfig
  text: qwen2.Qwen2Config
  image_token_id: int  # <IMG_CONTEXT>
  feature_layer: int  # -1: the last hidden state (post-normed if the tower has a final norm)
  drop_first_token: bool  # vision_feature_select_strategy == "default": drop the class token
  downsample_ratio: float
  projector_act: str
  decoder: str  # the LLM config's model_type: "qwen2", "llama" or "internlm2" (original layout only)

  @property
  def shuffle(self) -> int:
    """Pixel-shuffle factor: patches merged along each side (1 / downsample_ratio)."""
    return round(1 / self.downsample_ratio)

  @property
  def tokens_per_frame(self) -> int:
    return (self.vision.grid // self.shuffle) ** 2


def parse_config(hf: Mapping[str, Any]) -> InternVLConfig:
  """From config.json, in either layout (see the module docstring)."""
  if hf["model_type"] == "internvl_chat":
    return _parse_original(hf)
  full = transformers.InternVLConfig.from_dict(dict(hf)).to_dict()
  layer, strategy = full["vision_feature_layer"], full["vision_feature_select_strategy"]
  if not isinstance(layer, int):
    raise TypeError(f"InternVL with several vision feature layers {layer} is not supported")
  if strategy not in ("default", "full"):
    raise ValueError(f"unknown vision_feature_select_strategy {strategy!r}")
  return _checked(
    InternVLConfig(
      model_type="internvl",
      vision=intern_vit.InternViTConfig.from_hf(full["vision_config"]),
      text=qwen2.Qwen2Config.from_hf(full["text_config"], tie_word_embeddings=full["tie_word_embeddings"]),
      image_token_id=full["image_token_id"],
      feature_layer=layer,
      drop_first_token=strategy == "default",
      downsample_ratio=float(full["downsample_ratio"]),
      projector_act=full["projector_hidden_act"],
      decoder=full["text_config"]["model_type"],
    )
  )


def _parse_original(hf: Mapping[str, Any]) -> InternVLConfig:
  """The original InternVLChatConfig: vision_config (InternViT), llm_config (InternLM2 or Qwen2), select_layer."""
  llm = hf["llm_config"]
  if hf.get("ps_version", "v2") != "v2":
    raise ValueError(f"InternVL pixel shuffle {hf['ps_version']!r} is not supported; supported: 'v2'")
  token = hf.get("img_context_token_id")
  if token is None:
    if llm.get("model_type") != "internlm2":
      raise ValueError(
        "config.json has no img_context_token_id: add the tokenizer's <IMG_CONTEXT> id "
        "(known by default only for InternLM2 tokenizers)"
      )
    token = INTERNLM2_IMG_CONTEXT_ID
  return _checked(
    InternVLConfig(
      model_type="internvl_chat",
      vision=intern_vit.InternViTConfig.from_original(hf["vision_config"]),
      text=qwen2.Qwen2Config.from_hf(llm, tie_word_embeddings=llm.get("tie_word_embeddings", False)),
      image_token_id=int(token),
      feature_layer=int(hf.get("select_layer", -1)),
      drop_first_token=True,
      downsample_ratio=float(hf.get("downsample_ratio", 0.5)),
      projector_act="gelu",
      decoder=llm.get("model_type", "internlm2"),
    )
  )


def _checked(cfg: InternVLConfig) -> InternVLConfig:
  if abs(cfg.shuffle * cfg.downsample_ratio - 1) > 1e-6 or cfg.vision.grid % cfg.shuffle:
    raise ValueError(
      f"downsample_ratio {cfg.downsample_ratio} must be 1/n with n dividing the {cfg.vision.grid}-patch grid"
    )
  return cfg


def init(cfg: InternVLConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  kv, kp, kd = jax.random.split(key, 3)
  e, d = cfg.vision.hidden_size * cfg.shuffle**2, cfg.text.hidden_size
  proj = {
    "norm": {"scale": (e,), "bias": (e,)},
    "linear_1": {"w": (e, d), "b": (d,)},
    "linear_2": {"w": (d, d), "b": (d,)},
  }
  return {
    "vision": intern_vit.init(cfg.vision, kv, dtype),
    "projector": layers.init_tree(kp, proj, dtype),
    "decoder": qwen2.init(cfg.text, kd, dtype),
  }


# ----------------------------------------------------------------------------- vision features


def pixel_shuffle(x: Float[Array, "F Y X E"], s: int) -> Float[Array, "F U V G"]:
  """transformers' `pixel_shuffle` (InternVL's ps_version v2): each s x s block of patches, row by row,
  becomes one row of s*s*E channels."""
  f, y, x_, e = x.shape
  x = x.reshape(f, y // s, s, x_ // s, s, e).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(f, y // s, x_ // s, s * s * e)


def project(params: Params, cfg: InternVLConfig, x: Float[Array, "... G"]) -> Float[Array, "... D"]:
  """The projector (`mlp1` in the original): LayerNorm, linear, activation, linear."""
  p = params["projector"]
  x = layers.layer_norm(p["norm"], x, PROJECTOR_EPS)
  return layers.dense(p["linear_2"], layers.activation(cfg.projector_act)(layers.dense(p["linear_1"], x)))


def tile_features(
  params: Params, cfg: InternVLConfig, pixel_values: Float[Array, "F C H W"], *, implementation: str | None = None
) -> Float[Array, "F M D"]:
  """InternViT, the selected hidden state, pixel shuffle, projector: `tokens_per_frame` rows a tile."""
  last_only = cfg.feature_layer == -1
  last, states = intern_vit.forward(
    params["vision"], cfg.vision, pixel_values, () if last_only else (cfg.feature_layer,), implementation=implementation
  )
  x = last if last_only else states[0]
  if cfg.drop_first_token:
    x = x[:, 1:]
  g = cfg.vision.grid
  x = pixel_shuffle(x.reshape(x.shape[0], g, g, -1), cfg.shuffle)
  return project(params, cfg, x.reshape(x.shape[0], -1, x.shape[-1]))


_tile_features = jax.jit(tile_features, static_argnames=("cfg", "implementation"))


def embed_inputs(
  params: Params, cfg: InternVLConfig, inputs: Mapping[str, Any], *, implementation: str | None = None
) -> family.Embedded:
  """Decoder inputs from input_ids, attention_mask and pixel_values [tiles, C, H, W] (images or frames)."""
  ids = np.asarray(inputs["input_ids"])
  mask = jnp.asarray(np.asarray(inputs.get("attention_mask", np.ones_like(ids)), np.int32))
  embeds = qwen2.embed(params["decoder"], jnp.asarray(ids))
  image_mask = ids == cfg.image_token_id
  if inputs.get("pixel_values") is not None:
    rows = _tile_features(params, cfg, jnp.asarray(inputs["pixel_values"]), implementation=implementation)
    rows = rows.reshape(-1, rows.shape[-1])
    family.check_count("Image", image_mask, rows.shape[0])
    embeds = family.scatter_rows(embeds, jnp.asarray(image_mask), rows)
  return family.Embedded(embeds, qwen2.text_positions(mask), mask, jnp.asarray(image_mask))


INTERNVL = family.Family(
  model_type="internvl",
  hf_architecture="InternVLForConditionalGeneration",
  parse_config=parse_config,
  init_params=init,
  embed_inputs=embed_inputs,
)

# The original layout's class is remote code (not in transformers).
INTERNVL_CHAT = family.Family(
  model_type="internvl_chat",
  hf_architecture="InternVLChatModel",
  parse_config=parse_config,
  init_params=init,
  embed_inputs=embed_inputs,
)
