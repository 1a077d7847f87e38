"""Window search formulas (SPEC Eqs. 8-11) against numpy, and the batch vote."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wq_jax import search


def test_window_scores_equal_the_double_sum_of_eq8():
  rng = np.random.default_rng(0)
  b, n, m, d, s = 2, 7, 70, 16, 8
  text = rng.standard_normal((b, n, d)).astype(np.float32)
  vis = rng.standard_normal((b, m, d)).astype(np.float32)
  got = np.asarray(search.window_scores(jnp.asarray(text), jnp.asarray(vis), s))
  assert got.shape == (b, m // s)  # the 6-token tail is not scored
  for bi in range(b):
    for i in range(m // s):
      total = 0.0
      for t in text[bi]:
        for w in vis[bi, i * s:(i + 1) * s]:
          total += t @ w / (np.linalg.norm(t) * np.linalg.norm(w))
      np.testing.assert_allclose(got[bi, i], total / (s * n), rtol=1e-5, atol=1e-6)


def test_window_scores_ignore_masked_text_tokens():
  rng = np.random.default_rng(1)
  text = rng.standard_normal((1, 6, 8)).astype(np.float32)
  vis = rng.standard_normal((1, 16, 8)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 0, 0]], bool)
  got = search.window_scores(jnp.asarray(text), jnp.asarray(vis), 4, text_mask=jnp.asarray(mask))
  want = search.window_scores(jnp.asarray(text[:, :4]), jnp.asarray(vis), 4)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_window_scores_jit_and_zero_vectors_are_finite():
  text = jnp.zeros((1, 3, 8)).at[0, 0, 0].set(1.0)
  vis = jnp.zeros((1, 8, 8))
  out = jax.jit(search.window_scores, static_argnums=2)(text, vis, 4)
  assert np.all(np.isfinite(np.asarray(out)))


def test_token_scores_average_to_window_scores():
  rng = np.random.default_rng(2)
  text = jnp.asarray(rng.standard_normal((2, 5, 12)), jnp.float32)
  vis = jnp.asarray(rng.standard_normal((2, 24, 12)), jnp.float32)
  tok = search.token_scores(text, vis).reshape(2, 3, 8).mean(-1)
  np.testing.assert_allclose(np.asarray(tok), np.asarray(search.window_scores(text, vis, 8)), rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 4.0])
def test_thresholds_follow_eqs_10_11(alpha):
  s = np.linspace(0, 1, 11)
  lo, hi = search.thresholds(jnp.asarray(s), alpha)
  np.testing.assert_allclose(np.asarray(lo), (np.exp(alpha * s) - 1) / (np.exp(alpha) - 1), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(hi), (np.exp(-alpha * s) - 1) / (np.exp(-alpha) - 1), rtol=1e-5, atol=1e-7)
  assert np.all(np.asarray(lo) <= np.asarray(hi) + 1e-7)


def test_thresholds_clip_sensitivity_and_widen_with_alpha():
  lo, hi = search.thresholds(jnp.array([-0.5, 1.5]), 2.0)
  np.testing.assert_allclose(np.asarray(lo), [0, 1], atol=1e-6)
  np.testing.assert_allclose(np.asarray(hi), [0, 1], atol=1e-6)
  widths = [float(h - l) for l, h in [tuple(np.asarray(x)[0] for x in search.thresholds(jnp.array([0.5]), a))
                                      for a in (1, 2, 4)]]
  assert widths[0] < widths[1] < widths[2]


def test_layer_sensitivity_is_eq9_averaged_over_valid_tokens():
  rng = np.random.default_rng(3)
  h_in = rng.standard_normal((2, 6, 8)).astype(np.float32)
  h_out = h_in + 0.5 * rng.standard_normal((2, 6, 8)).astype(np.float32)
  mask = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
  got = np.asarray(search.layer_sensitivity(jnp.asarray(h_in), jnp.asarray(h_out), jnp.asarray(mask)))
  cos = (h_in * h_out).sum(-1) / (np.linalg.norm(h_in, axis=-1) * np.linalg.norm(h_out, axis=-1))
  want = [cos[0].mean(), cos[1, :4].mean()]
  np.testing.assert_allclose(got, np.clip(want, 0, 1), rtol=1e-5)


def test_plan_bits_thresholds_and_first_window():
  scores = jnp.array([[0.1, 0.5, 0.95, 0.3]])
  t_low = jnp.array([0.2, 0.0])
  t_high = jnp.array([0.9, 0.05])
  plan = np.asarray(search.plan_bits(scores, t_low, t_high))
  assert plan.dtype == np.int32 and plan.shape == (2, 4)
  np.testing.assert_array_equal(plan, [[16, 4, 16, 4], [16, 16, 16, 16]])
  plan = np.asarray(search.plan_bits(scores, t_low, t_high, fix_first_window=False))
  np.testing.assert_array_equal(plan[0], [2, 4, 16, 4])


def test_majority_vote_and_ties_go_to_higher_precision():
  choices = jnp.array([
      [[2, 2, 4, 2, 16, 2]],
      [[2, 4, 4, 4, 2, 16]],
      [[4, 4, 2, 16, 4, 4]],
      [[2, 16, 16, 16, 16, 2]],
  ])  # [B=4, L=1, W=6]
  got = np.asarray(search.majority_vote(choices))[0]
  # w0: 2 wins 3-1; w1: 4 vs 2 vs 16 = 2,1,1 -> 4; w2: 4:2, 16:1, 2:1 -> 4;
  # w3: 16:2, 4:1, 2:1 -> 16; w4: 16:2, 2:1, 4:1 -> 16; w5: 2:2, 16:1, 4:1 -> 2.
  np.testing.assert_array_equal(got, [2, 4, 4, 16, 16, 2])
  ties = jnp.array([[[2, 4, 2]], [[4, 16, 16]]])  # each window a 1-1 tie
  np.testing.assert_array_equal(np.asarray(search.majority_vote(ties))[0], [4, 16, 16])


def test_batch_plan_is_the_vote_of_each_request():
  rng = np.random.default_rng(4)
  scores = jnp.asarray(rng.uniform(0, 1, (5, 9)), jnp.float32)
  lo, hi = search.thresholds(jnp.asarray(rng.uniform(0.2, 0.9, 3)), 2.0)
  plan = np.asarray(search.plan_bits(scores, lo, hi, fix_first_window=False))
  per = np.asarray(search.bits_per_request(scores, lo, hi))
  for l in range(3):
    for w in range(9):
      votes = {b: int((per[:, l, w] == b).sum()) for b in (16, 4, 2)}
      best = max(votes.values())
      assert plan[l, w] == max(b for b, c in votes.items() if c == best)


def test_random_plan_keeps_proportions_and_first_window():
  plan = jnp.array([[16, 2, 2, 4, 16, 2, 4], [16, 4, 4, 4, 2, 2, 2]], jnp.int32)
  shuffled = np.asarray(search.random_plan(plan, jax.random.PRNGKey(0)))
  assert np.all(shuffled[:, 0] == 16)
  for l in range(2):
    assert sorted(shuffled[l]) == sorted(np.asarray(plan)[l])
  assert not np.array_equal(shuffled, np.asarray(plan))
  again = np.asarray(search.random_plan(plan, jax.random.PRNGKey(0)))
  np.testing.assert_array_equal(shuffled, again)
