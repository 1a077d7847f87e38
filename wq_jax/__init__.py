"""WindowQuant in JAX: window-level mixed-precision KV-cache quantization for VLMs.

The public surface; each piece lives in a small module named for its job.
"""
from wq_jax import attention, cache, methods, quant, search
from wq_jax.attention import decode_attention
from wq_jax.cache import KVCache, build_cache
from wq_jax.methods import KiviConfig, UniformConfig, WindowQuantConfig
from wq_jax.quant import QuantizedTensor, dequantize, quantize

__all__ = [
    "attention", "cache", "methods", "quant", "search",
    "decode_attention", "KVCache", "build_cache",
    "KiviConfig", "UniformConfig", "WindowQuantConfig",
    "QuantizedTensor", "dequantize", "quantize",
]
