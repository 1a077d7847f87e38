"""The Qwen2-VL and Qwen2.5-VL vision transformers, as pure functions over param dicts.

Axes: T patches (all images and videos of a call, concatenated), D tower width,
N heads, H head dim, F MLP width, E = C·tp·p·p values of one flattened patch,
Q merged tokens (T / merge²), O output (LLM) width, L blocks, W attention
segments (frames or windows), M and U query and key slots of a segment,
I images or videos.

The input is what the HF image processor emits: `pixel_values [T, E]` with
`grid_thw [I, 3]` (frames/tp, rows, cols in patches per image or video), each
patch row laid out (C, tp, p, p) and patches ordered in 2x2 merge groups.

Both towers: the Conv3d patch embedding as one matmul, 2-D rotary over
(row, col), pre-norm blocks, then a merger that concatenates each group of
`spatial_merge_size²` patches and projects it to the LLM width. Attention runs
within one frame (transformers' `cu_seqlens`). Qwen2.5-VL swaps LayerNorm for
RMSNorm and the QuickGELU MLP for SwiGLU, and attends within windows of
`window_size` pixels except in `fullatt_block_indexes`; to do so it permutes
the merge groups window by window before the blocks and undoes that after the
merger, exactly as transformers does.

Variable-length attention (frames, windows) gathers each segment into a row
of a padded `[W, M]` grid, attends with a key-padding mask, and gathers back:
memory grows with T·M, not T².
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from models import layers

Params = dict[str, Any]


class Norm(enum.StrEnum):
  LAYER = "layer"  # Qwen2-VL: LayerNorm with bias
  RMS = "rms"  # Qwen2.5-VL


class Mlp(enum.StrEnum):
  PLAIN = "plain"  # fc1 -> act -> fc2
  GATED = "gated"  # down(act(gate) * up), with biases


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  depth: int
  width: int  # D
  num_heads: int  # N
  mlp_width: int  # F
  out_width: int  # O
  norm: Norm
  mlp: Mlp
  act: str
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  rope_theta: float = 10000.0
  # Qwen2.5-VL only: window side in pixels; None means every block attends per frame.
  window_size: int | None = None
  fullatt_block_indexes: tuple[int, ...] = ()
  eps: float = 1e-6

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size**2

  @property
  def merge_unit(self) -> int:
    return self.spatial_merge_size**2

  @classmethod
  def from_hf(cls, model_type: str, vc: Mapping[str, Any]) -> VisionConfig:
    """From a complete `vision_config` dict (transformers' `to_dict()`, every default filled)."""
    common = dict(
      depth=vc["depth"],
      num_heads=vc["num_heads"],
      act=vc["hidden_act"],
      in_channels=vc["in_channels"],
      patch_size=vc["patch_size"],
      temporal_patch_size=vc["temporal_patch_size"],
      spatial_merge_size=vc["spatial_merge_size"],
      rope_theta=float(vc["rope_parameters"]["rope_theta"]),
    )
    if model_type == "qwen2_vl":
      return cls(
        width=vc["embed_dim"],
        mlp_width=int(vc["embed_dim"] * vc["mlp_ratio"]),
        out_width=vc["hidden_size"],
        norm=Norm.LAYER,
        mlp=Mlp.PLAIN,
        **common,
      )
    if model_type == "qwen2_5_vl":
      return cls(
        width=vc["hidden_size"],
        mlp_width=vc["intermediate_size"],
        out_width=vc["out_hidden_size"],
        norm=Norm.RMS,
        mlp=Mlp.GATED,
        window_size=vc["window_size"],
        fullatt_block_indexes=tuple(vc["fullatt_block_indexes"]),
        **common,
      )
    raise ValueError(f"no Qwen vision tower for model_type {model_type!r}")


# --------------------------------------------------------------------------- params


def param_shapes(cfg: VisionConfig) -> dict:
  """The converted checkpoint's tree as nested {name: shape}; blocks stacked on L."""
  D, N, H, F, L, O = cfg.width, cfg.num_heads, cfg.head_dim, cfg.mlp_width, cfg.depth, cfg.out_width
  Dm = D * cfg.merge_unit

  def norm(*lead):
    if cfg.norm is Norm.LAYER:
      return {"scale": (*lead, D), "bias": (*lead, D)}
    return (*lead, D)

  def dense(d_in, d_out):
    return {"w": (L, d_in, d_out), "b": (L, d_out)}

  if cfg.mlp is Mlp.PLAIN:
    mlp = {"fc1": dense(D, F), "fc2": dense(F, D)}
  else:
    mlp = {"gate": dense(D, F), "up": dense(D, F), "down": dense(F, D)}
  return {
    "patch_embed": {"w": (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size, D)},
    "blocks": {
      "norm1": norm(L),
      "attn": {"qkv": {"w": (L, D, 3, N, H), "b": (L, 3, N, H)}, "out": {"w": (L, N, H, D), "b": (L, D)}},
      "norm2": norm(L),
      "mlp": mlp,
    },
    "merger": {"norm": norm(), "fc1": {"w": (Dm, Dm), "b": (Dm,)}, "fc2": {"w": (Dm, O), "b": (O,)}},
  }


def init_params(cfg: VisionConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  """Random params (tests, `jax.eval_shape`); real weights come from `convert`."""
  return layers.init_tree(key, param_shapes(cfg), dtype)


# --------------------------------------------------------------------------- layout (host side)


class Segments(NamedTuple):
  """Variable-length segments of the token sequence as a padded gather grid."""

  index: Int[Array, "W M"]  # token of each slot (0 where padded)
  valid: Bool[Array, "W M"]  # slot holds a token
  seg: Int[Array, " T"]  # segment of each token
  slot: Int[Array, " T"]  # slot of each token within its segment


class Layout(NamedTuple):
  """Everything that depends on `grid_thw` only, computed once in numpy."""

  order: Int[Array, " T"]  # working order: token t of the blocks is input patch order[t]
  pos: Int[Array, "T 2"]  # (row, col) rotary positions in working order
  frames: Segments  # one segment per frame (transformers' cu_seqlens)
  windows: Segments | None  # Qwen2.5-VL windows (cu_window_seqlens)
  unmerge: Int[Array, " Q"]  # merged tokens back from working to input order


def segments(cu_seqlens: Sequence[int]) -> Segments:
  """Padded gather grid for the contiguous segments between `cu_seqlens` bounds (empty ones dropped)."""
  cu = np.asarray(cu_seqlens, dtype=np.int64)
  lens = np.diff(cu)
  starts, lens = cu[:-1][lens > 0], lens[lens > 0]
  width = int(lens.max())
  slots = np.arange(width)
  valid = slots[None, :] < lens[:, None]
  index = np.where(valid, starts[:, None] + slots[None, :], 0)
  seg = np.repeat(np.arange(len(lens)), lens)
  slot = np.arange(int(lens.sum())) - np.repeat(starts, lens)
  return Segments(index.astype(np.int32), valid, seg.astype(np.int32), slot.astype(np.int32))


def rotary_positions(grid_thw: np.ndarray, merge: int) -> np.ndarray:
  """(row, col) of every patch in the processor's merge-group order, `[T, 2]`."""
  out = []
  for t, h, w in np.asarray(grid_thw).tolist():
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blocks = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(blocks).transpose(0, 2, 1, 3).reshape(-1)
    out.append(np.tile(np.stack([rows, cols], -1), (t, 1)))
  return np.concatenate(out)


def window_index(grid_thw: np.ndarray, cfg: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
  """transformers' `get_vision_window_index`: merge-group permutation and window bounds."""
  m = cfg.spatial_merge_size
  ws = cfg.window_size // m // cfg.patch_size  # window side in merged tokens
  index_out, cu = [], [0]
  offset = 0
  for t, h, w in np.asarray(grid_thw).tolist():
    gh, gw = h // m, w // m
    index = np.arange(t * gh * gw).reshape(t, gh, gw)
    # transformers pads by a whole window when the side is already a multiple.
    pad_h, pad_w = ws - gh % ws, ws - gw % ws
    nh, nw = (gh + pad_h) // ws, (gw + pad_w) // ws
    padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
    padded = padded.reshape(t, nh, ws, nw, ws).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, ws, ws)
    seqlens = (padded != -100).sum((2, 3)).reshape(-1)
    flat = padded.reshape(-1)
    index_out.append(flat[flat != -100] + offset)
    cu.extend((np.cumsum(seqlens) * cfg.merge_unit + cu[-1]).tolist())
    offset += t * gh * gw
  cu = np.asarray(cu)
  cu = cu[np.concatenate([[True], cu[1:] != cu[:-1]])]  # torch.unique_consecutive
  return np.concatenate(index_out), cu


def layout(cfg: VisionConfig, grid_thw) -> Layout:
  grid_thw = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
  pos = rotary_positions(grid_thw, cfg.spatial_merge_size)
  num = len(pos)
  frame_bounds = np.concatenate([[0], np.cumsum(np.repeat(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]))])
  if cfg.window_size is None:
    groups = np.arange(num // cfg.merge_unit)
    windows = None
  else:
    groups, cu_windows = window_index(grid_thw, cfg)
    windows = segments(cu_windows)
  order = (groups[:, None] * cfg.merge_unit + np.arange(cfg.merge_unit)).reshape(-1)
  return Layout(
    order=order.astype(np.int32),
    pos=pos[order].astype(np.int32),
    frames=segments(frame_bounds),
    windows=windows,
    unmerge=np.argsort(groups).astype(np.int32),
  )


# --------------------------------------------------------------------------- modules


def norm(p: Params | Array, x: Float[Array, "... D"], cfg: VisionConfig) -> Float[Array, "... D"]:
  if cfg.norm is Norm.LAYER:
    return layers.layer_norm(p, x, cfg.eps)
  return layers.rms_norm(x, p, cfg.eps)


def rotary(cfg: VisionConfig, pos: Int[Array, "T 2"]) -> tuple[Float[Array, "T H"], Float[Array, "T H"]]:
  """cos/sin of the 2-D rotary: H/4 frequencies for rows, H/4 for cols, the halves repeated."""
  quarter = cfg.head_dim // 2
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, quarter, 2, dtype=jnp.float32) / quarter))
  freqs = pos.astype(jnp.float32)[..., None] * inv_freq  # [T, 2, H/4]
  freqs = freqs.reshape(pos.shape[0], -1)  # [T, H/2]: rows then cols
  angles = jnp.concatenate([freqs, freqs], -1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: Float[Array, "T N H"], cos: Float[Array, "T H"], sin: Float[Array, "T H"]) -> Float[Array, "T N H"]:
  xf = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], -1)
  return (xf * cos[:, None] + rotated * sin[:, None]).astype(x.dtype)


