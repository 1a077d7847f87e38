"""Full-size configs of the paper's models, as their config.json files on the hub define them.

`hf_config(name)` builds the transformers config; `config(name)` our family
config. The parameter counts of `jax.eval_shape` trees are tested against
transformers models built from the same configs on the meta device.
"""
from __future__ import annotations

from typing import Any

import transformers

from models import registry

# LLaVA-OneVision's any-res grid: 384 px tiles, 1x1 to 6x6.
_ONEVISION_PINPOINTS = [[384 * i, 384 * j] for i in range(1, 7) for j in range(1, 7)]

# SigLIP so400m/14-384 without its last layer and pooling head, as LLaVA-OneVision uses it.
_SIGLIP_SO400M = {
    "model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
    "num_attention_heads": 16, "num_hidden_layers": 26, "patch_size": 14, "vision_use_head": False,
}


def _onevision(text: dict[str, Any]) -> dict[str, Any]:
  return {
      "architectures": ["LlavaOnevisionForConditionalGeneration"],
      "model_type": "llava_onevision",
      "image_token_index": 151646,
      "video_token_index": 151647,
      "projector_hidden_act": "gelu",
      "vision_feature_layer": -1,
      "vision_feature_select_strategy": "full",
      "vision_aspect_ratio": "anyres_max_9",
      "image_grid_pinpoints": _ONEVISION_PINPOINTS,
      "tie_word_embeddings": text["tie_word_embeddings"],
      "vision_config": dict(_SIGLIP_SO400M),
      "text_config": {
          "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643,
          "eos_token_id": 151645, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
          "rms_norm_eps": 1e-6, "hidden_act": "silu", "use_sliding_window": False, **text,
      },
  }


# The text side of Qwen2-VL-7B and Qwen2.5-VL-7B (Qwen2-7B with M-RoPE) and their special tokens.
_QWEN_VL_TEXT = {
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
}

PRESETS: dict[str, dict[str, Any]] = {
    # llava-hf/llava-onevision-qwen2-0.5b-ov-hf (Qwen2-0.5B: tied embeddings).
    "llava-onevision-qwen2-0.5b-ov": _onevision({
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_window_layers": 24, "vocab_size": 152000, "tie_word_embeddings": True,
    }),
    # llava-hf/llava-onevision-qwen2-7b-ov-hf.
    "llava-onevision-qwen2-7b-ov": _onevision({
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "max_window_layers": 28, "vocab_size": 152128, "tie_word_embeddings": False,
    }),
    # Qwen/Qwen2-VL-7B-Instruct (flat text keys, as released).
    "qwen2-vl-7b-instruct": {
        **_QWEN_VL_TEXT,
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "max_position_embeddings": 32768,
        "vision_config": {
            "depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3, "hidden_size": 3584,
            "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
        },
    },
    # Qwen/Qwen2.5-VL-7B-Instruct.
    "qwen2.5-vl-7b-instruct": {
        **_QWEN_VL_TEXT,
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "max_position_embeddings": 128000,
        "vision_config": {
            "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
            "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "temporal_patch_size": 2,
        },
    },
}


def names() -> tuple[str, ...]:
  return tuple(PRESETS)


def _dict(name: str) -> dict[str, Any]:
  if name not in PRESETS:
    raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
  return PRESETS[name]


def hf_config(name: str) -> transformers.PretrainedConfig:
  d = _dict(name)
  return transformers.CONFIG_MAPPING[d["model_type"]].from_dict(d)


def config(name: str):
  """(family, family config) of a preset."""
  d = _dict(name)
  fam = registry.get(d["model_type"])
  return fam, fam.parse_config(d)
