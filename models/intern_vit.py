"""InternViT (InternVL's vision tower), as transformers' InternVLVisionModel computes it.

Axes: B images, C channels, Y/X patch rows/columns, p/q pixel row/column in a
patch, P patches (Y*X), D width, N heads, H head dim, F MLP width, L layers.

A pre-norm ViT with a class token (the patch and position embeddings are
SigLIP's and CLIP's, `models.siglip.patch_embed`) whose blocks scale each
residual branch by a learned vector (layer scale):

    h = h + ls1 * attn(norm1(h));   h = h + ls2 * mlp(norm2(h))

norm is a LayerNorm (InternViT-300M, InternVL2-8B's) or an RMSNorm
(InternViT-6B, which also RMS-normalizes q and k over all heads at once).

Params (layers stacked along L; "b" of a norm only for LayerNorm, q/k/v "b"
only with qkv_bias, q_norm / k_norm only with qk_norm):

    patch_embed  {w [C, p, q, D], b [D]}   class_embed [D]   pos_embed [P + 1, D]
    layers       ln1, ln2 {scale, bias [L, D]}   q, k, v {w [L, D, N, H], b [L, N, H]}
                 q_norm, k_norm [L, D]   o {w [L, N, H, D], b [L, D]}   ls1, ls2 [L, D]
                 fc1 {w [L, D, F], b [L, F]}   fc2 {w [L, F, D], b [L, D]}
    post_ln      {scale, bias [D]}     (only without mean pooling; InternVL checkpoints have none)

`forward` returns (last hidden state [B, P + 1, D], the hidden states at the
requested indices of transformers' `hidden_states`: 0 = the embeddings,
i = after layer i, negative from the end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from models import layers, siglip

Params = dict


@dataclasses.dataclass(frozen=True)
class InternViTConfig:
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  image_size: int
  patch_size: int
  num_channels: int = 3
  layer_norm_eps: float = 1e-6
  hidden_act: str = "gelu"
  qkv_bias: bool = True
  qk_norm: bool = False
  qk_norm_eps: float = 1e-6
  rms_norm: bool = False  # norm_type "rms_norm" (InternViT-6B) instead of "layer_norm"
  post_norm: bool = False  # a final LayerNorm (transformers' use_mean_pooling=False)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @classmethod
  def from_hf(cls, d: Mapping[str, Any]) -> InternViTConfig:
    """From transformers' InternVLVisionConfig dict ("internvl_vision")."""
    return cls(
      hidden_size=d["hidden_size"],
      intermediate_size=d["intermediate_size"],
      num_layers=d["num_hidden_layers"],
      num_heads=d["num_attention_heads"],
      image_size=_side(d["image_size"]),
      patch_size=_side(d["patch_size"]),
      num_channels=d["num_channels"],
      layer_norm_eps=float(d["layer_norm_eps"]),
      hidden_act=d["hidden_act"],
      qkv_bias=d["attention_bias"],
      qk_norm=d["use_qk_norm"],
      rms_norm=_rms(d["norm_type"]),
      post_norm=not d["use_mean_pooling"],
    )

  @classmethod
  def from_original(cls, d: Mapping[str, Any]) -> InternViTConfig:
    """From the original InternVL release's vision_config ("intern_vit_6b", InternVisionConfig)."""
    eps = float(d.get("layer_norm_eps", 1e-6))
    return cls(
      hidden_size=d["hidden_size"],
      intermediate_size=d["intermediate_size"],
      num_layers=d["num_hidden_layers"],
      num_heads=d["num_attention_heads"],
      image_size=_side(d["image_size"]),
      patch_size=_side(d["patch_size"]),
      num_channels=d.get("num_channels", 3),
      layer_norm_eps=eps,
      hidden_act=d.get("hidden_act", "gelu"),
      qkv_bias=d.get("qkv_bias", False),
      qk_norm=d.get("qk_normalization", False),
      qk_norm_eps=eps,
      rms_norm=_rms(d.get("norm_type", "rms_norm")),
    )


def _side(size) -> int:
  if isinstance(size, int):
    return size
  if len(set(size)) != 1:
    raise ValueError(f"InternViT with non-square size {size} is not supported")
  return int(size[0])


def _rms(norm_type: str) -> bool:
  if norm_type not in ("layer_norm", "rms_norm"):
    raise ValueError(f"unknown InternViT norm_type {norm_type!r}")
  return norm_type == "rms_norm"


