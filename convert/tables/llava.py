"""LLaVA-1.5 and LLaVA-NeXT: CLIP + projector (+ newline) + Llama / Mistral.

Checkpoint names come in the same three forms as LLaVA-OneVision's (the hub's
"language_model.model.…" / "vision_tower.vision_model.…", what transformers 5
saves, its in-memory state dict); the same renames map them to one form.
"""

from __future__ import annotations

from convert.framework import Rule, Table
from convert.tables import clip, qwen2
from convert.tables.llava_onevision import RENAMES
from models.llava import LlavaConfig


def table(cfg: LlavaConfig) -> Table:
  projector = []
  for n in ("linear_1", "linear_2"):
    projector.append(Rule(f"projector/{n}/w", f"multi_modal_projector.{n}.weight", "linear"))
    if cfg.projector_bias:
      projector.append(Rule(f"projector/{n}/b", f"multi_modal_projector.{n}.bias"))
  newline = (Rule("image_newline", "image_newline"),) if cfg.newline else ()
  return Table(
    rules=(*clip.rules(), *projector, *newline, *qwen2.rules(cfg.text)),
    renames=RENAMES,
    ignore=(*clip.ignore(), *qwen2.ignore(cfg.text)),
  )
