"""benchmarks.fidelity on the tiny LLaVA-OneVision: the teacher-forced comparison and its reference."""
import numpy as np
import pytest

import wq_jax
from benchmarks import fidelity
from wq_jax import video as video_io

PROMPT = "What is happening in this video?"
STEPS = 8


@pytest.fixture(scope="module")
def model(llava_converted):
  return wq_jax.load(llava_converted.folder)


@pytest.fixture(scope="module")
def frames():
  return video_io.synthetic_frames(16, 64, 80, seed=3)


@pytest.fixture(scope="module")
def result(model, frames):
  rows, ref = fidelity.fidelity(model, frames, PROMPT, steps=STEPS, method_names=("fp16", "rtn2"))
  return {r["method"]: r for r in rows}, ref


def test_fp16_against_itself_is_exact(result):
  rows, _ = result
  fp16 = rows["fp16"]
  assert fp16["kl_max"] < 1e-6 and fp16["agreement"] == 1.0 and fp16["free_agreement"] == 1.0
  assert fp16["first_disagreement"] == "none"


def test_a_quantized_cache_moves_the_distribution_a_little(result):
  rows, _ = result
  kl = np.asarray(rows["rtn2"]["kl_per_step"])
  assert kl.shape == (STEPS,) and np.all(np.isfinite(kl))
  assert np.all(kl >= -1e-6) and kl.mean() > 1e-9  # INT2 changes every step's logits, by a little
  assert 0.0 <= rows["rtn2"]["agreement"] <= 1.0
  assert rows["rtn2"]["cache_MB"] < rows["fp16"]["cache_MB"]


def test_the_reference_is_what_generate_decodes(model, frames, result):
  _, ref = result
  g = wq_jax.generate(model, frames, PROMPT, method="fp16", max_new_tokens=STEPS + 1, return_logits=True,
                      temperature=0)
  # generate's token 0 comes from the prefill; its tokens 1.. are the decode steps (up to EOS).
  n = len(g.token_ids) - 1
  assert n >= 1
  np.testing.assert_array_equal(ref["tokens"][:n], g.token_ids[1:])
  np.testing.assert_allclose(ref["logits"][: g.logits.shape[1] - 1], g.logits[0, 1:], rtol=1e-4, atol=1e-4)
