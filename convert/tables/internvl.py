"""InternVL in both layouts: transformers' native "internvl" and the original "internvl_chat".

Native names (after the LLaVA renames, which also cover its in-memory state dict):

    vision_tower.embeddings.{cls_token [1, 1, E], position_embeddings [1, P+1, E],
                             patch_embeddings.projection.{weight, bias}}
    vision_tower.encoder.layer.{l}.{layernorm_before, layernorm_after, lambda_1, lambda_2,
        attention.{q,k,v}_proj, attention.{q,k}_norm, attention.projection_layer, mlp.fc1, mlp.fc2}
    multi_modal_projector.{layer_norm, linear_1, linear_2}
    language_model.… (Qwen2 / Llama names), lm_head.weight

The original InternVL2 layout and how it maps onto the same parameters:

    vision_model.embeddings.class_embedding [1, 1, E]       -> vision/class_embed
    vision_model.embeddings.position_embedding [1, P+1, E]  -> vision/pos_embed
    vision_model.embeddings.patch_embedding.{weight, bias}  -> vision/patch_embed
    vision_model.encoder.layers.{l}.
        norm1, norm2                  -> ln1, ln2
        ls1, ls2                      -> ls1, ls2
        attn.qkv.{weight, bias} [3E, E]: rows q | k | v, each heads x head_dim -> q, k, v
        attn.q_norm, attn.k_norm      -> q_norm, k_norm
        attn.proj                     -> o
        mlp.fc1, mlp.fc2              -> fc1, fc2
    mlp1.0 (LayerNorm), mlp1.1, mlp1.3 (Linear; mlp1.2 is the GELU) -> projector/norm, linear_1, linear_2
    language_model.model.tok_embeddings                     -> decoder/embed
    language_model.model.layers.{l}.
        attention_norm, ffn_norm      -> attn_norm, mlp_norm
        attention.wqkv [(K*(G+2))*H, D]: per KV head k, G query heads, its key, its value
                                      -> qkv [D, K, G+2, H] (the same order; query head k*G+g)
        attention.wo                  -> o
        feed_forward.w1, w3           -> gate_up [D, 2, F] (gate, then up)
        feed_forward.w2               -> down
    language_model.model.norm         -> decoder/norm
    language_model.output             -> decoder/lm_head

An original checkpoint with a Qwen2 LLM (InternVL2-1B) names its decoder as Qwen2 does.
"""

from __future__ import annotations

import math

from convert.framework import Hook, Rule, Table
from convert.tables import qwen2
from convert.tables.llava_onevision import RENAMES
from models.intern_vit import InternViTConfig
from models.internvl import InternVLConfig
from models.qwen2 import Qwen2Config

# [1, 1, E] -> [E] and [1, P+1, E] -> [P+1, E]: the leading singleton axes go.
UNBATCH = Hook("unbatch", lambda s: (1,) * (3 - len(s)) + tuple(s), lambda x, s: x.reshape(s))


def vit_qkv(part: int) -> tuple[Hook, Hook]:
  """InternViT's fused qkv [3E, E] (bias [3E]) -> q, k or v: [E, N, H] (bias [N, H])."""
  weight = Hook(
    f"vit_qkv{part}",
    lambda s: (3 * math.prod(s[1:]), s[0]),
    lambda x, s: x.reshape(3, -1, x.shape[-1])[part].T.reshape(s),
  )
  bias = Hook(f"vit_qkv{part}_bias", lambda s: (3 * math.prod(s),), lambda x, s: x.reshape(3, -1)[part].reshape(s))
  return weight, bias


def _norm(path: str, hf: str, rms: bool) -> list[Rule]:
  return [Rule(f"{path}/scale", hf + ".weight")] + ([] if rms else [Rule(f"{path}/bias", hf + ".bias")])


def _dense(path: str, hf: str) -> list[Rule]:
  return [Rule(f"{path}/w", hf + ".weight", "linear"), Rule(f"{path}/b", hf + ".bias")]


