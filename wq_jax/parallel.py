"""Data parallelism over a `jax.sharding.Mesh`: requests split along a 'data' axis.

Placing the inputs is all it takes: every step of `generate` is a `jit`, so
XLA's sharding propagation runs the vision tower, the prefill, the cache build
and the decode loop on each device's share of the batch. The batch's one plan
is still the vote of all its requests (the plan is computed on the host).
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA = "data"
# Transformers-style inputs whose first axis is the request.
BATCH_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values_videos", "pixel_values",
              "image_sizes", "second_per_grid_ts")


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A one-axis mesh over `devices` (all local devices by default)."""
  devices = jax.local_devices() if devices is None else list(devices)
  return Mesh(np.array(devices), (DATA,))


def data_size(mesh: Mesh | None) -> int:
  return 1 if mesh is None else mesh.shape[DATA]


def replicate(tree, mesh: Mesh):
  """Copies a pytree (the weights) to every device of the mesh."""
  return jax.device_put(tree, NamedSharding(mesh, P()))


def shard_inputs(inputs: dict[str, np.ndarray], mesh: Mesh, batch: int) -> dict:
  """Splits the per-request arrays along 'data'; the rest (e.g. Qwen2-VL's flat patches) is replicated."""
  split, whole = NamedSharding(mesh, P(DATA)), NamedSharding(mesh, P())
  return {k: jax.device_put(v, split if (k in BATCH_KEYS and np.shape(v)[:1] == (batch,)) else whole)
          for k, v in inputs.items()}


def pad_requests(videos: list, prompts: list[str], multiple: int) -> tuple[list, list[str], int]:
  """Repeats the last request so the batch divides the data axis; returns the real count too."""
  real = len(prompts)
  extra = -real % multiple
  return videos + [videos[-1]] * extra, prompts + [prompts[-1]] * extra, real
