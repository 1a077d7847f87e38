"""The shared decoder (GQA, RoPE or M-RoPE, RMSNorm, SwiGLU) as pure functions over a param pytree.

Qwen2, Llama (Vicuna), Mistral and InternLM2 are one architecture that differs
in config only: which projections carry biases (Qwen2: q, k, v; Llama with
`attention_bias` and InternLM2 with `bias`: q, k, v and o; Mistral and the
released Llama / InternLM2 checkpoints: none), the RoPE base, the RMSNorm eps
and Mistral's sliding window. `Qwen2Config.from_hf` reads any of their text
configs; the module keeps its first family's name because every caller uses it.

Axes: B batch, T tokens, S key length, N query heads, K KV heads, H head dim,
D model width, F MLP width, V vocabulary, L layers.

Params (layers stacked along a leading L axis, run with `jax.lax.scan`):

    embed      [V, D]
    layers     attn_norm [L, D]
               q {w [L, D, N, H], b [L, N, H]}   k, v {w [L, D, K, H], b [L, K, H]}
               o {w [L, N, H, D], b [L, D]}      (each "b" only where the config has that bias)
               mlp_norm [L, D]   gate, up {w [L, D, F]}   down {w [L, F, D]}
    norm       [D]
    lm_head    [D, V]   (absent when the embeddings are tied)

Batches are padded on the right: `attention_mask[b]` is a prefix of ones.
Positions are [B, T] for plain RoPE and [3, B, T] (temporal, height, width)
for M-RoPE, which Qwen2-VL applies by taking frequency j's angle from the
position row its `mrope_section` chunk names (chunk i uses row i mod 3).

Mistral's sliding window (a query sees its last `sliding_window` keys) is
applied exactly in the prefill. Decode attends to the whole cache, which is
the same thing only while a request stays within the window: LLaVA-v1.6-mistral
(Mistral-7B-Instruct-v0.2) has no window, and `models.inputs` refuses prompts
longer than a configured one.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from models import layers
from wq_jax import attention, search

if TYPE_CHECKING:
  from wq_jax.cache import KVCache

Params = dict


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  rope_theta: float
  rms_norm_eps: float
  tie_word_embeddings: bool
  mrope_section: tuple[int, ...] | None = None
  hidden_act: str = "silu"
  qkv_bias: bool = True  # Qwen2's q, k, v biases
  o_bias: bool = False
  sliding_window: int | None = None  # Mistral: keys a query sees, itself included

  @property
  def groups(self) -> int:
    return self.num_heads // self.num_kv_heads

  @classmethod
  def from_hf(cls, text: Mapping[str, Any], tie_word_embeddings: bool | None = None) -> "Qwen2Config":
    """Parses a Qwen2, Llama, Mistral or InternLM2 text config as transformers writes it
    (v5 `rope_parameters` or v4 `rope_theta` / `rope_scaling`)."""
    model_type = text.get("model_type", "qwen2")
    if model_type.startswith("qwen2"):
      if text.get("use_sliding_window"):
        raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
      qkv_bias, o_bias, window = True, False, None
    elif model_type == "llama":
      if text.get("mlp_bias"):
        raise ValueError("Llama with mlp_bias=true is not supported")
      qkv_bias = o_bias = bool(text.get("attention_bias", False))
      window = None
    elif model_type == "mistral":
      qkv_bias = o_bias = False
      window = text.get("sliding_window")
      # A window as long as the context never binds.
      if window is not None and window >= text.get("max_position_embeddings", float("inf")):
        window = None
    elif model_type == "internlm2":
      qkv_bias = o_bias = bool(text.get("bias", False))
      window = None
    else:
      raise ValueError(f"unsupported decoder model_type {model_type!r}; supported: qwen2, llama, mistral, internlm2")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    # Dynamic NTK scaling (InternLM2.5) only rescales beyond max_position_embeddings (32k for
    # InternVL2-8B); positions up to there are plain RoPE, which is what this decoder computes.
    if rope_type not in ("default", "mrope", "dynamic"):
      raise ValueError(f"unsupported rope type {rope_type!r}; supported: 'default', 'dynamic' and M-RoPE")
    heads = text["num_attention_heads"]
    section = rope.get("mrope_section")
    tie = text.get("tie_word_embeddings", False)
    return cls(
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        num_layers=text["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads,
        intermediate_size=text["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(tie if tie_word_embeddings is None else tie_word_embeddings),
        mrope_section=tuple(section) if section else None,
        hidden_act=text.get("hidden_act", "silu"),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        sliding_window=None if window is None else int(window),
    )


def param_shapes(cfg: Qwen2Config) -> dict:
  l, d, n, k, h, f, v = (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.vocab_size)
  # q, k and v are one [L, D, K, G+2, H] projection: per KV head its G query heads (query head k*G+g),
  # its key, its value. One matrix product instead of three (at batch 1 XLA turned K's and V's into a
  # multiply and two reduces each), and tensor parallelism still splits it over K. gate and up are
  # one [L, D, 2, F] product, split over F.
  # o is [L, N*H, D], its heads merged: a layer's slice is then a matrix whose contraction axis XLA's
  # split-K matmul can split in place. As [L, N, H, D] (checkpoint format 1) XLA copied each layer's
  # 25.7 MB slice before the product, every decode step (7B, H200: 0.35 ms a step; the optimized HLO of
  # benchmarks/results/decode_profile_*_dump_s18_gpu.md showed a `wrapped_slice` feeding the gemm).
  g = n // k
  attn = {"qkv": {"w": (l, d, k, g + 2, h)}, "o": {"w": (l, n * h, d)}}
  if cfg.qkv_bias:
    attn["qkv"]["b"] = (l, k, g + 2, h)
  if cfg.o_bias:
    attn["o"]["b"] = (l, d)
  shapes = {
      "embed": (v, d),
      "layers": {
          "attn_norm": (l, d),
          **attn,
          "mlp_norm": (l, d),
          "gate_up": {"w": (l, d, 2, f)},
          "down": {"w": (l, f, d)},
      },
      "norm": (d,),
  }
  if not cfg.tie_word_embeddings:
    shapes["lm_head"] = (d, v)
  return shapes


def init(cfg: Qwen2Config, key: jax.Array, dtype=jnp.float32) -> Params:
  return layers.init_tree(key, param_shapes(cfg), dtype)


class PrefillOutput(NamedTuple):
  logits: Float[Array, "B T V"] | Float[Array, "B V"]  # [B, V] at the last valid token if last_only
  keys: Float[Array, "L B K T H"]  # post-RoPE, head-major
  values: Float[Array, "L B K T H"]
  sensitivity: Float[Array, "L B"]  # SPEC Eq. 9, over the valid tokens
  hidden: Float[Array, "B T D"]  # after the final norm


# ----------------------------------------------------------------------------- pieces


def embed(params: Params, tokens: Int[Array, "*B"]) -> Float[Array, "*B D"]:
  return jnp.take(params["embed"], tokens, axis=0)


def final_norm(params: Params, cfg: Qwen2Config, h: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
  return layers.rms_norm(h, params["norm"], cfg.rms_norm_eps)


def lm_head(params: Params, cfg: Qwen2Config, h: Float[Array, "*B D"]) -> Float[Array, "*B V"]:
  """Logits in float32 from normed hidden states (the tied head is the embedding table)."""
  if cfg.tie_word_embeddings:
    return jnp.einsum("...D,VD->...V", h, params["embed"], preferred_element_type=jnp.float32)
  return jnp.einsum("...D,DV->...V", h, params["lm_head"], preferred_element_type=jnp.float32)


def text_positions(attention_mask: Int[Array, "B T"]) -> Int[Array, "B T"]:
  """Plain RoPE positions of a right-padded batch: 0..T-1 on every row, as transformers uses."""
  b, t = attention_mask.shape
  return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


def _inv_freq(cfg: Qwen2Config) -> np.ndarray:
  h = cfg.head_dim
  return (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, h, 2, dtype=np.float32) / np.float32(h)))).astype(
      np.float32)


def rope(cfg: Qwen2Config, positions: Int[Array, "*P B T"]) -> tuple[Float[Array, "B T H"], Float[Array, "B T H"]]:
  """cos and sin [B, T, H] in float32 for positions [B, T] (or [3, B, T] with M-RoPE)."""
  inv = jnp.asarray(_inv_freq(cfg))
  pos = positions.astype(jnp.float32)
  if cfg.mrope_section is not None:
    if pos.ndim == 2:  # text-only input: the three rows are equal
      pos = jnp.broadcast_to(pos, (3, *pos.shape))
    row = np.repeat(np.arange(len(cfg.mrope_section)) % 3, cfg.mrope_section)  # [H/2]
    freqs = jnp.moveaxis(pos[row], 0, -1) * inv  # [B, T, H/2]
  else:
    freqs = pos[..., None] * inv
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: Float[Array, "B T N H"], cos: Float[Array, "B T H"], sin: Float[Array, "B T H"]):
  cos, sin = cos[:, :, None].astype(x.dtype), sin[:, :, None].astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def project_qkv(lp: Params, cfg: Qwen2Config, x: Float[Array, "B T D"], cos, sin):
  """q [B, T, N, H], k and v [B, T, K, H], q and k rotated: one product with the fused [D, K, G+2, H] weight."""
  p = lp["qkv"]
  y = jnp.einsum("BTD,DKJH->BTKJH", x, p["w"])
  y = y + p["b"] if "b" in p else y
  b, t, kv, j, h = y.shape
  g = j - 2
  # A KV head's queries and key are adjacent: rotate them in one pass (one fusion, not one each).
  qk = apply_rope(y[:, :, :, :g + 1].reshape(b, t, kv * (g + 1), h), cos, sin).reshape(b, t, kv, g + 1, h)
  return qk[:, :, :, :g].reshape(b, t, kv * g, h), qk[:, :, :, g], y[:, :, :, g + 1]  # query head k*G + g


def out_proj(lp: Params, out: Float[Array, "*B N H"]) -> Float[Array, "*B D"]:
  """The attention output projection; its weight is [N*H, D] (`param_shapes`)."""
  w = lp["o"]["w"]
  y = jnp.einsum("...E,ED->...D", out.reshape(*out.shape[:-2], w.shape[0]), w)
  return y + lp["o"]["b"] if "b" in lp["o"] else y


def mlp(lp: Params, cfg: Qwen2Config, x: Float[Array, "... D"]) -> Float[Array, "... D"]:
  """The MLP of a normalized x (what it adds to the residual stream)."""
  act = layers.activation(cfg.hidden_act)
  gate_up = jnp.einsum("...D,DJF->...JF", x, lp["gate_up"]["w"])  # J: gate, up
  y = act(gate_up[..., 0, :]) * gate_up[..., 1, :]
  return jnp.einsum("...F,FD->...D", y, lp["down"]["w"])


def mlp_block(lp: Params, cfg: Qwen2Config, h: Float[Array, "... D"]) -> Float[Array, "... D"]:
  return h + mlp(lp, cfg, layers.rms_norm(h, lp["mlp_norm"], cfg.rms_norm_eps))


def layer(
    lp: Params,
    cfg: Qwen2Config,
    h: Float[Array, "B T D"],
    cos: Float[Array, "B T H"],
    sin: Float[Array, "B T H"],
    attention_mask: Int[Array, "B T"],
    implementation: str | None = None,
):
  """One decoder layer over a right-padded prefill: (h_out, k [B,K,T,H], v [B,K,T,H], sensitivity [B])."""
  x = layers.rms_norm(h, lp["attn_norm"], cfg.rms_norm_eps)
  q, k, v = project_qkv(lp, cfg, x, cos, sin)
  lengths = attention_mask.sum(axis=-1).astype(jnp.int32)
  window = None if cfg.sliding_window is None else (cfg.sliding_window - 1, 0)
  out = jax.nn.dot_product_attention(
      q, k, v, scale=cfg.head_dim ** -0.5, is_causal=True, key_value_seq_lengths=lengths,
      local_window_size=window, implementation=implementation)
  h_attn = h + out_proj(lp, out)
  sensitivity = search.layer_sensitivity(h, h_attn, attention_mask.astype(bool))
  return mlp_block(lp, cfg, h_attn), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), sensitivity


# ----------------------------------------------------------------------------- prefill and decode


def prefill(
    params: Params,
    cfg: Qwen2Config,
    embeds: Float[Array, "B T D"],
    positions: Int[Array, "*P B T"],
    attention_mask: Int[Array, "B T"] | Bool[Array, "B T"],
    *,
    last_only: bool = False,
    implementation: str | None = None,
) -> PrefillOutput:
  """The full-precision prefill: logits, post-RoPE K/V and each layer's sensitivity.

  `implementation` goes to `jax.nn.dot_product_attention` (None or "xla", or
  "cudnn" on GPU). With `last_only`, logits are [B, V] at each row's last
  valid token, which avoids the [B, T, V] array on long prompts.
  """
  mask = attention_mask.astype(jnp.int32)
  cos, sin = rope(cfg, positions)

  def body(h, lp):
    h, k, v, s = layer(lp, cfg, h, cos, sin, mask, implementation)
    return h, (k, v, s)

  h, (keys, values, sensitivity) = jax.lax.scan(body, embeds, params["layers"])
  hidden = final_norm(params, cfg, h)
  if last_only:
    last = jnp.maximum(mask.sum(axis=-1) - 1, 0)
    logits = lm_head(params, cfg, hidden[jnp.arange(hidden.shape[0]), last])
  else:
    logits = lm_head(params, cfg, hidden)
  return PrefillOutput(logits, keys, values, sensitivity, hidden)


def decode_step(
    params: Params,
    cfg: Qwen2Config,
    tokens: Int[Array, "B"],
    positions: Int[Array, "*P B"],
    cache: KVCache,
    *,
    implementation: str = "xla",
    norms: str = "xla",
) -> tuple[Float[Array, "B V"], KVCache]:
  """One generated token a request: appends its K/V to every layer and returns float32 logits.

  positions are [B] (or [3, B] with M-RoPE); `implementation` names a
  `wq_jax.attention` decode implementation. `norms="pallas"`: each residual
  add and the RMS norm after it in one Pallas launch
  (`pallas_kernels.residual_norm`), the same values as XLA's ("xla").
  """
  if norms == "pallas":
    from pallas_kernels import residual_norm
    add_norm = functools.partial(residual_norm.add_rms_norm, interpret=jax.default_backend() == "cpu")
  elif norms == "xla":
    add_norm = layers.add_rms_norm
  else:
    raise ValueError(f"norms is 'xla' or 'pallas', got {norms!r}")
  cos, sin = rope(cfg, positions[..., None])  # [B, 1, H]

  # A layer carries its MLP's output to the next one, which adds it to the residual stream as it normalizes
  # (the last layer's by the final norm): each add and the norm after it are one `add_norm`.
  def body(carry, xs):
    h, delta, cache = carry
    lp, l = xs
    lc = cache.layer(l, stacked=True)
    h, x = add_norm(h, delta, lp["attn_norm"], cfg.rms_norm_eps)
    q, k, v = project_qkv(lp, cfg, x[:, None], cos, sin)
    lc = lc.append(k[:, 0], v[:, 0])
    out = attention.decode_attention(q[:, 0], lc, scale=cfg.head_dim ** -0.5, implementation=implementation)
    h, x = add_norm(h, out_proj(lp, out), lp["mlp_norm"], cfg.rms_norm_eps)
    return (h, mlp(lp, cfg, x), cache.replace_layer(l, lc)), None

  h = embed(params, tokens)
  # Unrolled: in a rolled loop XLA copies each layer's slice of the stacked weights before its
  # matrix-vector products, tripling the bytes a step reads (benchmarks/results/layer_loop_*).
  # (Unrolled, the first layer's add of zeros folds away, and XLA sees the same dataflow as add-then-norm.)
  carry = (h, jnp.zeros_like(h), cache)
  (h, delta, cache), _ = jax.lax.scan(body, carry, (params["layers"], jnp.arange(cfg.num_layers)), unroll=True)
  return lm_head(params, cfg, add_norm(h, delta, params["norm"], cfg.rms_norm_eps)[1]), cache.advance()
