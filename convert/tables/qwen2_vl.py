"""Qwen2-VL and Qwen2.5-VL: the Qwen2-VL vision tower (`models.qwen2_vl_vision`) + Qwen2.

Canonical names are the released checkpoints' and what transformers 5 saves
(`visual.…`, `model.layers.…`, `lm_head.weight`); its in-memory state dict
(`model.visual.…`, `model.language_model.…`) is renamed to them.
"""
from __future__ import annotations

from convert.framework import Rule, Table
from convert.tables import qwen2
from models.qwen2_vl import Qwen2VLConfig
from models.qwen2_vl_vision import Mlp, Norm, VisionConfig

RENAMES = (
    (r"^model\.visual\.", "visual."),
    (r"^model\.language_model\.", "model."),
)


def _norm(path: str, hf: str, layer_norm: bool) -> list[Rule]:
  if layer_norm:
    return [Rule(f"{path}/scale", f"{hf}.weight"), Rule(f"{path}/bias", f"{hf}.bias")]
  return [Rule(path, f"{hf}.weight")]


def _dense(path: str, hf: str) -> list[Rule]:
  return [Rule(f"{path}/w", f"{hf}.weight", "linear"), Rule(f"{path}/b", f"{hf}.bias")]


def vision_rules(cfg: VisionConfig, path: str = "vision", hf: str = "visual.") -> tuple[Rule, ...]:
  ln = cfg.norm is Norm.LAYER
  blk, layer = f"{path}/blocks", hf + "blocks.{l}."
  names = (("fc1", "fc1"), ("fc2", "fc2")) if cfg.mlp is Mlp.PLAIN else (
      ("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))
  return (
      Rule(f"{path}/patch_embed/w", hf + "patch_embed.proj.weight", "conv"),
      *_norm(f"{blk}/norm1", layer + "norm1", ln),
      Rule(f"{blk}/attn/qkv/w", layer + "attn.qkv.weight", "linear_to_heads"),
      Rule(f"{blk}/attn/qkv/b", layer + "attn.qkv.bias", "split_heads"),
      Rule(f"{blk}/attn/out/w", layer + "attn.proj.weight", "linear_from_heads"),
      Rule(f"{blk}/attn/out/b", layer + "attn.proj.bias"),
      *_norm(f"{blk}/norm2", layer + "norm2", ln),
      *(r for ours, theirs in names for r in _dense(f"{blk}/mlp/{ours}", layer + f"mlp.{theirs}")),
      *_norm(f"{path}/merger/norm", hf + "merger.ln_q", ln),
      *_dense(f"{path}/merger/fc1", hf + "merger.mlp.0"),
      *_dense(f"{path}/merger/fc2", hf + "merger.mlp.2"),
  )


def table(cfg: Qwen2VLConfig) -> Table:
  return Table(
      rules=(*vision_rules(cfg.vision), *qwen2.rules(cfg.text, hf="model.")),
      renames=RENAMES,
      ignore=qwen2.ignore(cfg.text),
  )
