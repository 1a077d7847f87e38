"""Rules for the SigLIP vision tower (`models.siglip`); its encoder-layer rules serve CLIP too."""

from __future__ import annotations

from convert.framework import Rule


def _norm(stem: str, hf: str) -> list[Rule]:
  return [Rule(f"{stem}/scale", hf + ".weight"), Rule(f"{stem}/bias", hf + ".bias")]


def layer_rules(path: str = "vision", hf: str = "vision_tower.") -> tuple[Rule, ...]:
  """The stacked encoder layers and the final LayerNorm (`post_layernorm`), as SigLIP and CLIP name them."""
  layer = hf + "encoder.layers.{l}."
  out = [
    Rule(f"{path}/layers/o/w", layer + "self_attn.out_proj.weight", "linear_from_heads"),
    Rule(f"{path}/layers/o/b", layer + "self_attn.out_proj.bias"),
    *_norm(f"{path}/layers/ln1", layer + "layer_norm1"),
    *_norm(f"{path}/layers/ln2", layer + "layer_norm2"),
    *_norm(f"{path}/post_ln", hf + "post_layernorm"),
  ]
  for n in "qkv":
    out += [
      Rule(f"{path}/layers/{n}/w", layer + f"self_attn.{n}_proj.weight", "linear_to_heads"),
      Rule(f"{path}/layers/{n}/b", layer + f"self_attn.{n}_proj.bias", "split_heads"),
    ]
  for n in ("fc1", "fc2"):
    out += [
      Rule(f"{path}/layers/{n}/w", layer + f"mlp.{n}.weight", "linear"),
      Rule(f"{path}/layers/{n}/b", layer + f"mlp.{n}.bias"),
    ]
  return tuple(out)


def rules(path: str = "vision", hf: str = "vision_tower.") -> tuple[Rule, ...]:
  return (
    Rule(f"{path}/patch_embed/w", hf + "embeddings.patch_embedding.weight", "conv"),
    Rule(f"{path}/patch_embed/b", hf + "embeddings.patch_embedding.bias"),
    Rule(f"{path}/pos_embed", hf + "embeddings.position_embedding.weight"),
    *layer_rules(path, hf),
  )


def ignore(hf: str = "vision_tower.") -> tuple[str, ...]:
  """SigLIP's attention-pooling head (vision_use_head): VLMs read hidden states, never its output."""
  return (hf.replace(".", r"\.") + r"head\..*",)
