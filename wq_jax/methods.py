"""KV-cache methods, selectable by name; all of them build the same three-pool cache.

A method decides two things: the bit plan int32[L, W] (16, 4 or 2 per layer and
window, original window order) and how the cache stores it (window size,
value grouping, metadata dtype). Everything downstream is shared.

    fp16         every window high precision
    rtn4, rtn2   uniform round-to-nearest, window-sized groups, every window
    kivi4, kivi2 keys per channel over groups of 32 tokens, values per token over
                 groups of 32 channels, the most recent 128 tokens in high precision
    windowquant  the window-level search (SPEC §2) with `WindowQuantConfig`
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np

from wq_jax import search
from wq_jax.cache import build_cache
from wq_jax.interleaved import build_interleaved_cache
from wq_jax.search import HIGH


@dataclasses.dataclass(frozen=True)
class WindowQuantConfig:
  """The paper's knobs, and its ablations: A fix_first_window=False, B random_plan=True, C reorder=False."""
  alpha: float = 2.0
  window_size: int = 32
  fix_first_window: bool = True
  random_plan: bool = False  # B: random bit widths in the searched proportions (seeded)
  reorder: bool = True  # C: False keeps windows in their original order
  seed: int = 0
  meta_dtype: str = "float16"


@dataclasses.dataclass(frozen=True)
class UniformConfig:
  bits: int = 16
  window_size: int = 32
  meta_dtype: str = "float16"


@dataclasses.dataclass(frozen=True)
class KiviConfig:
  bits: int = 2
  group_size: int = 32  # key tokens per group (the window) and value channels per group
  residual_length: int = 128  # the most recent prefill tokens kept in high precision
  meta_dtype: str = "float16"

  @property
  def window_size(self) -> int:
    return self.group_size


class PlanInputs(NamedTuple):
  """What a method may look at to choose its plan (host or device arrays)."""
  scores: np.ndarray  # [B, W] window similarity (Eq. 8)
  sensitivity: np.ndarray  # [L] layer sensitivity (Eq. 9), batch-averaged
  num_layers: int
  visual_start: int
  num_visual: int
  seq_lens: Sequence[int]


class CacheOptions(NamedTuple):
  window_size: int
  value_channel_group: int
  meta_dtype: str
  reorder: bool


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  default_config: object
  plan: Callable[[object, PlanInputs], np.ndarray]
  cache_options: Callable[[object], CacheOptions]


def _num_windows(config, inputs: PlanInputs) -> int:
  return inputs.num_visual // config.window_size


def _uniform_plan(config: UniformConfig, inputs: PlanInputs) -> np.ndarray:
  return np.full((inputs.num_layers, _num_windows(config, inputs)), config.bits, np.int32)


def _kivi_plan(config: KiviConfig, inputs: PlanInputs) -> np.ndarray:
  plan = np.full((inputs.num_layers, _num_windows(config, inputs)), config.bits, np.int32)
  # Windows that reach into the last `residual_length` tokens of the shortest request stay high.
  residual_start = min(inputs.seq_lens) - config.residual_length
  window_ends = inputs.visual_start + config.window_size * (np.arange(plan.shape[1]) + 1)
  plan[:, window_ends > residual_start] = HIGH
  return plan


def _windowquant_plan(config: WindowQuantConfig, inputs: PlanInputs) -> np.ndarray:
  t_low, t_high = search.thresholds(np.asarray(inputs.sensitivity), config.alpha)
  plan = search.plan_bits(np.asarray(inputs.scores), t_low, t_high, fix_first_window=config.fix_first_window)
  if config.random_plan:
    plan = search.random_plan(plan, jax.random.PRNGKey(config.seed), fix_first_window=config.fix_first_window)
  return np.asarray(plan, np.int32)


def _plain_options(config) -> CacheOptions:
  return CacheOptions(config.window_size, 0, config.meta_dtype, True)


METHODS: dict[str, Method] = {
    "fp16": Method("fp16", UniformConfig(bits=16), _uniform_plan, _plain_options),
    "rtn4": Method("rtn4", UniformConfig(bits=4), _uniform_plan, _plain_options),
    "rtn2": Method("rtn2", UniformConfig(bits=2), _uniform_plan, _plain_options),
    "kivi4": Method("kivi4", KiviConfig(bits=4), _kivi_plan,
                    lambda c: CacheOptions(c.group_size, c.group_size, c.meta_dtype, True)),
    "kivi2": Method("kivi2", KiviConfig(bits=2), _kivi_plan,
                    lambda c: CacheOptions(c.group_size, c.group_size, c.meta_dtype, True)),
    "windowquant": Method("windowquant", WindowQuantConfig(), _windowquant_plan,
                          lambda c: CacheOptions(c.window_size, 0, c.meta_dtype, c.reorder)),
}


def get_method(name: str) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; known: {sorted(METHODS)}")
  return METHODS[name]


def resolve(name: str, config=None):
  """The method and its config (the method's default when none is given), type-checked."""
  method = get_method(name)
  config = method.default_config if config is None else config
  if type(config) is not type(method.default_config):
    raise TypeError(f"method {name!r} takes a {type(method.default_config).__name__}, "
                    f"got a {type(config).__name__}")
  return method, config


def build_method_cache(options: CacheOptions, keys, values, plan, *, visual_start: int, num_visual: int,
                       seq_lens: Sequence[int], max_new_tokens: int):
  """The cache a method's options ask for: reordered pools, or ablation C's original order."""
  common = dict(visual_start=visual_start, num_visual=num_visual, seq_lens=seq_lens,
                max_new_tokens=max_new_tokens, window_size=options.window_size, meta_dtype=options.meta_dtype)
  if not options.reorder:
    return build_interleaved_cache(keys, values, plan, **common)
  return build_cache(keys, values, plan, value_channel_group=options.value_channel_group, **common)
