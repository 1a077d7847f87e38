"""Data and tensor parallelism over a `jax.sharding.Mesh`.

A mesh has a 'data' axis (requests split across it) and optionally a 'model'
axis (Megatron-style tensor parallelism: the decoder's attention heads and MLP
columns split across it, and with them every segment of the KV cache, which is
head-major). Placing the weights (`shard_model`) and the inputs is all it
takes: every step of `generate` is a `jit`, so XLA's sharding propagation runs
the vision tower, the prefill, the cache build and the decode loop on each
device's share. The batch's one plan is still the vote of all its requests
(the plan is computed on the host). For several hosts, call
`jax.distributed.initialize()` first on each (see the README) and build the
mesh over `jax.devices()`.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA, MODEL = "data", "model"
# Transformers-style inputs whose first axis is the request.
BATCH_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values_videos", "pixel_values",
              "image_sizes", "second_per_grid_ts")


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A one-axis mesh over `devices` (all local devices by default)."""
  devices = jax.local_devices() if devices is None else list(devices)
  return Mesh(np.array(devices), (DATA,))


def mesh_2d(data: int, model: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, model) mesh: `data` groups of `model` devices (a group's devices should share NVLink)."""
  devices = jax.devices() if devices is None else list(devices)
  if data * model != len(devices):
    raise ValueError(f"a {data} x {model} mesh needs {data * model} devices, there are {len(devices)}")
  return Mesh(np.array(devices).reshape(data, model), (DATA, MODEL))


def data_size(mesh: Mesh | None) -> int:
  return 1 if mesh is None else dict(mesh.shape).get(DATA, 1)


def replicate(tree, mesh: Mesh):
  """Copies a pytree (the weights) to every device of the mesh."""
  return jax.device_put(tree, NamedSharding(mesh, P()))


# How each decoder weight splits over 'model' (leading L axis of stacked layers first).
_TENSOR_PARALLEL = {
    ("qkv", "w"): P(None, None, MODEL, None, None), ("qkv", "b"): P(None, MODEL, None, None),  # over K
    ("o", "w"): P(None, MODEL, None),  # [L, N*H, D]: heads are the major part of N*H
    ("gate_up", "w"): P(None, None, None, MODEL), ("down", "w"): P(None, MODEL, None),
}


def weight_specs(params: dict, mesh: Mesh) -> dict:
  """PartitionSpecs for a family's params: decoder layers split by `_TENSOR_PARALLEL` when the mesh
  has a 'model' axis; everything else (embeddings, norms, the vision tower) replicated."""
  split = MODEL in mesh.axis_names

  def spec(path, leaf):
    keys = tuple(getattr(k, "key", None) for k in path)
    if split and len(keys) >= 4 and keys[0] == "decoder" and keys[1] == "layers":
      return _TENSOR_PARALLEL.get(keys[-2:], P())
    return P()

  return jax.tree_util.tree_map_with_path(spec, params)


def shard_model(model, mesh: Mesh):
  """The model with its weights placed on `mesh` (replicated, or split over 'model')."""
  if MODEL in mesh.axis_names:
    tp, text = dict(mesh.shape)[MODEL], model.config.text
    for what, n in (("KV heads", text.num_kv_heads), ("query heads", text.num_heads),
                    ("MLP columns", text.intermediate_size)):
      if n % tp:
        raise ValueError(f"{n} {what} do not split over a 'model' axis of {tp} devices")
  specs = weight_specs(model.params, mesh)
  params = jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), model.params, specs)
  return model.replace(params=params)


def shard_inputs(inputs: dict[str, np.ndarray], mesh: Mesh, batch: int) -> dict:
  """Splits the per-request arrays along 'data'; the rest (e.g. Qwen2-VL's flat patches) is replicated."""
  split, whole = NamedSharding(mesh, P(DATA)), NamedSharding(mesh, P())
  return {k: jax.device_put(v, split if (k in BATCH_KEYS and np.shape(v)[:1] == (batch,)) else whole)
          for k, v in inputs.items()}


def shard_batch_axis(tree, mesh: Mesh, axes: dict | None = None):
  """Places every array of `tree` split along 'data' on the axis `axes` names for it (default: axis 0)."""
  def put(path, x):
    axis = (axes or {}).get(getattr(path[-1], "name", None), 0) if path else 0
    spec = [None] * x.ndim
    spec[axis] = DATA
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))
  return jax.tree_util.tree_map_with_path(put, tree)


def pad_requests(videos: list, prompts: list[str], multiple: int) -> tuple[list, list[str], int]:
  """Repeats the last request so the batch divides the data axis; returns the real count too."""
  real = len(prompts)
  extra = -real % multiple
  return videos + [videos[-1]] * extra, prompts + [prompts[-1]] * extra, real
