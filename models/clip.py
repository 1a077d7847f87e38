"""The CLIP vision tower (LLaVA-1.5 / 1.6's ViT-L/14-336), as transformers' CLIPVisionModel computes it.

Axes: B images, C channels, Y/X patch rows/columns, p/q pixel row/column in a
patch, P patches (Y*X), D width, N heads, H head dim, F MLP width, L layers.

CLIP's encoder blocks are SigLIP's (pre-LayerNorm, biased q/k/v/o, fc1/fc2),
so the layers are `models.siglip`'s; CLIP adds a class token in front of the
patches (its position is row 0 of `pos_embed`), has no patch bias, and
LayerNorms the embeddings before the first block (`pre_ln`). `post_ln` only
normalizes the pooled class token, which VLMs never read; it is kept so that
checkpoints convert completely.

Params (layers stacked along L):

    patch_embed  {w [C, p, q, D]}   class_embed [D]   pos_embed [P + 1, D]   pre_ln {scale, bias [D]}
    layers       as models.siglip
    post_ln      {scale, bias [D]}

`forward` returns (last_hidden_state [B, P + 1, D], the hidden states at the
requested indices of transformers' `hidden_states` tuple: 0 = the pre-normed
embeddings, i = after layer i, negative from the end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from models import layers, siglip

Params = dict


@dataclasses.dataclass(frozen=True)
class ClipConfig(siglip.SiglipConfig):
  """CLIPVisionConfig: SigLIP's fields, CLIP's defaults."""

  layer_norm_eps: float = 1e-5
  hidden_act: str = "quick_gelu"


def param_shapes(cfg: ClipConfig) -> dict:
  shapes = siglip.param_shapes(cfg)
  d = cfg.hidden_size
  return {
    **shapes,
    "patch_embed": {"w": shapes["patch_embed"]["w"]},
    "class_embed": (d,),
    "pos_embed": (cfg.grid**2 + 1, d),
    "pre_ln": {"scale": (d,), "bias": (d,)},
  }


def init(cfg: ClipConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  return layers.init_tree(key, param_shapes(cfg), dtype)


def embed(params: Params, cfg: ClipConfig, pixel_values: Float[Array, "B C Yp Xq"]) -> Float[Array, "B P D"]:
  """[class token, patches] + positions, then the pre-LayerNorm: [B, P + 1, D]."""
  x = siglip.patch_embed(params["patch_embed"], cfg, pixel_values)
  cls = jnp.broadcast_to(params["class_embed"].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
  x = jnp.concatenate([cls, x], axis=1) + params["pos_embed"]
  return layers.layer_norm(params["pre_ln"], x, cfg.layer_norm_eps)


def forward(
  params: Params,
  cfg: ClipConfig,
  pixel_values: Float[Array, "B C Yp Xq"],
  hidden_indices: Sequence[int] = (),
  *,
  implementation: str | None = None,
) -> tuple[Float[Array, "B P D"], tuple[Float[Array, "B P D"], ...]]:
  """(last hidden state, not normed, as transformers returns it; the hidden states at `hidden_indices`)."""
  return layers.scan_hidden_states(
    lambda lp, h: siglip.encoder_layer(lp, cfg, h, implementation),
    params["layers"],
    embed(params, cfg, pixel_values),
    cfg.num_layers,
    hidden_indices,
  )
