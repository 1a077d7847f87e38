"""`generate`: WindowQuant inference from a video and a prompt, end to end (SPEC §2-3).

    frames -> vision tower -> full-precision prefill (first token, K/V, layer sensitivities)
           -> window search -> one jitted reorder + quantize of the visual K/V
           -> a decode loop over the cache: one jitted step a token, stopping at EOS

Only visual tokens are quantized; the first token comes from the prefill and is
not recomputed. Every method runs through this one path, in three stages that
`generate` composes and benchmarks call apart: `prefill_requests` (the checks,
vision tower and prefill), `plan_and_build` (one method's plan and cache
from the prefill) and `decode_call` (the decode loop). A batch shares one
plan (majority vote) and is padded on the right; the prompt length is padded
to a bucket and plans fall into shape buckets, so new requests of one video
length rarely compile anything.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from models import family as family_lib
from models import qwen2
from wq_jax import attention as attention_lib
from wq_jax import methods, parallel, search
from wq_jax.api import Model, as_batch, load_frames
from wq_jax.buckets import round_up

SEQ_ALIGN = 64  # prompts are padded to a multiple of this, so similar prompts share compilations


class DeviceMemoryError(MemoryError):
  """The request's prefill and cache would not fit the device's free memory."""


@dataclasses.dataclass
class Generation:
  """What `generate` returns. For a batch, `text` and `token_ids` are lists (one per request)."""
  text: str | list[str]
  token_ids: np.ndarray | list[np.ndarray]
  bit_plan: np.ndarray  # int32 [layers, windows], original window order
  kv_cache_bytes: int  # device bytes of the cache actually held
  timings: dict[str, float]  # prefill_s, search_s, quantize_s, decode_s, tokens_per_s
  logits: np.ndarray | None = None  # [B, steps, V] float32, when asked
  method: str = ""
  window_scores: np.ndarray | None = None  # float32 [B, windows]: each window's similarity (Eq. 8)
  fp16_cache_bytes: int = 0  # what the same cache takes with every window in high precision

  def bits_per_layer(self) -> list[dict[int, int]]:
    return [{b: int((row == b).sum()) for b in (16, 4, 2)} for row in self.bit_plan]


def generate(params: Model, video, prompt, *, method: str = "windowquant", config=None,
             num_frames: int | None = None, max_new_tokens: int = 64, attention: str = "xla",
             norms: str = "xla", return_logits: bool = False, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, mesh=None, xla_options: dict | None = None) -> Generation:
  """Answers `prompt` about `video` (a path, uint8 [T, H, W, 3], or a list of frames).

  A list of videos with a list of prompts is one batch. `method` is a name from
  `wq_jax.methods.METHODS`, `config` its config (e.g. `WindowQuantConfig`);
  `attention` a decode-attention implementation ("xla" or "pallas"); `norms`
  "pallas" fuses each residual add with the RMS norm after it in the decode
  step (`pallas_kernels.residual_norm`; not with a mesh; slower than XLA's on
  an H200, session 26). With a
  `mesh` (`wq_jax.parallel.data_mesh()`), the batch is split across its 'data'
  axis (padded with copies of the last request, whose results are dropped);
  place the weights once with `wq_jax.parallel.replicate(model, mesh)`.
  `xla_options`: XLA options of the decode step's compilation; None takes
  `DEFAULT_XLA_OPTIONS` (`CONCURRENT_KERNELS`: a layer's attention launches
  side by side on the GPU), `{}` none of them.
  """
  model = params
  if not isinstance(model, Model):
    raise TypeError("generate takes the Model that wq_jax.load(path) returns")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
  _check_norms(norms, mesh)  # before the prefill, not after it
  _check_xla_options(_resolved(xla_options))
  videos, prompts = as_batch(video, prompt)
  videos, prompts, real = parallel.pad_requests(videos, prompts, parallel.data_size(mesh))
  spec, config = methods.resolve(method, config)
  frames = load_frames(videos, num_frames)
  prefilled = prefill_requests(model, frames, prompts, max_new_tokens=max_new_tokens, real=real, mesh=mesh)
  built = plan_and_build(prefilled, spec, config, max_new_tokens=max_new_tokens)
  timings = {"prefill_s": prefilled.prefill_s, "search_s": built.search_s, "quantize_s": built.quantize_s}
  first_logits, next_positions = prefilled.first_logits, prefilled.next_positions
  del prefilled  # the full-precision K/V: decode reads the cache alone

  eos = _eos_ids(model)
  start = time.perf_counter()
  tokens, count, step_logits = decode_call(
      model, built.cache, first_logits, next_positions, steps=max_new_tokens, eos_ids=eos, attention=attention,
      norms=norms, mesh=mesh, seed=seed, temperature=temperature, top_p=top_p, return_logits=return_logits,
      xla_options=xla_options)()
  tokens = np.asarray(tokens)[:real]
  timings["decode_s"] = time.perf_counter() - start
  count = int(count)
  tokens = tokens[:, :count]
  rows = [_until_eos(row, eos) for row in tokens]
  timings["tokens_per_s"] = sum(len(r) for r in rows) / max(timings["decode_s"], 1e-9)
  texts = [model.tokenizer.decode(r, skip_special_tokens=True) for r in rows]
  single = not isinstance(prompt, (list, tuple))
  return Generation(
      text=texts[0] if single else texts, token_ids=rows[0] if single else rows,
      bit_plan=built.plan, kv_cache_bytes=built.cache.nbytes, timings=timings,
      logits=np.asarray(step_logits)[:real, :count] if return_logits else None, method=method,
      window_scores=built.scores, fp16_cache_bytes=high_precision_bytes(built.cache))


# ----------------------------------------------------------------------------- the three stages of generate


@dataclasses.dataclass
class Prefilled:
  """A batch after its full-precision prefill: what every method plans and builds its cache from."""
  keys: jax.Array  # [L, B, K, T, H] post-RoPE, head-major
  values: jax.Array
  first_logits: jax.Array  # [B, V] float32 at each request's last token
  sensitivity: jax.Array  # [L, B] (Eq. 9)
  embeds: jax.Array  # [B, T, D]: the window scores read the visual and prompt rows
  attention_mask: jax.Array  # [B, T]
  next_positions: jax.Array  # [B]: the RoPE position of the first generated token
  visual_start: int
  num_visual: int
  seq_lens: list[int]
  real: int  # requests that are not mesh padding (they alone vote on the plan)
  prefill_s: float


@dataclasses.dataclass
class BuiltCache:
  """One method's cache of a prefilled batch, and the plan it stores."""
  cache: object  # KVCache, or the interleaved cache of ablation C
  plan: np.ndarray  # int32 [L, W], original window order
  scores: np.ndarray  # float32 [real, W] window similarities (Eq. 8)
  search_s: float
  quantize_s: float


