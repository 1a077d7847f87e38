"""Model families by the HF config's `model_type`.

A family is a config parser, its modules (reusing `models.qwen2`), a
conversion table (in `convert.tables`, under the same key) and its
preprocessing; see `models.family.Family`. To add one, define its `Family`
in its own module and list it here.
"""
from __future__ import annotations

from typing import Any, Mapping

from models import internvl, llava, llava_onevision, qwen2_vl
from models.family import Family

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    internvl.INTERNVL, internvl.INTERNVL_CHAT, llava.LLAVA, llava.LLAVA_NEXT, llava_onevision.FAMILY, qwen2_vl.QWEN2_VL, qwen2_vl.QWEN2_5_VL)}


def known() -> tuple[str, ...]:
  return tuple(sorted(FAMILIES))


def get(model_type: str) -> Family:
  if model_type not in FAMILIES:
    raise KeyError(f"unknown model family {model_type!r}; known: {', '.join(known())}")
  return FAMILIES[model_type]


def family_of(hf_config: Mapping[str, Any]) -> Family:
  """The family of a parsed config.json."""
  if "model_type" not in hf_config:
    raise KeyError(f"config has no model_type; known families: {', '.join(known())}")
  return get(hf_config["model_type"])
