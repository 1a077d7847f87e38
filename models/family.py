"""What a model family is: a config parser, its params, how inputs become decoder embeddings.

Every family shares two conventions: its config has a `text` field (the
`qwen2.Qwen2Config` of its decoder), and its params tree a "decoder" subtree
(the `qwen2` params). The conversion table of a family lives in
`convert.tables` and its preprocessing (video + prompt -> the inputs that
`embed_inputs` takes) beside `models.preprocess`, both keyed by the same HF
`model_type`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from models import qwen2

Params = dict


class Embedded(NamedTuple):
  """Decoder inputs of a right-padded batch."""
  embeds: Float[Array, "B T D"]
  positions: Int[Array, "*P B T"]  # [B, T], or [3, B, T] with M-RoPE
  attention_mask: Int[Array, "B T"]
  visual_mask: Bool[Array, "B T"]  # where the image / video embeddings went


@dataclasses.dataclass(frozen=True)
class Family:
  model_type: str  # the HF config's model_type
  hf_architecture: str  # the transformers class that reads the same checkpoints
  # The whole config.json dict -> the family's frozen config.
  parse_config: Callable[[Mapping[str, Any]], Any]
  # (config, PRNG key, dtype) -> params; also gives the shapes through `abstract_params`.
  init_params: Callable[[Any, jax.Array, Any], Params]
  # (params, config, inputs as the transformers model's forward takes them) -> Embedded.
  embed_inputs: Callable[[Params, Any, Mapping[str, np.ndarray]], Embedded]

  def abstract_params(self, cfg, dtype=jnp.float32):
    """The param tree as ShapeDtypeStructs; allocates nothing."""
    return jax.eval_shape(lambda key: self.init_params(cfg, key, dtype), jax.random.key(0))

  def logits(self, params: Params, cfg, inputs: Mapping[str, np.ndarray], *,
             implementation: str | None = None) -> Float[Array, "B T V"]:
    """Prefill logits for transformers-style inputs (`wq_jax.logits` builds on this)."""
    e = self.embed_inputs(params, cfg, inputs)
    return prefill(params["decoder"], cfg.text, e.embeds, e.positions, e.attention_mask,
                   implementation=implementation).logits


# The decoder prefill, compiled once per config and shape.
prefill = jax.jit(qwen2.prefill, static_argnames=("cfg", "last_only", "implementation"))


@jax.jit
def scatter_rows(embeds: Float[Array, "B T D"], mask: Bool[Array, "B T"], rows: Float[Array, "M D"]):
  """Writes rows[i] at the i-th True of `mask` in row-major order (torch's masked_scatter)."""
  b, t, d = embeds.shape
  flat = mask.reshape(-1)
  idx = jnp.clip(jnp.cumsum(flat) - 1, 0, rows.shape[0] - 1)
  out = jnp.where(flat[:, None], rows[idx].astype(embeds.dtype), embeds.reshape(-1, d))
  return out.reshape(b, t, d)


def check_count(kind: str, mask: np.ndarray, rows: int) -> None:
  """transformers' error when the placeholder tokens and the visual rows differ in number."""
  if int(mask.sum()) != rows:
    raise ValueError(f"{kind} features and {kind.lower()} tokens do not match, "
                     f"tokens: {int(mask.sum())}, features: {rows}")