def segment_attention(
  q: Float[Array, "T N H"], k: Float[Array, "T N H"], v: Float[Array, "T N H"], segs: Segments
) -> Float[Array, "T N H"]:
  """Bidirectional attention within each segment (transformers' per-cu_seqlens split)."""
  qs, ks, vs = q[segs.index], k[segs.index], v[segs.index]  # [W, M, N, H]
  scores = jnp.einsum("WMNH,WUNH->WNMU", qs, ks).astype(jnp.float32) * q.shape[-1] ** -0.5
  scores = jnp.where(segs.valid[:, None, None, :], scores, -jnp.inf)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("WNMU,WUNH->WMNH", probs, vs)
  return out[segs.seg, segs.slot]


def attention(
  p: Params, x: Float[Array, "T D"], cos: Float[Array, "T H"], sin: Float[Array, "T H"], segs: Segments
) -> Float[Array, "T D"]:
  qkv = jnp.einsum("TD,DCNH->CTNH", x, p["qkv"]["w"]) + p["qkv"]["b"][:, None]
  q, k = apply_rotary(qkv[0], cos, sin), apply_rotary(qkv[1], cos, sin)
  out = segment_attention(q, k, qkv[2], segs)
  return jnp.einsum("TNH,NHD->TD", out, p["out"]["w"]) + p["out"]["b"]


