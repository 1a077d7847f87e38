"""benchmarks.prefill_cost on the tiny decoder: every part timed against the prefill, and the memory skip."""
import pytest

from benchmarks import prefill_cost
from wq_jax import generation


@pytest.fixture(scope="module")
def decoder():
  return prefill_cost.tiny_decoder()


def test_every_part_is_timed_as_a_share_of_the_prefill(decoder):
  row = prefill_cost.measure(decoder, 8, implementation=None, repeats=2, prefill_repeats=1)
  assert "skipped" not in row and row["tokens"] == 16 + 8 * 9 + 64 and row["within_context"]
  for part in ("window_search", "token_search", "quantize"):
    assert row[f"{part}_ms"] > 0
    assert row[f"{part}_pct"] == pytest.approx(100 * row[f"{part}_ms"] / row["prefill_ms"])
  assert sum(int(n) for n in row["windows_16_4_2"].split("/")) == decoder.cfg.num_layers * (8 * 9 // 32)


def test_a_prefill_that_would_not_fit_is_skipped(decoder, monkeypatch):
  monkeypatch.setattr(generation, "_device_free_bytes", lambda: 1000)
  row = prefill_cost.measure(decoder, 8, implementation=None, repeats=2, prefill_repeats=1)
  assert row["skipped"] == "memory (estimated)" and "prefill_ms" not in row
