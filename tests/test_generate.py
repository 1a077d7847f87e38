"""`wq_jax.generate` end to end on a tiny converted LLaVA-OneVision and real encoded mp4 files."""
import logging
import warnings

import jax
import numpy as np
import pytest
import torch

import wq_jax
from wq_jax import WindowQuantConfig
from wq_jax import generation as generate_module
from wq_jax import video as video_io

PROMPT = "What is happening in this video?"
FRAMES = 16  # 16 frames x 9 tokens + the newline = 145 visual tokens: 18 windows of 8
SMALL_WINDOWS = WindowQuantConfig(window_size=8)


@pytest.fixture(scope="module")
def model(llava_converted):
  return wq_jax.load(llava_converted.folder)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
  folder = tmp_path_factory.mktemp("videos")
  paths = []
  for seed in range(4):
    frames = video_io.synthetic_frames(FRAMES, 64, 80, seed=seed)
    paths.append(str(video_io.write_test_video(folder / f"clip{seed}.mp4", frames)))
  return paths


def hf_greedy(hf_model, inputs, steps):
  with torch.no_grad():
    out = hf_model.generate(**{k: torch.from_numpy(v) for k, v in inputs.items()}, max_new_tokens=steps,
                            do_sample=False)
  return out[0, inputs["input_ids"].shape[1]:].numpy()


def test_fp16_greedy_tokens_equal_transformers_generate(model, videos, llava_hf):
  inputs = wq_jax.preprocess(model, videos[0], PROMPT, num_frames=FRAMES)
  want = hf_greedy(llava_hf.model, inputs, 16)
  got = wq_jax.generate(model, videos[0], PROMPT, method="fp16", num_frames=FRAMES, max_new_tokens=16)
  np.testing.assert_array_equal(got.token_ids, want[: len(got.token_ids)])
  assert len(got.token_ids) == 16 or want[len(got.token_ids)] == model.tokenizer.eos_token_id


