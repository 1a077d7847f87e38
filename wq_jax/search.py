"""Window-level quantization search (SPEC §2): scores, thresholds, the bit plan.

Axes: B batch, N text tokens, M visual tokens, D model width, W windows, L layers.
Every function here is jit-able; the whole search is O((N + M) * D).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

HIGH, INT4, INT2 = 16, 4, 2
_EPS = 1e-12


def _unit_rows(x: jax.Array) -> jax.Array:
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), _EPS)


def _mean_text_direction(text_emb, text_mask):
  """t_bar = mean_j t_j / |t_j| over the valid text tokens: [B, D]."""
  t = _unit_rows(text_emb)
  if text_mask is None:
    return t.mean(axis=1)
  m = text_mask.astype(jnp.float32)[..., None]
  return (t * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)


def window_scores(
    text_emb: Float[Array, "B N D"],
    visual_emb: Float[Array, "B M D"],
    window_size: int,
    text_mask: Bool[Array, "B N"] | None = None,
) -> Float[Array, "B W"]:
  """Eq. 8: mean cosine similarity of every (text token, window token) pair.

  It equals t_bar . w_bar_i with t_bar = mean_j t_j/|t_j| and w_bar_i the mean
  of the window's unit rows, so it is one mat-vec: (t_bar . v_k) / |v_k| per
  visual token, averaged over each window. The tail of M mod S tokens forms no
  window and gets no score.
  """
  b, m, _ = visual_emb.shape
  w = m // window_size
  cos = token_scores(text_emb, visual_emb[:, : w * window_size], text_mask)  # [B, W*S]
  return cos.reshape(b, w, window_size).mean(axis=-1)


def token_scores(
    text_emb: Float[Array, "B N D"],
    visual_emb: Float[Array, "B M D"],
    text_mask: Bool[Array, "B N"] | None = None,
) -> Float[Array, "B M"]:
  """Per-token similarity (the token-level search WindowQuant is compared with).

  The visual rows are never normalized in memory: one dot with t_bar and one
  norm per row, accumulated in float32.
  """
  t_bar = _mean_text_direction(text_emb, text_mask).astype(visual_emb.dtype)
  dots = jnp.einsum("BD,BMD->BM", t_bar, visual_emb, preferred_element_type=jnp.float32)
  norms = jnp.sqrt(jnp.einsum("BMD,BMD->BM", visual_emb, visual_emb, preferred_element_type=jnp.float32))
  return dots / jnp.maximum(norms, _EPS)


def layer_sensitivity(
    h_in: Float[Array, "B T D"],
    h_out: Float[Array, "B T D"],
    mask: Bool[Array, "B T"] | None = None,
) -> Float[Array, "B"]:
  """Eq. 9: cos(h_i, h_i') per token, averaged over (valid) tokens, clipped to [0, 1]."""
  cos = jnp.sum(_unit_rows(h_in) * _unit_rows(h_out), axis=-1)  # [B, T]
  if mask is None:
    s = cos.mean(axis=-1)
  else:
    m = mask.astype(jnp.float32)
    s = (cos * m).sum(axis=-1) / jnp.maximum(m.sum(axis=-1), 1.0)
  return jnp.clip(s, 0.0, 1.0)


def thresholds(sensitivity: Float[Array, "L"], alpha: float) -> tuple[Float[Array, "L"], Float[Array, "L"]]:
  """Eqs. 10-11: T_low = (e^{a s} - 1)/(e^a - 1), T_high = (e^{-a s} - 1)/(e^{-a} - 1)."""
  s = jnp.clip(jnp.asarray(sensitivity, jnp.float32), 0.0, 1.0)
  if alpha == 0:  # both curves tend to the identity as alpha -> 0
    return s, s
  t_low = jnp.expm1(alpha * s) / jnp.expm1(alpha)
  t_high = jnp.expm1(-alpha * s) / jnp.expm1(-alpha)
  return t_low, t_high


def bits_per_request(
    scores: Float[Array, "B W"], t_low: Float[Array, "L"], t_high: Float[Array, "L"]
) -> Int[Array, "B L W"]:
  """Each request's own choice: above T_high -> 16, below T_low -> 2, else 4."""
  s = scores[:, None, :]
  lo, hi = t_low[None, :, None], t_high[None, :, None]
  return jnp.where(s > hi, HIGH, jnp.where(s < lo, INT2, INT4)).astype(jnp.int32)


def majority_vote(choices: Int[Array, "B L W"]) -> Int[Array, "L W"]:
  """The most frequent bit width across the batch; ties go to the higher precision."""
  counts = [jnp.sum(choices == b, axis=0) for b in (HIGH, INT4, INT2)]
  # argmax returns the first maximum, and the candidates are listed high to low.
  winner = jnp.argmax(jnp.stack(counts), axis=0)
  return jnp.array([HIGH, INT4, INT2], jnp.int32)[winner]


def plan_bits(
    scores: Float[Array, "B W"],
    t_low: Float[Array, "L"],
    t_high: Float[Array, "L"],
    fix_first_window: bool = True,
) -> Int[Array, "L W"]:
  """One bit plan for the whole batch, int32[L, W] with values in {16, 4, 2}."""
  plan = majority_vote(bits_per_request(jnp.asarray(scores), jnp.asarray(t_low), jnp.asarray(t_high)))
  if fix_first_window and plan.shape[1] > 0:
    plan = plan.at[:, 0].set(HIGH)
  return plan


def random_plan(
    plan: Int[Array, "L W"], key: jax.Array, fix_first_window: bool = True
) -> Int[Array, "L W"]:
  """Ablation B: the same count of each bit width per layer, at random windows.

  With the first window fixed it stays at 16 bits and the rest are shuffled.
  """
  start = 1 if fix_first_window else 0
  keys = jax.random.split(key, plan.shape[0])
  shuffled = jax.vmap(lambda k, row: jax.random.permutation(k, row[start:]))(keys, plan)
  return plan.at[:, start:].set(shuffled)


def plan_token_bits(
    scores: Float[Array, "B M"],
    t_low: Float[Array, "L"],
    t_high: Float[Array, "L"],
) -> Int[Array, "L M"]:
  """Token-level mixed precision with the same thresholds: a bit width per token."""
  return majority_vote(bits_per_request(scores, t_low, t_high))