def param_shapes(cfg: InternViTConfig) -> dict:
  l, d, n, h, f = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
  norm = (lambda: {"scale": (l, d)}) if cfg.rms_norm else (lambda: {"scale": (l, d), "bias": (l, d)})
  stack = {
    "ln1": norm(),
    "ln2": norm(),
    "q": {"w": (l, d, n, h)},
    "k": {"w": (l, d, n, h)},
    "v": {"w": (l, d, n, h)},
    "o": {"w": (l, n, h, d), "b": (l, d)},
    "ls1": (l, d),
    "ls2": (l, d),
    "fc1": {"w": (l, d, f), "b": (l, f)},
    "fc2": {"w": (l, f, d), "b": (l, d)},
  }
  if cfg.qkv_bias:
    for name in "qkv":
      stack[name]["b"] = (l, n, h)
  if cfg.qk_norm:
    stack["q_norm"], stack["k_norm"] = (l, d), (l, d)
  shapes = {
    "patch_embed": {"w": (cfg.num_channels, cfg.patch_size, cfg.patch_size, d), "b": (d,)},
    "class_embed": (d,),
    "pos_embed": (cfg.grid**2 + 1, d),
    "layers": stack,
  }
  if cfg.post_norm:
    shapes["post_ln"] = {"scale": (d,), "bias": (d,)}
  return shapes


def init(cfg: InternViTConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  return layers.init_tree(key, param_shapes(cfg), dtype)


def embed(params: Params, cfg: InternViTConfig, pixel_values: Float[Array, "B C Yp Xq"]) -> Float[Array, "B P D"]:
  """[class token, patches] + positions: [B, P + 1, D]."""
  x = siglip.patch_embed(params["patch_embed"], cfg, pixel_values)
  cls = jnp.broadcast_to(params["class_embed"].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
  return jnp.concatenate([cls, x], axis=1) + params["pos_embed"]


def _norm(cfg: InternViTConfig, p, x):
  return (
    layers.rms_norm(x, p["scale"], cfg.layer_norm_eps) if cfg.rms_norm else layers.layer_norm(p, x, cfg.layer_norm_eps)
  )


def _qk_norm(cfg: InternViTConfig, scale, x: Float[Array, "B P N H"]) -> Float[Array, "B P N H"]:
  """RMSNorm over all heads of a token at once (the width before the head split)."""
  b, p, n, h = x.shape
  return layers.rms_norm(x.reshape(b, p, n * h), scale, cfg.qk_norm_eps).reshape(b, p, n, h)


def encoder_layer(lp: Params, cfg: InternViTConfig, h: Float[Array, "B P D"], implementation: str | None = None):
  x = _norm(cfg, lp["ln1"], h)
  q, k, v = (_heads(lp[n], x) for n in "qkv")
  if cfg.qk_norm:
    q, k = _qk_norm(cfg, lp["q_norm"], q), _qk_norm(cfg, lp["k_norm"], k)
  out = jax.nn.dot_product_attention(q, k, v, scale=cfg.head_dim**-0.5, implementation=implementation)
  h = h + lp["ls1"] * (jnp.einsum("BPNH,NHD->BPD", out, lp["o"]["w"]) + lp["o"]["b"])
  x = _norm(cfg, lp["ln2"], h)
  x = layers.dense(lp["fc2"], layers.activation(cfg.hidden_act)(layers.dense(lp["fc1"], x)))
  return h + lp["ls2"] * x


def _heads(p: Params, x: Float[Array, "B P D"]) -> Float[Array, "B P N H"]:
  y = jnp.einsum("BPD,DNH->BPNH", x, p["w"])
  return y + p["b"] if "b" in p else y


def forward(
  params: Params,
  cfg: InternViTConfig,
  pixel_values: Float[Array, "B C Yp Xq"],
  hidden_indices: Sequence[int] = (),
  *,
  implementation: str | None = None,
) -> tuple[Float[Array, "B P D"], tuple[Float[Array, "B P D"], ...]]:
  """(last hidden state, post-normed when the config has a final norm; the hidden states at `hidden_indices`)."""
  h, states = layers.scan_hidden_states(
    lambda lp, h: encoder_layer(lp, cfg, h, implementation),
    params["layers"],
    embed(params, cfg, pixel_values),
    cfg.num_layers,
    hidden_indices,
  )
  if cfg.post_norm:
    h = layers.layer_norm(params["post_ln"], h, cfg.layer_norm_eps)
  return h, states
