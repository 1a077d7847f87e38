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
  for n in "qkv":
    out.append(Rule(f"{path}/layers/{n}/w", layer + f"self_attn.{n}_proj.weight", "linear_to_heads"))
    if cfg.qkv_bias:
      out.append(Rule(f"{path}/layers/{n}/b", layer + f"self_attn.{n}_proj.bias", "split_heads"))
  if cfg.o_bias:
    out.append(Rule(f"{path}/layers/o/b", layer + "self_attn.o_proj.bias"))
  for n in ("gate", "up", "down"):
    out.append(Rule(f"{path}/layers/{n}/w", layer + f"mlp.{n}_proj.weight", "linear"))
  if not cfg.tie_word_embeddings:
    out.append(Rule(f"{path}/lm_head", "lm_head.weight", "linear"))
  return tuple(out)


def ignore(cfg: Qwen2Config) -> tuple[str, ...]:
  """A tied checkpoint may still store its LM head: the same tensor as the embeddings."""
  return (r"lm_head\.weight",) if cfg.tie_word_embeddings else ()
