"""benchmarks/decode_attention.py's timing: how many calls a timed repeat makes, and what it divides by."""
import jax.numpy as jnp

from benchmarks import decode_attention as da


def counting(calls):
  def compiled(inputs, queries):
    calls.append(len(queries))
    return [(jnp.zeros(2), jnp.zeros(2)) for _ in queries]
  return compiled


def test_back_to_back_sends_that_many_dispatches_a_repeat(monkeypatch):
  calls = []
  monkeypatch.setattr(da, "BACK_TO_BACK", 4)
  seconds, _, finite, _ = da.bench(None, [()], [jnp.zeros(1)] * 3, repeats=5, compiled=counting(calls))
  assert len(calls) == 1 + 5 * 4 and set(calls) == {3}  # a warm-up, then 5 repeats of 4 dispatches of 3 calls
  assert finite and seconds > 0
  calls.clear()
  monkeypatch.setattr(da, "BACK_TO_BACK", 0)
  da.bench(None, [()], [jnp.zeros(1)] * 3, repeats=5, compiled=counting(calls))
  assert len(calls) == 1 + 5


def test_inner_calls_is_about_2_ms_of_work_unless_fixed(monkeypatch):
  assert da.inner_calls(int(3e12 * 1e-3)) == 2  # 1 ms of bytes at 3 TB/s (+5 µs)
  assert da.inner_calls(10) == 32 and da.inner_calls(int(1e12)) == 1
  monkeypatch.setattr(da, "INNER_CALLS", 16)
  assert da.inner_calls(10) == 16 and da.inner_calls(int(1e12)) == 16


def test_gpu_time_rows_compare_with_cudnn_on_the_gpu_too():
  """With `--gpu-time` each sweep row also reads by GPU span, the kernel against cudnn's own span (small calls'
  clock is the host's dispatch); rows without a profile are left out of that table."""
  row = dict(batch=1, tokens=1024, plan="mix", bytes=800_000, pallas_s=44e-6, pallas_TBps=0.8 / 44, cudnn_s=21e-6,
             cudnn_bytes=2_097_152, pallas_gpu_span_s=8e-6, cudnn_gpu_span_s=6e-6)
  report = dict(command="c", date="d", device="gpu", jax="0", copy={"torch_copy_TBps": 4.0},
                results=[row, dict(row, batch=8, pallas_gpu_span_s=None)])
  text = da.markdown(report)
  table = text[text.index("GPU time a call"):]
  assert "| 1 | 1024 | mix | 8.0 | 0.10 | 2 | 6.0 | 0.75 | 0.29 |" in table  # 0.8 MB / 8 µs; 6 / 8; / (2.1 / 0.8)
  assert "| 8 | 1024 |" not in table


def test_layered_calls_read_each_layer_of_one_cache_in_place():
  """Small calls' timing (`LAYERED`, the default): one synthetic cache of L layers, call i reading layer i in place (its pools at an offset, its
  rest segment in the stacked array), equals the XLA path on that layer; and each layer holds the plan's windows."""
  import jax
  c = da.synthetic_cache(jax.random.PRNGKey(3), 1, da.TEXT + 5 * da.WINDOW, "mix", layers=3)
  assert c.num_layers == 3 and c.counts.T.tolist() == [list(da.window_counts(da.TEXT + 5 * da.WINDOW, "mix"))] * 3
  assert c.offsets[:, 2].tolist() == [2 * n for n in c.counts[:, 0].tolist()]
  qs = da.queries(jax.random.PRNGKey(4), 1, 3)
  compiled, _ = da.compile_calls(da.pallas_fn(None), [(c,)], qs, layered=True)
  got = compiled([(c,)], qs)
  want = [da.xla_fn(q, c, layer=i) for i, q in enumerate(qs)]
  for g, w in zip(got, want):
    assert da.rel_err(g, w) < 1e-2
  assert da.rel_err(got[2], da.xla_fn(qs[2], c, layer=1)) > 0.1  # layers differ: a wrong offset would show


def test_configured_calls_plan_launches_on_a_layers_tokens(monkeypatch):
  """A tiling variant's call (`pallas_fn(config)`) on one cache of many layers plans its launches as the registered
  "pallas" does, on the tokens a layer can own: at batch 8 x 1k (mixed plan) one launch, where planning on the 32
  layers' pools put the INT4 pool in a launch of its own (s35: the sweep after a variants' table timed that)."""
  import jax

  from pallas_kernels import quantized_decode as qd
  launches = []
  real = qd._launch
  monkeypatch.setattr(qd, "_launch", lambda *args, **kwargs: launches.append(1) or real(*args, **kwargs))
  cache = da.synthetic_cache(jax.random.PRNGKey(0), 8, 1024, "mix", layers=32)
  q = da.queries(jax.random.PRNGKey(1), 8, 1)[0]
  counts = []
  for config in (None, qd.DecodeConfig()):
    launches.clear()
    jax.eval_shape(lambda q, c: da.pallas_fn(config)(q, c, layer=3), q, cache)
    counts.append(len(launches))
  assert counts == [1, 1]
  whole = qd.int4_launch_pays(qd.DecodeConfig(), 8 * da.KV_HEADS * cache.k_pools[1].data.shape[2])
  assert whole  # the case the test guards: the whole pool's tokens would have made an INT4 launch
