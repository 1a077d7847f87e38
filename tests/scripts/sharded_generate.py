"""Run under 4 fake CPU devices: generate on a mesh equals generate on one device, per request.

argv: checkpoint folder, mesh "data" (4 x 1) or "data,model" (2 x 2), then method names
(windowquant-C: the unreordered layout).
"""
import sys

import jax
import numpy as np

import wq_jax
from wq_jax import WindowQuantConfig, parallel
from wq_jax import video as video_io

ckpt, axes, names = sys.argv[1], sys.argv[2], sys.argv[3:]
assert len(jax.devices()) == 4, jax.devices()
model = wq_jax.load(ckpt)
videos = [video_io.synthetic_frames(8, 48, 48, seed=s) for s in range(3)]  # 3 requests: an uneven batch
prompts = ["What is happening?", "Describe the video.", "How many people appear?"]
mesh = parallel.data_mesh() if axes == "data" else parallel.mesh_2d(2, 2)
placed = parallel.shard_model(model, mesh)
for name in names:
  name, _, attention = name.partition("+")  # "windowquant+pallas": the kernel, per shard
  method, config = name, None
  if name.startswith("windowquant"):
    method, config = "windowquant", WindowQuantConfig(window_size=8, reorder=not name.endswith("-C"))
  kw = dict(method=method, config=config, max_new_tokens=6, return_logits=True)
  sharded = wq_jax.generate(placed, videos, prompts, mesh=mesh, attention=attention or "xla", **kw)
  plain = wq_jax.generate(model, videos, prompts, **kw)
  assert len(sharded.token_ids) == 3
  np.testing.assert_array_equal(sharded.bit_plan, plain.bit_plan)
  for a, b in zip(sharded.token_ids, plain.token_ids):
    np.testing.assert_array_equal(a, b)
  # Quantized caches: the kernel dequantizes INT4/INT2 windows into halves, the XLA path in float32; and a
  # sharded product sums in another order, so a value one ulp off can round to the neighbouring code (rtn4
  # with the fused [D, K, G+2, H] projection: one request's logits 1e-4 to 4.3e-4 apart from its first
  # decode step on, its prefill logits, plan and tokens equal; fp16's agree to 1e-6).
  tol = 1e-4 if method == "fp16" else 2e-3
  np.testing.assert_allclose(sharded.logits, plain.logits, rtol=tol, atol=tol)
  print(f"{name}{'+' + attention if attention else ''}: sharded == plain", flush=True)
