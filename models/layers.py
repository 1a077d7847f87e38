"""Small layers shared by the model families, as pure functions over param dicts.

Axes: B batch, T tokens, D input width, E output width.

A dense layer is {"w": [D, E], "b": [E] (optional)}; a LayerNorm is
{"scale": [D], "bias": [D]}; an RMSNorm is its scale vector alone. Norms
compute in float32 and return the input dtype, as transformers does.
"""
from __future__ import annotations

import functools
import operator
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

Params = dict


def _quick_gelu(x):
  return x * jax.nn.sigmoid(1.702 * x)


# transformers' ACT2FN names -> jax functions ("gelu" is the exact, erf-based one).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "quick_gelu": _quick_gelu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  if name not in ACTIVATIONS:
    raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def dense(p: Params, x: Float[Array, "... D"]) -> Float[Array, "... E"]:
  y = jnp.einsum("...D,DE->...E", x, p["w"])
  return y + p["b"] if "b" in p else y


def rms_norm(x: Float[Array, "... D"], scale: Float[Array, "D"], eps: float) -> Float[Array, "... D"]:
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale * y.astype(x.dtype)


def add_rms_norm(h: Float[Array, "... D"], delta: Float[Array, "... D"], scale: Float[Array, "D"],
                 eps: float) -> tuple[Float[Array, "... D"], Float[Array, "... D"]]:
  """(h + delta, its RMS norm times scale): a residual add and the norm after it."""
  total = h + delta
  return total, rms_norm(total, scale, eps)


def layer_norm(p: Params, x: Float[Array, "... D"], eps: float) -> Float[Array, "... D"]:
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  y = (x32 - mean) * jax.lax.rsqrt(var + eps)
  return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def normal(key: jax.Array, shape: tuple[int, ...], dtype, std: float = 0.02) -> jax.Array:
  """Random init for tests and `jax.eval_shape`; real weights come from `convert`."""
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def init_tree(key: jax.Array, shapes: dict, dtype) -> Params:
  """A param tree of the given nested {name: shape} dict; norm scales start at one."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda s: isinstance(s, tuple))
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, (path, shape) in zip(keys, leaves):
    name = path[-1].key
    out.append(jnp.ones(shape, dtype) if name == "scale" or name.endswith("norm") else normal(k, shape, dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def scan_hidden_states(
    layer_fn: Callable[[Params, jax.Array], jax.Array],
    stack: Params,
    h: jax.Array,
    num_layers: int,
    hidden_indices: Sequence[int] = (),
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """Runs a stacked encoder (layers along axis 0 of every leaf) from `h`: (last hidden state,
  the hidden states at `hidden_indices` of transformers' `hidden_states` tuple: 0 = the input,
  i = after layer i, negative from the end).

  The layers run as scans between the requested indices, so under jit the layers
  after the last requested one are dead code when the last hidden state is unused.
  """
  n = num_layers + 1
  for i in hidden_indices:
    if not -n <= i < n:
      raise ValueError(f"hidden state index {i} out of range for {num_layers} layers")
  stops = sorted({i % n for i in hidden_indices} | {num_layers})
  states, done = {0: h}, 0
  for stop in stops:
    if stop > done:
      part = jax.tree.map(operator.itemgetter(slice(done, stop)), stack)
      h = jax.lax.scan(lambda h, lp: (layer_fn(lp, h), None), h, part)[0]
      states[stop], done = h, stop
  return h, tuple(states[i % n] for i in hidden_indices)
