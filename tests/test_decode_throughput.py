"""`benchmarks.decode_throughput` end to end in its tiny mode: every method timed, rows that add up."""
import json

import jax
import pytest

from benchmarks import decode_throughput

SETTINGS = ("3x24",)  # 6 windows of 32 visual tokens (one setting: each compiles 9 loops, CI's time)
ALPHAS, WINDOW_SIZES = (0.5, 4.0), (8, 128)  # the sweeps' ends (each a loop compiled)


# The fixture's tests on one worker (`--dist loadgroup`, pyproject's addopts): each worker would run it again.
shares_results = pytest.mark.xdist_group("decode_throughput_results")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = tmp_path_factory.mktemp("decode_throughput")
  # 50 MB of "device memory" (a CPU reports none): capacity predicts and tries batches of tens.
  decode_throughput.main(["--tiny", "--settings", *SETTINGS, "--capacity", "--sweeps", "--memory-gb", "0.05",
                          "--alphas", *map(str, ALPHAS), "--window-sizes", *map(str, WINDOW_SIZES),
                          "--out", str(out), "--tag", "t"])

  def read(part):
    return json.loads((out / f"decode_throughput_tiny_t{part}_{jax.default_backend()}.json").read_text())

  return read(""), read("_capacity"), read("_sweeps"), out


@shares_results
def test_every_method_is_timed_in_every_setting(results):
  main, _, _, out = results
  rows = {(r["setting"], r["method"]): r for r in main["rows"]}
  assert set(rows) == {(s, m) for s in SETTINGS for m in decode_throughput.METHODS}
  for r in rows.values():
    assert r["ms_step"] > 0 and r["tok_s"] > 0 and r["floor_ms"] > 0 and r["compile_s"] > 0
    assert r["tok_s"] == pytest.approx(1e3 * r["batch"] / r["ms_step"])
    assert len(r["loop_times_s"]) == 2
    assert 0 < r["host_ms"] < r["ms_step"] * 10  # the host's time in a step's call (on a CPU it runs the step)
  assert (out / f"decode_throughput_tiny_t_{jax.default_backend()}.md").read_text().count("| 3x24 |") == 9
  assert (out / f"decode_throughput_tiny_t_{jax.default_backend()}.png").stat().st_size > 0