def test_windowquant_fixes_window_zero_and_saves_bytes(model, videos):
  fp16 = wq_jax.generate(model, videos[1], PROMPT, method="fp16", num_frames=FRAMES, max_new_tokens=4)
  wq = wq_jax.generate(model, videos[1], PROMPT, method="windowquant", config=SMALL_WINDOWS, num_frames=FRAMES,
                       max_new_tokens=4)
  assert wq.bit_plan.shape == (2, 145 // 8)
  assert np.all(wq.bit_plan[:, 0] == 16)
  assert (wq.bit_plan < 16).any(), "the tiny model's plan should quantize something"
  assert wq.kv_cache_bytes < fp16.kv_cache_bytes
  assert set(wq.timings) >= {"prefill_s", "search_s", "quantize_s", "decode_s", "tokens_per_s"}


def test_reorder_false_generates_the_same_tokens(model, videos):
  common = dict(method="windowquant", num_frames=FRAMES, max_new_tokens=12)
  a = wq_jax.generate(model, videos[2], PROMPT, config=SMALL_WINDOWS, **common)
  b = wq_jax.generate(model, videos[2], PROMPT, config=WindowQuantConfig(window_size=8, reorder=False), **common)
  np.testing.assert_array_equal(a.bit_plan, b.bit_plan)
  np.testing.assert_array_equal(a.token_ids, b.token_ids)


@pytest.mark.parametrize("method", ["fp16", "rtn4", "kivi2"])
def test_each_request_of_a_batch_generates_what_it_generates_alone(model, videos, method):
  prompts = [PROMPT, "Describe the video in detail, please, with every person and animal.", "Why?"]
  kw = dict(method=method, num_frames=FRAMES, max_new_tokens=10, return_logits=True)
  batch = wq_jax.generate(model, videos[:3], prompts, **kw)
  for i in range(3):
    alone = wq_jax.generate(model, videos[i], prompts[i], **kw)
    if method == "fp16":
      np.testing.assert_array_equal(batch.token_ids[i], alone.token_ids)
    else:  # the batch shares one plan, so only the first (prefill) token must agree
      assert batch.token_ids[i][0] == alone.token_ids[0]
    np.testing.assert_allclose(batch.logits[i, 0], alone.logits[0, 0], rtol=1e-4, atol=1e-4)


def test_logits_are_returned_per_step(model, videos):
  g = wq_jax.generate(model, videos[0], PROMPT, method="fp16", num_frames=FRAMES, max_new_tokens=5,
                      return_logits=True)
  assert g.logits.shape[:2] == (1, len(g.token_ids)) and g.logits.shape[2] == model.config.text.vocab_size
  np.testing.assert_array_equal(g.logits[0].argmax(-1), g.token_ids)


def test_decode_loop_stops_after_the_token_that_ends_the_last_request(model, videos):
  """A step a call, and 5 a call in a loop on the device (11 steps: the last call makes 1)."""
  frames = generate_module.load_frames([videos[3]], FRAMES)
  prefilled = generate_module.prefill_requests(model, frames, [PROMPT], max_new_tokens=12)
  spec, config = generate_module.methods.resolve("rtn4", None)
  built = generate_module.plan_and_build(prefilled, spec, config, max_new_tokens=12)
  call = lambda eos, per_call: generate_module.decode_call(
      model, built.cache, prefilled.first_logits, prefilled.next_positions, steps=12, eos_ids=eos,
      steps_per_call=per_call)
  free, made, _ = call([-1], 1)()
  assert int(made) == 12
  free = np.asarray(free)[0]
  eos = int(free[5])
  ended = int(np.argmax(free == eos)) + 1
  for per_call in (1, 5):
    tokens, made, _ = call([eos], per_call)()
    assert int(made) == ended
    np.testing.assert_array_equal(np.asarray(tokens)[0, :ended], free[:ended])
    assert not np.asarray(tokens)[0, ended:].any()
  np.testing.assert_array_equal(np.asarray(call([-1], 5)()[0])[0], free)


def test_each_step_donates_the_loop_state(model, videos):
  frames = generate_module.load_frames([videos[3]], FRAMES)
  prefilled = generate_module.prefill_requests(model, frames, [PROMPT], max_new_tokens=4)
  spec, config = generate_module.methods.resolve("rtn2", None)
  built = generate_module.plan_and_build(prefilled, spec, config, max_new_tokens=4)
  call = generate_module.decode_call(model, built.cache, prefilled.first_logits, prefilled.next_positions,
                                     steps=4, eos_ids=[-1])
  params, cache, first_logits, next_positions, eos_ids, key, temperature, top_p = call.arrays
  state = generate_module._first_state(first_logits, (cache.rest_k, cache.rest_v, cache.rest_len), eos_ids, key,
                                       temperature, top_p, greedy=True, steps=4)
  loop = call.compile()
  after, _ = loop.step(params, cache, state, eos_ids, next_positions, temperature, top_p)
  assert all(x.is_deleted() for x in jax.tree.leaves(state))  # the step ran in the same buffers
  assert not cache.rest_k.is_deleted()  # the caller's cache is copied into the state, not donated
  assert int(after.index) == 2 and int(after.count) == 4


def test_xla_options_compile_the_step_and_bad_ones_are_refused_first(model, videos, monkeypatch):
  kw = dict(method="rtn2", num_frames=FRAMES, max_new_tokens=4)
  seen = []
  jit = jax.jit
  recording = lambda *a, **k: seen.append(k.get("compiler_options")) or jit(*a, **k)
  monkeypatch.setattr(generate_module.jax, "jit", recording)
  generate_module._jitted.cache_clear()
  plain = wq_jax.generate(model, videos[1], PROMPT, xla_options={}, **kw)  # XLA's own defaults
  assert seen == [None]
  concurrent = wq_jax.generate(model, videos[1], PROMPT, **kw)  # the library's: DEFAULT_XLA_OPTIONS
  generate_module._jitted.cache_clear()
  assert generate_module.DEFAULT_XLA_OPTIONS == generate_module.CONCURRENT_KERNELS
  assert seen[-1] == generate_module.CONCURRENT_KERNELS  # the step's jit carries them (a CPU ignores this one)
  np.testing.assert_array_equal(concurrent.token_ids, plain.token_ids)
  prefills = []
  monkeypatch.setattr(generate_module, "prefill_requests", lambda *a, **k: prefills.append(1))
  with pytest.raises(Exception, match="xla_gpu_command_buffer_scheduling_mode"):
    wq_jax.generate(model, videos[1], PROMPT, xla_options={"xla_gpu_command_buffer_scheduling_mode": "SOMETIMES"},
                    **kw)
  assert not prefills  # refused before any work


class CompileCounter(logging.Handler):
  def __init__(self):
    super().__init__()
    self.count = 0

  def emit(self, record):
    if record.getMessage().startswith("Compiling"):
      self.count += 1


def test_new_requests_of_one_video_length_barely_compile(model, videos):
  prompts = ["What is the person doing?", "Where does the scene take place?", "How many people appear?",
             "Is there a dog in the video?", "What colour is the moving square?"]
  kw = dict(method="windowquant", config=SMALL_WINDOWS, num_frames=FRAMES, max_new_tokens=6)
  wq_jax.generate(model, videos[0], PROMPT, **kw)
  counter = CompileCounter()
  logger = logging.getLogger("jax")
  logger.addHandler(counter)
  try:
    with jax.log_compiles(True):
      for i, prompt in enumerate(prompts):
        wq_jax.generate(model, videos[(i + 1) % 4], prompt, **kw)
  finally:
    logger.removeHandler(counter)
  assert counter.count <= 6


def test_missing_and_unreadable_videos_are_named(model, tmp_path):
  missing = tmp_path / "nope.mp4"
  with pytest.raises(FileNotFoundError, match="nope.mp4"):
    wq_jax.generate(model, str(missing), PROMPT)
  junk = tmp_path / "junk.mp4"
  junk.write_bytes(b"this is not a video" * 10)
  with pytest.raises(video_io.VideoDecodeError, match="junk.mp4"):
    wq_jax.generate(model, str(junk), PROMPT)


def test_empty_prompt_is_refused(model, videos):
  with pytest.raises(ValueError, match="prompt is empty"):
    wq_jax.generate(model, videos[0], "   ")


def test_too_long_for_the_context(model, videos, monkeypatch):
  monkeypatch.setitem(model.hf_config["text_config"], "max_position_embeddings", 100)
  with pytest.raises(ValueError, match="context is 100 tokens"):
    wq_jax.generate(model, videos[0], PROMPT, num_frames=FRAMES)


def test_not_enough_device_memory_is_said_up_front(model, videos, monkeypatch):
  monkeypatch.setattr(generate_module, "_device_free_bytes", lambda: 1000)
  called = []
  monkeypatch.setattr(generate_module, "_prefill", lambda *a, **k: called.append(1))
  with pytest.raises(generate_module.DeviceMemoryError, match="GiB"):
    wq_jax.generate(model, videos[0], PROMPT, num_frames=FRAMES)
  assert not called


def test_a_folder_that_is_not_a_converted_checkpoint(tmp_path):
  with pytest.raises(Exception, match="not a converted checkpoint"):
    wq_jax.load(tmp_path)


@pytest.mark.parametrize("method,config", [("fp16", None), ("rtn2", None), ("kivi2", None),
                                           ("windowquant", SMALL_WINDOWS)])
def test_pallas_attention_generates_what_xla_generates(model, videos, method, config):
  kw = dict(method=method, config=config, num_frames=FRAMES, max_new_tokens=6, return_logits=True)
  xla = wq_jax.generate(model, videos[3], PROMPT, attention="xla", **kw)
  pallas = wq_jax.generate(model, videos[3], PROMPT, attention="pallas", **kw)  # interpret mode on CPU
  np.testing.assert_array_equal(xla.token_ids, pallas.token_ids)
  # The kernel dequantizes INT4/INT2 windows into halves (2^-11 relative, far below a quantization
  # step); 16-bit windows and the rest segment stay in the cache's dtype (float32 here).
  tol = 1e-4 if method == "fp16" else 2e-3
  np.testing.assert_allclose(xla.logits, pallas.logits, rtol=tol, atol=tol)


def test_fused_norms_generate_what_xla_norms_generate(model, videos):
  """generate(norms="pallas"): each residual add and RMS norm of the decode step in one Pallas launch."""
  kw = dict(method="windowquant", config=SMALL_WINDOWS, num_frames=FRAMES, max_new_tokens=6, return_logits=True)
  plain = wq_jax.generate(model, videos[3], PROMPT, **kw)
  fused = wq_jax.generate(model, videos[3], PROMPT, norms="pallas", **kw)  # interpret mode on CPU
  np.testing.assert_array_equal(plain.token_ids, fused.token_ids)
  np.testing.assert_allclose(plain.logits, fused.logits, rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="norms"):
    wq_jax.generate(model, videos[3], PROMPT, norms="triton", **kw)


def test_unreordered_cache_under_pallas_generates_what_xla_generates(model, videos):
  """Ablation C (reorder=False) in a bf16 model's decode loop: the paged kernel (interpret mode, its rest segment
  appended to and read in place) against XLA's reader of the same cache."""
  bf16 = model.replace(params=jax.tree.map(
      lambda x: x.astype(jax.numpy.bfloat16) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x,
      model.params), dtype="bfloat16")
  kw = dict(method="windowquant", config=WindowQuantConfig(window_size=8, reorder=False), num_frames=FRAMES,
            max_new_tokens=6, return_logits=True)
  xla = wq_jax.generate(bf16, videos[1], PROMPT, attention="xla", **kw)
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message=".*paged kernel cannot read")  # no fallback to XLA's reader
    pallas = wq_jax.generate(bf16, videos[1], PROMPT, attention="pallas", **kw)
  assert (xla.bit_plan < 16).any() and (xla.bit_plan == 16).any()
  # Step i's logits follow tokens 0 .. i-1: compare every step whose prefix the two loops share. In bf16 a
  # near-tie may flip a greedy token (XLA's CPU reductions are not bit-reproducible across runs): then the tie
  # must be one (top two logits within the tolerance), and the paths part there.
  tokens_x, tokens_p = np.ravel(xla.token_ids), np.ravel(pallas.token_ids)
  logits_x = np.asarray(xla.logits).reshape(len(tokens_x), -1)
  logits_p = np.asarray(pallas.logits).reshape(len(tokens_p), -1)
  shared = int(np.cumprod(tokens_x == tokens_p).sum())  # leading tokens equal
  assert shared >= 1, (tokens_x, tokens_p)  # the prefill's token: then at least one decode step is compared
  compared = min(shared + 1, len(tokens_x))
  # 0.02 apart at most where the logits reach 3.4 (CPU, interpret mode)
  np.testing.assert_allclose(logits_x[:compared], logits_p[:compared], rtol=0.05, atol=0.05)
  if shared < len(tokens_x):  # XLA's greedy token and the kernel's within the tolerance of each other there
    assert logits_x[shared].max() - logits_x[shared][tokens_p[shared]] < 0.1, (shared, tokens_x, tokens_p)