def prefill_requests(model: Model, frames: list[np.ndarray], prompts: list[str], *, max_new_tokens: int,
                     real: int | None = None, mesh=None) -> Prefilled:
  """Vision tower and full-precision prefill of a batch, after the context and memory checks."""
  if len({f.shape[0] for f in frames}) > 1:
    raise ValueError("a batch needs videos of the same number of frames: pass num_frames")
  from models.inputs import INPUT_BUILDERS
  tokenizer = model.tokenizer
  inputs = INPUT_BUILDERS[model.model_type](model.config, tokenizer, model.processor_config, frames, prompts)
  seq_lens = inputs["attention_mask"].sum(axis=1).astype(int)
  _check_context(model, int(seq_lens.max()), max_new_tokens)
  _check_memory(model, batch=len(prompts), tokens=round_up(int(seq_lens.max()), SEQ_ALIGN) + max_new_tokens)
  inputs = pad_sequence(inputs, round_up(inputs["input_ids"].shape[1], SEQ_ALIGN), _pad_id(tokenizer))
  if mesh is not None:
    inputs = parallel.shard_inputs(inputs, mesh, len(prompts))

  cfg = model.config
  start = time.perf_counter()
  embedded = model.family.embed_inputs(model.params, cfg, inputs)
  if mesh is not None:  # the requests' embeddings, positions and masks split along 'data'
    embedded = parallel.shard_batch_axis(embedded, mesh, axes={"positions": embedded.positions.ndim - 2})
  pre = _prefill(model.params["decoder"], cfg.text, embedded.embeds, embedded.positions, embedded.attention_mask,
                 implementation=_prefill_attention(model))
  jax.block_until_ready(pre.logits)
  prefill_s = time.perf_counter() - start
  visual_start, num_visual = visual_block(np.asarray(embedded.visual_mask), seq_lens)
  return Prefilled(
      keys=pre.keys, values=pre.values, first_logits=pre.logits, sensitivity=pre.sensitivity,
      embeds=embedded.embeds, attention_mask=embedded.attention_mask,
      next_positions=_next_positions(embedded.positions, embedded.attention_mask), visual_start=visual_start,
      num_visual=num_visual, seq_lens=seq_lens.tolist(), real=len(prompts) if real is None else real,
      prefill_s=prefill_s)