@shares_results
def test_bytes_follow_the_methods(results):
  rows = {(r["setting"], r["method"]): r for r in results[0]["rows"]}
  for s in SETTINGS:
    fp16 = rows[s, "fp16"]
    assert fp16["speedup_vs_fp16"] == 1.0 and fp16["byte_speedup"] == pytest.approx(1.0)
    assert rows[s, "rtn2"]["cache_MB"] < rows[s, "rtn4"]["cache_MB"] < fp16["cache_MB"]
    assert rows[s, "windowquant"]["cache_MB"] < fp16["cache_MB"]
    assert rows[s, "windowquant"]["byte_speedup"] > 1
    # Window 0 stays high in every layer (2 of them), except in ablation A.
    assert int(rows[s, "windowquant"]["windows_16_4_2"].split("/")[0]) >= 2
    n16, n4, n2 = (int(x) for x in rows[s, "fp16"]["windows_16_4_2"].split("/"))
    assert n4 == n2 == 0 and n16 == 2 * ((int(s.split("x")[1]) * 9 + 1) // 32)
    # The floor counts the same weights in every row and the cache on top.
    assert {r["weights_MB"] for r in rows.values()} == {fp16["weights_MB"]}
    assert rows[s, "rtn2"]["floor_ms"] < fp16["floor_ms"]


@shares_results
def test_capacity_is_predicted_and_tried(results):
  rows = {r["method"]: r for r in results[1]["rows"]}
  assert set(rows) == set(decode_throughput.METHODS)
  for method in ("fp16", "windowquant"):
    assert rows[method]["verified"].startswith("ok"), rows[method]["verified"]
    assert rows[method]["verified_batch"] == rows[method]["max_batch"] > 1
  assert rows["windowquant"]["cache_MB_per_request"] < rows["fp16"]["cache_MB_per_request"]
  assert rows["fp16"]["max_frames_context"] > 24


@shares_results
def test_sweeps_cover_alpha_and_window_size(results):
  rows = results[2]["rows"]
  assert sorted(r["alpha"] for r in rows if r["sweep"] == "alpha") == list(ALPHAS)
  assert sorted(r["window_size"] for r in rows if r["sweep"] == "window") == list(WINDOW_SIZES)
  for r in rows:
    windows = [int(x) for x in r["windows_16_4_2"].split("/")]
    tokens = [int(x) for x in r["tokens_16_4_2"].split("/")]
    assert tokens == [w * r["window_size"] for w in windows]
    assert sum(windows) == 2 * ((24 * 9 + 1) // r["window_size"])
    assert r["ms_step"] > 0


def test_xla_options_time_each_loop_again_in_the_same_run(tmp_path):
  options = 'graphs={"xla_gpu_graph_min_graph_size": 1}'
  decode_throughput.main(["--tiny", "--settings", "1x24", "--methods", "fp16", "windowquant", "--steps", "3",
                          "--repeats", "1", "--xla-options", options, "bad={\"xla_gpu_enable_command_buffer\": \"NO\"}",
                          "--undonated", "--out", str(tmp_path), "--tag", "o"])
  report = json.loads((tmp_path / f"decode_throughput_tiny_o_{jax.default_backend()}.json").read_text())
  rows = {(r["method"], r["attention"]): r for r in report["rows"]}
  assert set(rows) == {(m, a + d) for m in ("fp16", "windowquant") for a in ("xla", "xla [graphs]")
                       for d in ("", " [state not donated]")}
  # Each variant is compared with fp16 compiled the same way.
  assert rows["windowquant", "xla [graphs]"]["speedup_vs_fp16"] == pytest.approx(
      rows["fp16", "xla [graphs]"]["ms_step"] / rows["windowquant", "xla [graphs]"]["ms_step"])
  # and its greedy tokens with the plain loop's (the same computation, so all of them)
  assert "tokens_as_plain" not in rows["windowquant", "xla"]
  assert rows["windowquant", "xla [graphs]"]["tokens_as_plain"] == 1.0
  assert rows["fp16", "xla [state not donated]"]["tokens_as_plain"] == 1.0
  md = (tmp_path / f"decode_throughput_tiny_o_{jax.default_backend()}.md").read_text()
  assert "not a valid enum value" in md  # an option XLA refuses skips its rows, named, and the run goes on


def test_fused_norms_and_loops_on_the_device_are_timed_beside_the_default(tmp_path):
  decode_throughput.main(["--tiny", "--settings", "1x24", "--methods", "fp16", "windowquant", "--steps", "4",
                          "--repeats", "1", "--norms", "xla", "pallas", "--steps-per-call", "2",
                          "--out", str(tmp_path), "--tag", "n"])
  report = json.loads((tmp_path / f"decode_throughput_tiny_n_{jax.default_backend()}.json").read_text())
  rows = {(r["method"], r["attention"]): r for r in report["rows"]}
  fused = "xla [pallas norms] [2 steps a call]"
  assert set(rows) == {(m, a) for m in ("fp16", "windowquant") for a in ("xla [2 steps a call]", fused)}
  assert rows["windowquant", fused]["speedup_vs_fp16"] == pytest.approx(
      rows["fp16", fused]["ms_step"] / rows["windowquant", fused]["ms_step"])


def test_xla_options_must_be_named_json():
  with pytest.raises(SystemExit):
    decode_throughput.parse_args(["--xla-options", "graphs"])
  with pytest.raises(SystemExit):
    decode_throughput.parse_args(["--xla-options", "graphs={nope"])


def test_full_size_qwen2_vl_builder_prefills_a_video(tmp_path):
  """The Qwen2-VL preset's builder (tokenizer specials, video processor, M-RoPE), its widths shrunk so that a
  CPU runs it: 4 frames of 448 px are 2 temporal patches of 32 x 32, 256 tokens each after the 2 x 2 merge."""
  from benchmarks import full_size
  from models import presets

  hf = presets.hf_config("qwen2-vl-7b-instruct").to_dict()
  text = hf.get("text_config") or hf
  small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
  text.update(small)
  for d in (hf, text):
    d.pop("layer_types", None)  # one a layer of the 28: derived again from the 2
  if text is not hf:
    hf.update({k: v for k, v in small.items() if k in hf})
  hf["vision_config"].update({"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": 64})
  model = full_size.qwen2_vl("", tmp_path, jax.numpy.float32, hf=hf)
  assert full_size.frame_side(model) == 448
  prefilled = decode_throughput.prefill_one(model, 4, steps=3)
  assert prefilled.seq_lens[0] > 512 > prefilled.seq_lens[0] - 64  # 512 video tokens and a short prompt
  built = decode_throughput.build(prefilled, "windowquant", steps=3)
  n16, n4, n2 = (int(x) for x in decode_throughput._counts(built.cache.plan).split("/"))
  assert n16 >= 2 and n16 + n4 + n2 == 2 * 512 // 32  # windows of visual tokens; window 0 stays high


def test_full_size_refuses_other_families(tmp_path):
  from benchmarks import full_size
  with pytest.raises(ValueError, match="LLaVA-OneVision and Qwen2-VL"):
    full_size.model("internvl2-8b", tmp_path)


def test_methods_the_mosaic_paths_do_not_serve_are_not_timed_again_under_them():
  asked = ["pallas", "pallas:mosaic_int2", "pallas:mosaic_int2_int4"]
  assert decode_throughput._attentions("fp16", asked) == ["pallas"]
  assert decode_throughput._attentions("kivi2", asked) == ["pallas"]
  assert decode_throughput._attentions("rtn4", asked) == ["pallas", "pallas:mosaic_int2_int4"]
  assert decode_throughput._attentions("windowquant", asked) == asked
  assert decode_throughput._attentions("fp16", ["pallas:mosaic_int2"]) == ["pallas:mosaic_int2"]
  # KIVI's pools and INT4 ones under the configuration that takes them (by its configuration, not its name)
  asked = ["pallas", "pallas:mosaic_int2_wg4_vregs", "pallas:mosaic_int2_wg4_kivi"]
  assert decode_throughput._attentions("kivi2", asked) == ["pallas", "pallas:mosaic_int2_wg4_kivi"]
  assert decode_throughput._attentions("kivi4", asked) == ["pallas", "pallas:mosaic_int2_wg4_kivi"]
  assert decode_throughput._attentions("rtn4", asked) == ["pallas", "pallas:mosaic_int2_wg4_kivi"]
  assert decode_throughput._attentions("fp16", asked) == ["pallas"]
  assert decode_throughput._attentions("windowquant", asked) == asked
  # "pallas" differs from "pallas:triton" only where it may send a pool to the Mosaic kernel: INT2, INT4 and
  # KIVI's at large batches (`LARGE_BATCH_MOSAIC`), never fp16's
  asked = ["pallas", "pallas:triton"]
  assert decode_throughput._attentions("fp16", asked) == ["pallas"]
  for method in ("rtn4", "kivi2", "kivi4"):
    assert decode_throughput._attentions(method, asked) == asked
  assert decode_throughput._attentions("windowquant", asked) == asked
  assert decode_throughput._attentions("rtn2", asked) == asked
  # Ablation C: its paged kernels under "pallas" (Mosaic for INT4 and INT2 at large batches), "pallas:triton"
  # (Triton for every format) and a "pallas:mosaic_*" path (its paged INT2 launches take that configuration, since
  # s46), XLA's reader under "xla"; any other "pallas:*" name would run "pallas"'s again
  asked = ["xla", "pallas", "pallas:triton", "pallas:mosaic_wide", "pallas:split128"]
  assert decode_throughput._attentions("C", asked) == ["xla", "pallas", "pallas:triton", "pallas:mosaic_wide"]
  assert decode_throughput._attentions("C", ["pallas:split128"]) == ["pallas"]
