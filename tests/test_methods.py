"""Every method plans through the same cache; ablations change what the paper says they change."""
import numpy as np
import pytest

from wq_jax import attention, cache, methods
from wq_jax.methods import KiviConfig, PlanInputs, WindowQuantConfig

L, W, S = 4, 10, 8


def inputs(seed=0, batch=3):
  rng = np.random.default_rng(seed)
  return PlanInputs(scores=rng.uniform(-0.2, 1.0, (batch, W)).astype(np.float32),
                    sensitivity=np.array([0.1, 0.6, 0.9, 0.97], np.float32), num_layers=L,
                    visual_start=4, num_visual=W * S + 3, seq_lens=[W * S + 40] * batch)


def plan_of(name, config=None, seed=0):
  method, config = methods.resolve(name, config)
  return method.plan(config, inputs(seed)), method.cache_options(config)


def test_uniform_methods():
  assert np.all(plan_of("fp16")[0] == 16)
  assert np.all(plan_of("rtn4")[0] == 4)
  assert np.all(plan_of("rtn2")[0] == 2)


def test_kivi_keeps_the_recent_tokens_and_groups_values_by_channel():
  plan, options = plan_of("kivi2", KiviConfig(bits=2, group_size=8, residual_length=40))
  # Sequence of 120 tokens: the last 40 start at 80; windows end at 4 + 8 (w + 1).
  ends = 4 + 8 * (np.arange(W) + 1)
  np.testing.assert_array_equal(plan[0], np.where(ends > 80, 16, 2))
  assert options.value_channel_group == 8


def test_windowquant_plan_and_its_ablations():
  plan, _ = plan_of("windowquant", WindowQuantConfig(window_size=S))
  assert set(np.unique(plan)) <= {16, 4, 2} and np.all(plan[:, 0] == 16)
  no_fix, _ = plan_of("windowquant", WindowQuantConfig(window_size=S, fix_first_window=False))
  np.testing.assert_array_equal(no_fix[:, 1:], plan[:, 1:])
  rand, _ = plan_of("windowquant", WindowQuantConfig(window_size=S, random_plan=True, seed=3))
  assert np.all(rand[:, 0] == 16)
  for l in range(L):
    assert sorted(rand[l]) == sorted(plan[l])
  _, options = plan_of("windowquant", WindowQuantConfig(window_size=S, reorder=False))
  assert options.reorder is False


def test_low_sensitivity_layers_keep_more_high_precision():
  plan, _ = plan_of("windowquant", WindowQuantConfig(window_size=S, alpha=2.0))
  high = (plan == 16).sum(axis=1)
  assert high[0] >= high[-1]


@pytest.mark.parametrize("name", sorted(methods.METHODS))
def test_every_method_builds_a_cache_that_attends_like_its_dequantized_self(name):
  import jax
  method, config = methods.resolve(name, None)
  if hasattr(config, "window_size") and not isinstance(config, KiviConfig):
    config = type(config)(**{**config.__dict__, "window_size": S})
  else:
    config = KiviConfig(bits=config.bits, group_size=S, residual_length=16)
  plan = method.plan(config, inputs())
  options = method.cache_options(config)
  t = W * S + 40
  k = jax.random.normal(jax.random.PRNGKey(1), (L, 3, 2, t, 16))
  v = jax.random.normal(jax.random.PRNGKey(2), (L, 3, 2, t, 16))
  c = methods.build_method_cache(options, k, v, plan, visual_start=4, num_visual=W * S + 3, seq_lens=[t] * 3,
                                 max_new_tokens=2)
  q = jax.random.normal(jax.random.PRNGKey(3), (3, 4, 16))
  for l in range(L):
    kk, vv, valid = cache.dequantized_layer(c, l)
    np.testing.assert_allclose(np.asarray(attention.decode_attention(q, c.layer(l))),
                               np.asarray(attention.reference_attention(q, kk, vv, valid)), rtol=1e-4, atol=1e-5)


def test_unknown_method_and_wrong_config_are_named():
  with pytest.raises(ValueError, match="unknown method 'int3'"):
    methods.resolve("int3")
  with pytest.raises(TypeError, match="WindowQuantConfig"):
    methods.resolve("windowquant", KiviConfig())


def test_reorder_false_builds_the_original_order_layout_and_attends_the_same():
  import jax
  from wq_jax.interleaved import InterleavedCache
  t = W * S + 40
  k = jax.random.normal(jax.random.PRNGKey(4), (L, 3, 2, t, 16))
  v = jax.random.normal(jax.random.PRNGKey(5), (L, 3, 2, t, 16))
  q = jax.random.normal(jax.random.PRNGKey(6), (3, 4, 16))
  outs = []
  for reorder in (True, False):
    method, config = methods.resolve("windowquant", WindowQuantConfig(window_size=S, reorder=reorder))
    c = methods.build_method_cache(method.cache_options(config), k, v, method.plan(config, inputs()),
                                   visual_start=4, num_visual=W * S + 3, seq_lens=[t] * 3, max_new_tokens=2)
    assert isinstance(c, InterleavedCache) == (not reorder)
    outs.append(np.asarray(attention.decode_attention(q, c.layer(2))))
  np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
