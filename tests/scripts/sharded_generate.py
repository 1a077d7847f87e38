"""Run under 4 fake CPU devices: generate with a data mesh equals generate without, per request."""
import sys

import jax
import numpy as np

import wq_jax
from wq_jax import parallel
from wq_jax import video as video_io

ckpt, method = sys.argv[1], sys.argv[2]
assert len(jax.devices()) == 4, jax.devices()
model = wq_jax.load(ckpt)
videos = [video_io.synthetic_frames(8, 48, 48, seed=s) for s in range(3)]  # 3 requests on 4 devices
prompts = ["What is happening?", "Describe the video.", "How many people appear?"]
mesh = parallel.data_mesh()
kw = dict(method=method, max_new_tokens=6, return_logits=True)
sharded = wq_jax.generate(parallel.replicate(model, mesh), videos, prompts, mesh=mesh, **kw)
plain = wq_jax.generate(model, videos, prompts, **kw)
assert len(sharded.token_ids) == 3
for a, b in zip(sharded.token_ids, plain.token_ids):
  np.testing.assert_array_equal(a, b)
np.testing.assert_allclose(sharded.logits, plain.logits, rtol=1e-4, atol=1e-4)
print("sharded == plain")