def plan_and_build(prefilled: Prefilled, spec: methods.Method, config, *, max_new_tokens: int) -> BuiltCache:
  """A method's plan (one for the batch) and its cache, built from the prefill's K/V."""
  options = spec.cache_options(config)
  p = prefilled
  start = time.perf_counter()
  scores, sensitivity = _search_inputs(p.embeds, p.attention_mask, p.sensitivity, visual_start=p.visual_start,
                                       num_visual=p.num_visual, window_size=options.window_size)
  # Rows added to fill the mesh do not vote: the plan is the real requests' (scores [B, W], sensitivity [L, B]).
  scores = np.asarray(scores)[:p.real]
  plan = spec.plan(config, methods.PlanInputs(scores, np.asarray(sensitivity)[:, :p.real].mean(1),
                                              p.keys.shape[0], p.visual_start, p.num_visual, p.seq_lens[:p.real]))
  search_s = time.perf_counter() - start

  start = time.perf_counter()
  cache = methods.build_method_cache(options, p.keys, p.values, plan, visual_start=p.visual_start,
                                     num_visual=p.num_visual, seq_lens=p.seq_lens, max_new_tokens=max_new_tokens)
  cache = jax.block_until_ready(cache)
  return BuiltCache(cache, np.asarray(plan, np.int32), scores, search_s, time.perf_counter() - start)


class LoopState(NamedTuple):
  """What one decode step hands the next, all on the device and donated from step to step, so that every
  step runs on the same buffers (a CUDA graph whose buffer addresses change is updated on the host first)."""
  rest: tuple  # (rest_k, rest_v, rest_len): the segment where each new token's K/V go
  tokens: jax.Array  # [B, steps] int32: tokens made so far (token 0 from the prefill)
  index: jax.Array  # int32: the token this step makes
  done: jax.Array  # [B] bool: the request has emitted an end-of-sequence token
  count: jax.Array  # int32: tokens up to the first step after which every request was done (else steps)
  key: jax.Array  # the sampling key


@functools.partial(jax.jit, static_argnames=("greedy", "steps"))
def _first_state(first_logits, rest, eos_ids, key, temperature, top_p, *, greedy, steps):
  """The loop's state after the first token (from the prefill's logits); the rest segment is copied, so the
  caller's cache stays intact when the steps donate theirs."""
  key, sub = jax.random.split(key)
  first = _pick(first_logits, sub, temperature, top_p, greedy)
  done = jnp.isin(first, eos_ids)
  tokens = jnp.zeros((first.shape[0], steps), jnp.int32).at[:, 0].set(first)
  count = jnp.where(jnp.all(done), 1, steps).astype(jnp.int32)
  return LoopState(jax.tree.map(jnp.copy, rest), tokens, jnp.int32(1), done, count, key)


def _all_done(done: jax.Array) -> jax.Array:
  """Whether every request has ended, its copy to the host started (read a few steps later)."""
  flag = jnp.all(done)
  flag.copy_to_host_async()
  return flag