def mlp(p: Params, x: Float[Array, "T D"], cfg: VisionConfig) -> Float[Array, "T D"]:
  act = layers.activation(cfg.act)
  if cfg.mlp is Mlp.PLAIN:
    return layers.dense(p["fc2"], act(layers.dense(p["fc1"], x)))
  return layers.dense(p["down"], act(layers.dense(p["gate"], x)) * layers.dense(p["up"], x))


def block(p: Params, x: Float[Array, "T D"], cos, sin, segs: Segments, cfg: VisionConfig) -> Float[Array, "T D"]:
  x = x + attention(p["attn"], norm(p["norm1"], x, cfg), cos, sin, segs)
  return x + mlp(p["mlp"], norm(p["norm2"], x, cfg), cfg)


def merger(p: Params, x: Float[Array, "T D"], cfg: VisionConfig) -> Float[Array, "Q O"]:
  """Concatenate each merge group of patches and project to the LLM width."""
  x = norm(p["norm"], x, cfg).reshape(-1, cfg.width * cfg.merge_unit)
  return layers.dense(p["fc2"], jax.nn.gelu(layers.dense(p["fc1"], x), approximate=False))


def forward(
  params: Params, cfg: VisionConfig, pixel_values: Float[Array, "T E"], lay: Layout
) -> tuple[Float[Array, "Q O"], dict[str, Array]]:
  """Visual tokens in input order, `[Q, O]`, plus intermediates for bisecting.

  intermediates: `patch_embed [T, D]` (input order), `blocks [L, T, D]` (each
  block's output in working order, as transformers' hidden_states), `merged`
  (merger output in working order).
  """
  w = params["patch_embed"]["w"]  # the Conv3d kernel [C, tp, p, p, D]; stride = kernel
  x = pixel_values.astype(w.dtype) @ w.reshape(-1, cfg.width)
  embedded = x
  x = x[lay.order]
  cos, sin = rotary(cfg, lay.pos)
  full = jnp.asarray([i in cfg.fullatt_block_indexes for i in range(cfg.depth)])

  def step(x, layer):
    p, is_full = layer
    if lay.windows is None:
      x = block(p, x, cos, sin, lay.frames, cfg)
    else:
      x = jax.lax.cond(
        is_full,
        lambda x: block(p, x, cos, sin, lay.frames, cfg),
        lambda x: block(p, x, cos, sin, lay.windows, cfg),
        x,
      )
    return x, x

  x, per_block = jax.lax.scan(step, x, (params["blocks"], full))
  merged = merger(params["merger"], x, cfg)
  features = merged[lay.unmerge]
  return features, {"patch_embed": embedded, "blocks": per_block, "merged": merged}
