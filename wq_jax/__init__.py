"""WindowQuant in JAX: window-level mixed-precision KV-cache quantization for VLMs.

The public surface; each piece lives in a small module named for its job. The
model-facing entry points (`load`, `preprocess`, `logits`, `generate`) import
`models`, which itself builds on the core modules here, so they load lazily.
"""
import importlib

from wq_jax import attention, cache, methods, quant, search
from wq_jax.attention import decode_attention
from wq_jax.cache import KVCache, build_cache
from wq_jax.methods import KiviConfig, UniformConfig, WindowQuantConfig
from wq_jax.quant import QuantizedTensor, dequantize, quantize

_LAZY = {"Model": "wq_jax.api", "load": "wq_jax.api", "logits": "wq_jax.api", "preprocess": "wq_jax.api",
         "Generation": "wq_jax.generation", "generate": "wq_jax.generation"}

__all__ = [
    "attention", "cache", "methods", "quant", "search",
    "decode_attention", "KVCache", "build_cache",
    "KiviConfig", "UniformConfig", "WindowQuantConfig",
    "QuantizedTensor", "dequantize", "quantize", *_LAZY,
]


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'wq_jax' has no attribute {name!r}")