def _step(params, cache, state: LoopState, eos_ids, next_positions, temperature, top_p, *, cfg, implementation,
          greedy, norms="xla", return_logits=False):
  """Token `state.index` of every request from the one before: (the next state, its logits or None).

  Only the state is an output: the pools are read-only, so they are neither copied nor donated.
  """
  i = state.index
  rest_k, rest_v, rest_len = state.rest
  cache = cache.replace(rest_k=rest_k, rest_v=rest_v, rest_len=rest_len)
  prev = jax.lax.dynamic_index_in_dim(state.tokens, i - 1, axis=1, keepdims=False)
  pos = next_positions + i - 1
  if cfg.mrope_section is not None:
    pos = jnp.broadcast_to(pos, (3, prev.shape[0]))
  logits, cache = qwen2.decode_step(params, cfg, prev, pos, cache, implementation=implementation, norms=norms)
  key, sub = jax.random.split(state.key)
  nxt = jnp.where(state.done, prev, _pick(logits, sub, temperature, top_p, greedy))
  done = state.done | jnp.isin(nxt, eos_ids)
  count = jnp.where((state.count == state.tokens.shape[1]) & jnp.all(done), i + 1, state.count)
  tokens = jax.lax.dynamic_update_index_in_dim(state.tokens, nxt, i, axis=1)
  state = LoopState((cache.rest_k, cache.rest_v, cache.rest_len), tokens, i + 1, done, count, key)
  return state, (logits if return_logits else None)


def _steps(params, cache, state: LoopState, eos_ids, next_positions, temperature, top_p, *, per_call: int,
           **options):
  """Up to `per_call` steps in one call, a loop on the device that stops at the last token or once every
  request has ended: (the next state, None)."""
  limit = jnp.minimum(state.index + per_call, state.tokens.shape[1])
  going = lambda s: (s.index < limit) & ~jnp.all(s.done)
  body = lambda s: _step(params, cache, s, eos_ids, next_positions, temperature, top_p, **options)[0]
  return jax.lax.while_loop(going, body, state), None


# One jitted step a token, called from Python: inside a `lax.while_loop` the same step took 4.8 ms
# longer on an H200 (7B, batch 1; benchmarks/results/decode_step_parts_b1_t64_whileloop_gpu.md: XLA ran the
# loop's body kernel by kernel, not as a CUDA graph), and the loop's state copied the whole cache. The state
# is donated from step to step. `_jitted(True)` (`steps_per_call` > 1) is that device loop again, the cache
# outside its state, for benchmarks to time under XLA's options for graphs of loops.
_STEP_STATICS = ("cfg", "implementation", "greedy", "norms", "return_logits")

