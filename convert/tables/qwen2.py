"""Rules for the shared decoder (`models.qwen2`): Qwen2, Llama and Mistral name their tensors alike.

Which biases exist follows the config (`qkv_bias`, `o_bias`), so one table serves them all.
"""
from __future__ import annotations

from convert.framework import Rule
from models.qwen2 import Qwen2Config


def rules(cfg: Qwen2Config, path: str = "decoder", hf: str = "language_model.") -> tuple[Rule, ...]:
  """hf: the canonical prefix of the decoder's tensors; the LM head is `lm_head.weight`."""
  layer = hf + "layers.{l}."
  out = [
      Rule(f"{path}/embed", f"{hf}embed_tokens.weight"),
      Rule(f"{path}/layers/attn_norm", layer + "input_layernorm.weight"),
      Rule(f"{path}/layers/o/w", layer + "self_attn.o_proj.weight", "linear"),
      Rule(f"{path}/layers/mlp_norm", layer + "post_attention_layernorm.weight"),
      Rule(f"{path}/norm", f"{hf}norm.weight"),
  ]
  # q, k and v fill one [D, K, G+2, H] weight (`models.qwen2.param_shapes`): a KV head's G query heads,
  # then its key, then its value. HF's query head n belongs to KV head n // G, so q's [N*H] rows are
  # [K, G, H] in that order.
  g = cfg.num_heads // cfg.num_kv_heads
  for n, (start, stop) in zip("qkv", ((0, g), (g, g + 1), (g + 1, g + 2))):
    out.append(Rule(f"{path}/layers/qkv/w", layer + f"self_attn.{n}_proj.weight", "linear_to_heads",
                    part=(2, start, stop)))
    if cfg.qkv_bias:
      out.append(Rule(f"{path}/layers/qkv/b", layer + f"self_attn.{n}_proj.bias", "split_heads",
                      part=(1, start, stop)))
  if cfg.o_bias:
    out.append(Rule(f"{path}/layers/o/b", layer + "self_attn.o_proj.bias"))
  for n, j in (("gate", 0), ("up", 1)):  # one [D, 2, F] weight
    out.append(Rule(f"{path}/layers/gate_up/w", layer + f"mlp.{n}_proj.weight", "linear_to_heads",
                    part=(1, j, j + 1)))
  out.append(Rule(f"{path}/layers/down/w", layer + "mlp.down_proj.weight", "linear"))
  if not cfg.tie_word_embeddings:
    out.append(Rule(f"{path}/lm_head", "lm_head.weight", "linear"))
  return tuple(out)


def ignore(cfg: Qwen2Config) -> tuple[str, ...]:
  """A tied checkpoint may still store its LM head: the same tensor as the embeddings."""
  return (r"lm_head\.weight",) if cfg.tie_word_embeddings else ()
