"""LLaVA-OneVision: SigLIP + projector + newline + Qwen2.

Checkpoints name tensors three ways: the hub's ("language_model.model.…",
"vision_tower.vision_model.…"), what transformers 5 saves ("language_model.model.…",
"vision_tower.…") and its in-memory state dict ("model.language_model.…",
"model.vision_tower.…", "lm_head.…"). The renames map all three to one form.
"""
from __future__ import annotations

from convert.framework import Rule, Table
from convert.tables import qwen2, siglip
from models.llava_onevision import LlavaOnevisionConfig

RENAMES = (
    (r"^model\.language_model\.", "language_model."),
    (r"^language_model\.model\.", "language_model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^model\.vision_tower\.", "vision_tower."),
    (r"^vision_tower\.vision_model\.", "vision_tower."),
    (r"^model\.", ""),
)


def table(cfg: LlavaOnevisionConfig) -> Table:
  projector = []
  for n in ("linear_1", "linear_2"):
    projector.append(Rule(f"projector/{n}/w", f"multi_modal_projector.{n}.weight", "linear"))
    if cfg.projector_bias:
      projector.append(Rule(f"projector/{n}/b", f"multi_modal_projector.{n}.bias"))
  return Table(
      rules=(*siglip.rules(), *projector, Rule("image_newline", "image_newline"), *qwen2.rules(cfg.text)),
      renames=RENAMES,
      ignore=(*siglip.ignore(), *qwen2.ignore(cfg.text)),
  )