# XLA options for the decode step (`decode_call(xla_options=...)`, `generate(xla_options=...)`): the CUDA graph
# scheduled by data conflicts, so that a layer's pool launches (16-bit windows in Triton, INT2 and INT4 pools in
# Mosaic GPU), which read different pools and write different partials, run side by side: the INT2 kernel is
# bound by its instructions, the 16-bit one by HBM. On an H200 (session 31, same runs): attention at batch 60 x
# 32k 530 -> 477 µs, the 7B step at 32 x 100 7.76 -> 7.56 ms. On an H100 (session 32) the step's greedy tokens
# under it were the serial graph's, all of them (fp16 and windowquant at 32 x 100), in 8.99 ms against 9.11
# (`decode_throughput_*_s32_step_h100.md`): the default since. Independent launches in any order compute the same
# numbers; a CPU ignores the option.
CONCURRENT_KERNELS = {"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}
DEFAULT_XLA_OPTIONS = CONCURRENT_KERNELS  # where generate or decode_call is given xla_options=None


@functools.lru_cache(maxsize=None)
def _jitted(loop_on_device: bool, options: tuple = ()):
  """The jitted step (or steps a call), with XLA `options` as sorted (name, value) pairs; one jit each, so
  that jit's own cache keeps their compilations."""
  function, statics = (_steps, (*_STEP_STATICS, "per_call")) if loop_on_device else (_step, _STEP_STATICS)
  return jax.jit(function, static_argnames=statics, donate_argnums=(2,), compiler_options=dict(options) or None)


def _option_items(options: dict | None) -> tuple:
  return tuple(sorted((options or {}).items()))


_EOS_CHECK_EVERY = 8  # steps between the flags "every request has ended" the host reads
# Steps dispatched after a flag's before the host reads it: a read of the newest state would wait for the GPU to
# finish every step it was sent, and it would idle while the host sent the next (session 28's profile).
_EOS_CHECK_LAG = 2


class DecodeLoop:
  """The decode loop over compiled steps: `loop(*arrays)` -> (tokens [B, steps], count, logits)."""

  def __init__(self, static: dict, step=None):
    self.static = static
    self._step = step or functools.partial(self.jitted_step, **self.step_options)

  @property
  def per_call(self) -> int:
    """Steps a call of the compiled step makes (a loop on the device where more than 1)."""
    return self.static.get("steps_per_call", 1)

  @property
  def jitted_step(self):
    return _jitted(self.per_call > 1, _option_items(self.static.get("xla_options")))

  @property
  def step_options(self) -> dict:
    s = self.static
    options = {"cfg": s["cfg"], "implementation": s["implementation"], "greedy": s["greedy"], "norms": s["norms"],
               "return_logits": s["return_logits"]}
    return options if self.per_call == 1 else dict(options, per_call=self.per_call)

  def __call__(self, params, cache, first_logits, next_positions, eos_ids, key, temperature, top_p):
    steps, return_logits = self.static["steps"], self.static["return_logits"]
    state = _first_state(first_logits, (cache.rest_k, cache.rest_v, cache.rest_len), eos_ids, key, temperature,
                         top_p, greedy=self.static["greedy"], steps=steps)
    logits = [first_logits]
    flags = [(0, _all_done(state.done))]  # (token, whether every request had ended by it), copied as they come
    i = 1  # the next token
    while i < steps:
      if flags and i - 1 - flags[0][0] >= _EOS_CHECK_LAG and bool(flags.pop(0)[1]):
        break
      state, step_logits = self._step(params, cache, state, eos_ids, next_positions, temperature, top_p)
      if return_logits:
        logits.append(step_logits)
      made = min(self.per_call, steps - i)
      if (i + made - 1) // _EOS_CHECK_EVERY > (i - 1) // _EOS_CHECK_EVERY:
        flags.append((i + made - 1, _all_done(state.done)))
      i += made
    count = int(state.count)  # tokens up to the first that ended the last request (the loop may run past it)
    token_array = jnp.where(jnp.arange(steps) < count, state.tokens, 0)
    b, v = first_logits.shape
    if return_logits:
      logit_array = jnp.zeros((b, steps, v), jnp.float32).at[:, :count].set(jnp.stack(logits[:count], axis=1))
    else:
      logit_array = jnp.zeros((b, 1, v), jnp.float32)
    return token_array, jnp.int32(count), logit_array

  @property
  def step(self):
    """The compiled step the loop calls once a token."""
    return self._step

  def memory_analysis(self):
    return getattr(self._step, "memory_analysis", lambda: None)()


class DecodeCall(NamedTuple):
  """One call of the decode loop: its array arguments, and the static ones that pick its compilation."""
  arrays: tuple
  static: dict

  def __call__(self):
    """Tokens [B, steps] (the first from the prefill logits), how many were made, and their logits."""
    return DecodeLoop(self.static)(*self.arrays)

  def compile(self, compiler_options: dict | None = None, donate_state: bool = True):
    """The loop over a step compiled ahead of time (`loop(*self.arrays)` runs it); arrays may be abstract.

    `compiler_options` are XLA debug options for this compilation only (the names XLA_FLAGS takes, without
    the dashes), so that one process can time the same loop under two settings. `donate_state=False` gives
    every step new output buffers (benchmarks time what the donation saves).
    """
    params, cache, first_logits, next_positions, eos_ids, key, temperature, top_p = self.arrays
    state = jax.eval_shape(functools.partial(_first_state, greedy=self.static["greedy"], steps=self.static["steps"]),
                           first_logits, (cache.rest_k, cache.rest_v, cache.rest_len), eos_ids, key, temperature,
                           top_p)
    args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        (params, cache, state, eos_ids, next_positions, temperature, top_p))
    loop = DecodeLoop(self.static)
    function = _step if loop.per_call == 1 else _steps
    step = jax.jit(function, static_argnames=tuple(loop.step_options), donate_argnums=(2,) if donate_state else ())
    options = {**(self.static.get("xla_options") or {}), **(compiler_options or {})}
    compiled = step.lower(*args, **loop.step_options).compile(compiler_options=options or None)
    return DecodeLoop(self.static, step=compiled)


