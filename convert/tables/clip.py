"""Rules for the CLIP vision tower (`models.clip`): SigLIP's layers plus the class token and pre-LayerNorm."""

from __future__ import annotations

from convert.framework import Rule
from convert.tables import siglip


def rules(path: str = "vision", hf: str = "vision_tower.") -> tuple[Rule, ...]:
  return (
    Rule(f"{path}/patch_embed/w", hf + "embeddings.patch_embedding.weight", "conv"),
    Rule(f"{path}/class_embed", hf + "embeddings.class_embedding"),
    Rule(f"{path}/pos_embed", hf + "embeddings.position_embedding.weight"),
    Rule(f"{path}/pre_ln/scale", hf + "pre_layrnorm.weight"),  # sic: CLIP's name
    Rule(f"{path}/pre_ln/bias", hf + "pre_layrnorm.bias"),
    *siglip.layer_rules(path, hf),
  )


def ignore(hf: str = "vision_tower.") -> tuple[str, ...]:
  """Older CLIP checkpoints store the position-id buffer, which is not a weight."""
  return (hf.replace(".", r"\.") + r"embeddings\.position_ids",)
