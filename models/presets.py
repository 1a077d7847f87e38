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

# CLIP ViT-L/14-336, as LLaVA-1.5 and LLaVA-1.6 ship it (all 24 layers; LLaVA reads layer -2).
_CLIP_L_336 = {
    "model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
    "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768,
}
# LLaVA-1.6's any-res grid (336 px tiles).
_LLAVA_NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
# lmsys/vicuna-7b-v1.5 and -13b-v1.5 (Llama-2) as the llava-hf configs give them.
_VICUNA_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-05, "vocab_size": 32064}
_VICUNA_13B = {**_VICUNA_7B, "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
               "num_hidden_layers": 40, "num_key_value_heads": 40}
# mistralai/Mistral-7B-Instruct-v0.2 (no sliding window).
_MISTRAL_7B_V02 = {
    "model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "vocab_size": 32064,
}


# OpenGVLab/InternVL2-8B: InternViT-300M-448px + InternLM2.5-7B-chat.
_INTERNVIT_300M = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
    "image_size": 448, "patch_size": 14, "layer_norm_eps": 1e-06, "hidden_act": "gelu",
}
_INTERNLM2_5_7B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 92553, "rms_norm_eps": 1e-05, "max_position_embeddings": 32768,
    "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
# InternVL2-8B as released (remote code: InternVLChatModel), `convert.tables.internvl`'s original layout.
# Not in PRESETS: transformers has no class to count its parameters; tests compare it with "internvl2-8b".
INTERNVL2_8B_ORIGINAL: dict[str, Any] = {
    "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "downsample_ratio": 0.5,
    "select_layer": -1, "ps_version": "v2", "template": "internlm2-chat", "force_image_size": 448,
    "vision_config": {**_INTERNVIT_300M, "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b",
                      "qkv_bias": True, "qk_normalization": False, "norm_type": "layer_norm", "num_channels": 3},
    "llm_config": {**_INTERNLM2_5_7B, "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2",
                   "bias": False, "rope_theta": 1000000, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
}


def _llava(model_type: str, text: dict[str, Any]) -> dict[str, Any]:
  cfg = {
      "architectures": ["LlavaForConditionalGeneration" if model_type == "llava" else "LlavaNextForConditionalGeneration"],
      "model_type": model_type,
      "image_token_index": 32000,
      "pad_token_id": 32001,
      "projector_hidden_act": "gelu",
      "vision_feature_layer": -2,
      "vision_feature_select_strategy": "default",
      "tie_word_embeddings": False,
      "vision_config": dict(_CLIP_L_336),
      "text_config": dict(text),
  }
  if model_type == "llava_next":
    cfg.update(image_grid_pinpoints=_LLAVA_NEXT_PINPOINTS, use_image_newline_parameter=True)
  return cfg


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
    # llava-hf/llava-1.5-7b-hf and -13b-hf.
    "llava-v1.5-7b": _llava("llava", _VICUNA_7B),
    "llava-v1.5-13b": _llava("llava", _VICUNA_13B),
    # llava-hf/llava-v1.6-vicuna-7b-hf and llava-v1.6-mistral-7b-hf.
    "llava-v1.6-vicuna-7b": _llava("llava_next", _VICUNA_7B),
    "llava-v1.6-mistral-7b": _llava("llava_next", _MISTRAL_7B_V02),
    # InternVL2-8B in transformers' layout (its InternLM2 as the Llama that transformers' conversion writes).
    "internvl2-8b": {
        "architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl", "image_token_id": 92546,
        "image_seq_length": 256, "downsample_ratio": 0.5, "projector_hidden_act": "gelu",
        "vision_feature_layer": -1, "vision_feature_select_strategy": "default", "tie_word_embeddings": False,
        "vision_config": {**_INTERNVIT_300M, "model_type": "internvl_vision", "attention_bias": True,
                          "use_qk_norm": False, "norm_type": "layer_norm", "use_mean_pooling": True},
        "text_config": {**_INTERNLM2_5_7B, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                        "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000000.0}},
    },
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