def _check_norms(norms: str, mesh) -> None:
  if norms not in ("xla", "pallas"):
    raise ValueError(f"norms is 'xla' or 'pallas', got {norms!r}")
  if norms == "pallas" and mesh is not None:  # a pallas_call is not partitioned by XLA: it would gather the batch
    raise ValueError("norms='pallas' runs on one device: not with a mesh")


def decode_call(model: Model, cache, first_logits, next_positions, *, steps: int, eos_ids, attention: str = "xla",
                norms: str = "xla", mesh=None, seed: int = 0, temperature: float = 0.0, top_p: float = 1.0,
                return_logits: bool = False, steps_per_call: int = 1, xla_options: dict | None = None) -> DecodeCall:
  """`steps` tokens a request from the cache, stopping early once every request has emitted one of `eos_ids`.

  `xla_options`: XLA options of the step's compilation, checked here by name; None takes `DEFAULT_XLA_OPTIONS`,
  `{}` none (XLA's own defaults).

  `steps_per_call` > 1 makes that many steps a call of the compiled step, in a loop on the device (for
  benchmarks: with command buffers XLA's defaults leave out of loops, it ran slower than a call a step).
  """
  _check_norms(norms, mesh)
  if steps_per_call < 1 or (steps_per_call > 1 and return_logits):
    raise ValueError(f"steps_per_call must be at least 1, and 1 with return_logits; got {steps_per_call}")
  arrays = (model.params["decoder"], cache, first_logits, next_positions, jnp.asarray(eos_ids),
            jax.random.PRNGKey(seed), jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p))
  static = {"cfg": model.config.text, "steps": steps, "implementation": _attention_for(attention, mesh),
            "return_logits": return_logits, "greedy": temperature <= 0, "norms": norms,
            "steps_per_call": steps_per_call, "xla_options": _resolved(xla_options)}
  _check_xla_options(static["xla_options"])
  return DecodeCall(arrays, static)


def _resolved(options: dict | None) -> dict:
  return dict(DEFAULT_XLA_OPTIONS if options is None else options)


def _check_xla_options(options: dict | None) -> None:
  """XLA refuses an unknown option's name or value by name (INVALID_ARGUMENT): here, not at the first step."""
  if options:
    _compile_with(_option_items(options))


@functools.lru_cache(maxsize=None)
def _compile_with(options: tuple) -> None:  # once an option set: generate and decode_call both check
  jax.jit(lambda x: x).lower(jnp.int32(0)).compile(compiler_options=dict(options))


def high_precision_bytes(cache) -> int:
  """Bytes of the same cache with every window kept in the model's dtype (no bucket padding)."""
  rest = cache.rest_k
  _, b, k, _, h = rest.shape
  windows = int(np.asarray(cache.plan).size) if hasattr(cache, "plan") else int(np.asarray(cache.counts).sum())
  return 2 * (windows * cache.window_size + rest.shape[0] * rest.shape[3]) * b * k * h * rest.dtype.itemsize


# ----------------------------------------------------------------------------- checks


def _check_context(model: Model, tokens: int, max_new_tokens: int) -> None:
  limit = model.max_positions
  if limit is not None and tokens + max_new_tokens > limit:
    raise ValueError(f"the prompt and video take {tokens} tokens and {max_new_tokens} more are asked, "
                     f"but the model's context is {limit} tokens: use fewer frames or a shorter prompt")


def _device_free_bytes() -> int | None:
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  if device.platform == "cpu" and hasattr(os, "sysconf"):
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return None


def estimate_request_bytes(model: Model, *, batch: int, tokens: int) -> int:
  """Device bytes a request needs beyond the weights: the full-precision prefill K/V (which
  the cache is built from), the cache at worst (all high precision), and prefill activations."""
  t = model.config.text
  item = jnp.dtype(model.dtype).itemsize
  kv = 2 * t.num_layers * batch * t.num_kv_heads * tokens * t.head_dim * item
  activations = batch * tokens * (4 * t.hidden_size + 3 * t.intermediate_size) * 4
  return 2 * kv + activations


def _check_memory(model: Model, *, batch: int, tokens: int) -> None:
  need = estimate_request_bytes(model, batch=batch, tokens=tokens)
  free = _device_free_bytes()
  if free is not None and need > free:
    raise DeviceMemoryError(f"this request needs about {need / 2**30:.1f} GiB of device memory "
                            f"(batch {batch}, {tokens} tokens) but {free / 2**30:.1f} GiB are free: "
                            f"use fewer frames or a smaller batch")


