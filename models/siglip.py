"""The SigLIP vision tower (no pooling head), as transformers' SiglipVisionModel computes it.

Axes: B images, C channels, Y/X patch rows/columns, p/q pixel row/column in a
patch, P patches (Y*X), D width, N heads, H head dim, F MLP width, L layers.

Params (layers stacked along L):

    patch_embed  {w [C, p, q, D], b [D]}      pos_embed [P, D]
    layers       ln1, ln2 {scale, bias [L, D]}
                 q, k, v {w [L, D, N, H], b [L, N, H]}   o {w [L, N, H, D], b [L, D]}
                 fc1 {w [L, D, F], b [L, F]}   fc2 {w [L, F, D], b [L, D]}
    post_ln      {scale, bias [D]}

`forward` returns (features, intermediates): features = post_ln(last layer),
transformers' `last_hidden_state`; intermediates are the hidden states at the
requested indices of transformers' `hidden_states` tuple (0 = embeddings,
i = after layer i, negative from the end; none of them post-normed).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from models import layers

Params = dict


@dataclasses.dataclass(frozen=True)
class SiglipConfig:
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  image_size: int
  patch_size: int
  num_channels: int = 3
  layer_norm_eps: float = 1e-6
  hidden_act: str = "gelu_pytorch_tanh"

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def grid(self) -> int:
    """Patches along each side of an image."""
    return self.image_size // self.patch_size

  @classmethod
  def from_hf(cls, d: Mapping[str, Any]) -> "SiglipConfig":
    """From a complete SiglipVisionConfig dict (transformers' `to_dict()`)."""
    return cls(
        hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_layers=d["num_hidden_layers"], num_heads=d["num_attention_heads"],
        image_size=d["image_size"], patch_size=d["patch_size"], num_channels=d["num_channels"],
        layer_norm_eps=float(d["layer_norm_eps"]), hidden_act=d["hidden_act"])


def param_shapes(cfg: SiglipConfig) -> dict:
  l, d, n, h, f = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
  norm = lambda *lead: {"scale": (*lead, d), "bias": (*lead, d)}
  return {
      "patch_embed": {"w": (cfg.num_channels, cfg.patch_size, cfg.patch_size, d), "b": (d,)},
      "pos_embed": (cfg.grid ** 2, d),
      "layers": {
          "ln1": norm(l),
          "q": {"w": (l, d, n, h), "b": (l, n, h)},
          "k": {"w": (l, d, n, h), "b": (l, n, h)},
          "v": {"w": (l, d, n, h), "b": (l, n, h)},
          "o": {"w": (l, n, h, d), "b": (l, d)},
          "ln2": norm(l),
          "fc1": {"w": (l, d, f), "b": (l, f)},
          "fc2": {"w": (l, f, d), "b": (l, d)},
      },
      "post_ln": norm(),
  }


def init(cfg: SiglipConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  return layers.init_tree(key, param_shapes(cfg), dtype)


def patch_embed(p: Params, cfg, pixel_values: Float[Array, "B C Yp Xq"]) -> Float[Array, "B P D"]:
  """The non-overlapping patch projection (the stride-p convolution, with its bias if it has one).

  Shared by the ViT towers (SigLIP, CLIP, InternViT); `cfg` needs image_size, patch_size and grid.
  """
  b, c, height, width = pixel_values.shape
  p_ = cfg.patch_size
  if (height, width) != (cfg.image_size, cfg.image_size):
    raise ValueError(f"the vision tower takes {cfg.image_size}x{cfg.image_size} images, got {height}x{width}")
  w = p["w"]
  # A stride-p convolution drops the last image_size mod p pixels (384 px: 27 patches of 14, 6 px left).
  x = pixel_values[:, :, : cfg.grid * p_, : cfg.grid * p_].astype(w.dtype)
  x = x.reshape(b, c, cfg.grid, p_, cfg.grid, p_)
  x = jnp.einsum("BCYpXq,CpqD->BYXD", x, w).reshape(b, cfg.grid ** 2, -1)
  return x + p["b"] if "b" in p else x


def embed(params: Params, cfg: SiglipConfig, pixel_values: Float[Array, "B C Yp Xq"]) -> Float[Array, "B P D"]:
  """Patch projection plus learned positions."""
  return patch_embed(params["patch_embed"], cfg, pixel_values) + params["pos_embed"]


def encoder_layer(lp: Params, cfg: SiglipConfig, h: Float[Array, "B P D"], implementation: str | None = None):
  """A pre-LayerNorm ViT block with biases everywhere (SigLIP's and CLIP's)."""
  x = layers.layer_norm(lp["ln1"], h, cfg.layer_norm_eps)
  q, k, v = (jnp.einsum("BPD,DNH->BPNH", x, lp[n]["w"]) + lp[n]["b"] for n in "qkv")
  out = jax.nn.dot_product_attention(q, k, v, scale=cfg.head_dim ** -0.5, implementation=implementation)
  h = h + jnp.einsum("BPNH,NHD->BPD", out, lp["o"]["w"]) + lp["o"]["b"]
  x = layers.layer_norm(lp["ln2"], h, cfg.layer_norm_eps)
  x = layers.dense(lp["fc2"], layers.activation(cfg.hidden_act)(layers.dense(lp["fc1"], x)))
  return h + x


def forward(
    params: Params,
    cfg: SiglipConfig,
    pixel_values: Float[Array, "B C Yp Xq"],
    hidden_indices: Sequence[int] = (),
    *,
    implementation: str | None = None,
) -> tuple[Float[Array, "B P D"], tuple[Float[Array, "B P D"], ...]]:
  """(post-normed last hidden state, the hidden states at `hidden_indices`)."""
  h, states = layers.scan_hidden_states(
      lambda lp, h: encoder_layer(lp, cfg, h, implementation), params["layers"],
      embed(params, cfg, pixel_values), cfg.num_layers, hidden_indices)
  return layers.layer_norm(params["post_ln"], h, cfg.layer_norm_eps), states