def vision_rules(cfg: InternViTConfig, original: bool) -> list[Rule]:
  stem = "vision_model." if original else "vision_tower."
  layer = stem + ("encoder.layers.{l}." if original else "encoder.layer.{l}.")
  emb = stem + "embeddings."
  out = [
    Rule("vision/class_embed", emb + ("class_embedding" if original else "cls_token"), UNBATCH),
    Rule("vision/pos_embed", emb + ("position_embedding" if original else "position_embeddings"), UNBATCH),
    Rule(
      "vision/patch_embed/w",
      emb + ("patch_embedding" if original else "patch_embeddings.projection") + ".weight",
      "conv",
    ),
    Rule("vision/patch_embed/b", emb + ("patch_embedding" if original else "patch_embeddings.projection") + ".bias"),
  ]
  names = {
    "ln1": "norm1" if original else "layernorm_before",
    "ln2": "norm2" if original else "layernorm_after",
    "ls1": "ls1" if original else "lambda_1",
    "ls2": "ls2" if original else "lambda_2",
    "o": "attn.proj" if original else "attention.projection_layer",
  }
  out += _norm("vision/layers/ln1", layer + names["ln1"], cfg.rms_norm)
  out += _norm("vision/layers/ln2", layer + names["ln2"], cfg.rms_norm)
  out += [
    Rule("vision/layers/ls1", layer + names["ls1"]),
    Rule("vision/layers/ls2", layer + names["ls2"]),
    Rule("vision/layers/o/w", layer + names["o"] + ".weight", "linear_from_heads"),
    Rule("vision/layers/o/b", layer + names["o"] + ".bias"),
  ]
  for i, n in enumerate("qkv"):
    if original:
      weight, bias = vit_qkv(i)
      out.append(Rule(f"vision/layers/{n}/w", layer + "attn.qkv.weight", weight))
      if cfg.qkv_bias:
        out.append(Rule(f"vision/layers/{n}/b", layer + "attn.qkv.bias", bias))
    else:
      out.append(Rule(f"vision/layers/{n}/w", layer + f"attention.{n}_proj.weight", "linear_to_heads"))
      if cfg.qkv_bias:
        out.append(Rule(f"vision/layers/{n}/b", layer + f"attention.{n}_proj.bias", "split_heads"))
  if cfg.qk_norm:
    attn = layer + ("attn." if original else "attention.")
    out += [Rule("vision/layers/q_norm", attn + "q_norm.weight"), Rule("vision/layers/k_norm", attn + "k_norm.weight")]
  for n in ("fc1", "fc2"):
    out += _dense(f"vision/layers/{n}", layer + f"mlp.{n}")
  if cfg.post_norm:
    out += _norm("vision/post_ln", stem + "layernorm", False)
  return out


def internlm2_rules(cfg: Qwen2Config, path: str = "decoder", hf: str = "language_model.") -> list[Rule]:
  layer = hf + "layers.{l}."
  out = [
    Rule(f"{path}/embed", hf + "tok_embeddings.weight"),
    Rule(f"{path}/layers/attn_norm", layer + "attention_norm.weight"),
    Rule(f"{path}/layers/mlp_norm", layer + "ffn_norm.weight"),
    Rule(f"{path}/layers/o/w", layer + "attention.wo.weight", "linear"),
    Rule(f"{path}/layers/gate_up/w", layer + "feed_forward.w1.weight", "linear_to_heads", part=(1, 0, 1)),
    Rule(f"{path}/layers/gate_up/w", layer + "feed_forward.w3.weight", "linear_to_heads", part=(1, 1, 2)),
    Rule(f"{path}/layers/down/w", layer + "feed_forward.w2.weight", "linear"),
    Rule(f"{path}/norm", hf + "norm.weight"),
    # wqkv's rows are already [K, G+2, H], our fused projection's layout
    Rule(f"{path}/layers/qkv/w", layer + "attention.wqkv.weight", "linear_to_heads"),
  ]
  if cfg.qkv_bias:
    out.append(Rule(f"{path}/layers/qkv/b", layer + "attention.wqkv.bias", "split_heads"))
  if cfg.o_bias:
    out.append(Rule(f"{path}/layers/o/b", layer + "attention.wo.bias"))
  if not cfg.tie_word_embeddings:
    out.append(Rule(f"{path}/lm_head", "language_model.output.weight", "linear"))
  return out


def table(cfg: InternVLConfig) -> Table:
  original = cfg.model_type == "internvl_chat"
  if original:
    projector = [
      *_norm("projector/norm", "mlp1.0", False),
      *_dense("projector/linear_1", "mlp1.1"),
      *_dense("projector/linear_2", "mlp1.3"),
    ]
  else:
    projector = [
      *_norm("projector/norm", "multi_modal_projector.layer_norm", False),
      *_dense("projector/linear_1", "multi_modal_projector.linear_1"),
      *_dense("projector/linear_2", "multi_modal_projector.linear_2"),
    ]
  internlm2 = cfg.decoder == "internlm2"
  decoder = internlm2_rules(cfg.text) if internlm2 else list(qwen2.rules(cfg.text))
  ignore = (
    (r"language_model\.output\.weight",) if internlm2 and cfg.text.tie_word_embeddings else qwen2.ignore(cfg.text)
  )
  return Table(rules=(*vision_rules(cfg.vision, original), *projector, *decoder), renames=RENAMES, ignore=ignore)