# ----------------------------------------------------------------------------- pieces


def pad_sequence(inputs: dict[str, np.ndarray], length: int, pad_id: int) -> dict[str, np.ndarray]:
  """Right-pads the token-axis arrays of transformers-style inputs to `length`."""
  out = dict(inputs)
  extra = length - inputs["input_ids"].shape[1]
  if extra <= 0:
    return out
  for key, fill in (("input_ids", pad_id), ("attention_mask", 0), ("mm_token_type_ids", 0)):
    if key in out:
      out[key] = np.pad(out[key], [(0, 0), (0, extra)], constant_values=fill)
  return out


def _pad_id(tokenizer) -> int:
  return tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id


def _eos_ids(model: Model) -> list[int]:
  ids = {model.tokenizer.eos_token_id}
  gen = model.root / "generation_config.json"
  if gen.is_file():
    import json
    eos = json.loads(gen.read_text()).get("eos_token_id")
    ids |= set(eos if isinstance(eos, list) else [eos])
  return sorted(i for i in ids if i is not None)


def _until_eos(row: np.ndarray, eos: list[int]) -> np.ndarray:
  stops = np.nonzero(np.isin(row, eos))[0]
  return row[: stops[0]] if len(stops) else row


def _attention_for(name: str, mesh):
  """Kernels run per shard on a mesh; the XLA path is partitioned by XLA itself."""
  if mesh is None or name == "xla":
    return name
  return attention_lib.PerShard(name, mesh)


def _prefill_attention(model: Model) -> str | None:
  """cudnn's fused attention on GPU in 16-bit; XLA otherwise."""
  if jax.default_backend() == "gpu" and model.dtype in ("bfloat16", "float16"):
    return "cudnn"
  return None


def visual_block(visual_mask: np.ndarray, seq_lens) -> tuple[int, int]:
  """(start, count) of the visual tokens, which must be one block at one place in every request."""
  blocks = set()
  for row, n in zip(visual_mask, seq_lens):
    where = np.nonzero(row[:n])[0]
    if len(where) == 0:
      raise ValueError("the request holds no visual tokens")
    if where[-1] - where[0] + 1 != len(where):
      raise ValueError("the visual tokens of a request must be one contiguous block")
    blocks.add((int(where[0]), len(where)))
  if len(blocks) != 1:
    raise ValueError(f"requests of a batch must place the same number of visual tokens at the same "
                     f"position; found (start, count) {sorted(blocks)}")
  return blocks.pop()


def _prefill(params, cfg, embeds, positions, mask, *, implementation):
  return family_lib.prefill(params, cfg, embeds, positions, mask, last_only=True, implementation=implementation)


@functools.partial(jax.jit, static_argnames=("visual_start", "num_visual", "window_size"))
def _search_inputs(embeds, attention_mask, sensitivity, *, visual_start, num_visual, window_size):
  """Window scores [B, W] against the text after the video, and the sensitivities [L, B]."""
  visual = jax.lax.slice_in_dim(embeds, visual_start, visual_start + num_visual, axis=1)
  after = jnp.arange(embeds.shape[1])[None, :] >= visual_start + num_visual
  text_mask = attention_mask.astype(bool) & after
  scores = search.window_scores(embeds, visual, window_size, text_mask=text_mask)
  return scores, sensitivity


@jax.jit
def _next_positions(positions, attention_mask):
  """The RoPE position of the first generated token: one past the largest valid position."""
  valid = attention_mask.astype(bool)
  if positions.ndim == 3:  # M-RoPE [3, B, T]
    valid = valid[None]
  largest = jnp.where(valid, positions, -1).max(axis=-1)
  if positions.ndim == 3:
    largest = largest.max(axis=0)
  return (largest + 1).astype(jnp.int32)


def _pick(logits, key, temperature, top_p, greedy: bool):
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  scaled = logits / temperature
  order = jnp.argsort(-scaled, axis=-1)
  sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  keep = jnp.cumsum(probs, axis=-1) - probs < top_p  # the smallest prefix reaching top_p
  choice = jax.random.categorical(key, jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
  return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


