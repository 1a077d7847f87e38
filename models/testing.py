"""Tiny random-weight checkpoints built locally (no hub), for tests and demos. Needs torch.

`save_tiny_llava_onevision(folder)` writes what a user's HF folder holds:
config.json, model.safetensors, a byte-level BPE tokenizer with the
LLaVA-OneVision special tokens and chat template, and the image / video
processor configs sized for the tiny SigLIP.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")

# LLaVA-OneVision's processor template: media first, then the text of each turn.
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}"
    "{% endfor %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. What is happening in this video?",
    "Describe the video in detail. A person is walking along the beach at sunset.",
    "user assistant system: You are a helpful assistant. Answer with the option's letter.",
    "There are two cats on the sofa, and a dog sleeps under the table near the window.",
    "0123456789 How many people appear? Where does the scene take place? Why?",
)

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def tiny_tokenizer(vocab_size: int = 320, special_tokens=SPECIAL_TOKENS, chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE):
  """A byte-level BPE tokenizer (any text encodes) with the special tokens first (ids 0, 1, ...)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(_CORPUS, trainer)
  return PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=chat_template)


def tiny_llava_onevision_config(tokenizer, **overrides: Any) -> dict:
  """A config.json dict: SigLIP 32 wide, 2 layers, 70 px / 14 px patches (5x5 -> 3x3 pooled);
  Qwen2 64 wide, 2 layers, 4 heads, 2 KV heads."""
  image = 70
  cfg = {
      "model_type": "llava_onevision",
      "architectures": ["LlavaOnevisionForConditionalGeneration"],
      "image_token_index": tokenizer.convert_tokens_to_ids("<image>"),
      "video_token_index": tokenizer.convert_tokens_to_ids("<video>"),
      "vision_feature_layer": -1,
      "vision_feature_select_strategy": "full",
      "projector_hidden_act": "gelu",
      "image_grid_pinpoints": [[image * i, image * j] for i in (1, 2, 3) for j in (1, 2, 3)],
      "vision_aspect_ratio": "anyres_max_9",
      "tie_word_embeddings": False,
      "vision_config": {
          "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": image, "patch_size": 14,
          "vision_use_head": False,
      },
      "text_config": {
          "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": len(tokenizer),
          "max_position_embeddings": 4096, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False,
          "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
      },
  }
  for key, value in overrides.items():
    if isinstance(value, dict) and isinstance(cfg.get(key), dict):
      cfg[key] = {**cfg[key], **value}
    else:
      cfg[key] = value
  return cfg


def randomize_(model, seed: int = 0) -> None:
  """Weights with O(1) activations everywhere, so that every piece shows in the logits:
  token embeddings ~ N(0, 1) (the input token steers the output, so greedy decoding
  does not settle on one token), other matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.1),
  norm scales ~ 1 + N(0, 0.1)."""
  import torch

  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
      if "norm" in name and p.ndim == 1:
        p.copy_(1 + 0.1 * noise)
      elif p.ndim == 1 and name.endswith("bias"):
        p.copy_(0.1 * noise)
      elif name.endswith("embed_tokens.weight"):
        p.copy_(noise)
      else:
        p.copy_(noise / math.sqrt(math.prod(p.shape[1:]) if p.ndim > 1 else p.shape[0]))


def build_tiny_llava_onevision(tokenizer, seed: int = 0, **overrides: Any):
  """The transformers model (float32, eval mode) of `tiny_llava_onevision_config`."""
  import torch
  from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

  torch.manual_seed(seed)
  model = LlavaOnevisionForConditionalGeneration(
      LlavaOnevisionConfig.from_dict(tiny_llava_onevision_config(tokenizer, **overrides)))
  randomize_(model, seed)
  return model.eval()


def save_processor_configs(folder: Path, image_size: int, pinpoints) -> None:
  """preprocessor_config.json and video_preprocessor_config.json as LLaVA-OneVision ships them."""
  common = {
      "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
      "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD), "resample": 3,
      "rescale_factor": 1 / 255, "size": {"height": image_size, "width": image_size},
  }
  image = {**common, "image_processor_type": "LlavaOnevisionImageProcessor", "do_pad": True,
           "image_grid_pinpoints": pinpoints, "processor_class": "LlavaOnevisionProcessor"}
  video = {**common, "video_processor_type": "LlavaOnevisionVideoProcessor",
           "processor_class": "LlavaOnevisionProcessor"}
  (folder / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
  (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))


def save_tiny_llava_onevision(folder, seed: int = 0, **overrides: Any):
  """Writes a complete tiny HF checkpoint folder; returns the transformers model."""
  folder = Path(folder)
  tokenizer = tiny_tokenizer()
  model = build_tiny_llava_onevision(tokenizer, seed, **overrides)
  model.save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  cfg = model.config
  save_processor_configs(folder, cfg.vision_config.image_size, cfg.image_grid_pinpoints)
  num_image_tokens = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
  (folder / "processor_config.json").write_text(json.dumps({
      "processor_class": "LlavaOnevisionProcessor", "num_image_tokens": num_image_tokens,
      "vision_feature_select_strategy": cfg.vision_feature_select_strategy,
      "vision_aspect_ratio": cfg.vision_aspect_ratio}, indent=2))
  return model


# ----------------------------------------------------------------------------- Qwen2-VL / Qwen2.5-VL

QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>", "<|video_pad|>")
# Qwen2-VL's template for one user turn: a system line, media in vision markers, then the text.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif content['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_qwen2_vl_config(tokenizer, model_type: str = "qwen2_vl") -> dict:
  """config.json for a tiny Qwen2-VL (or Qwen2.5-VL): Qwen2 64 wide, 2 layers; tower 32 wide, 4 px patches."""
  ids = tokenizer.convert_tokens_to_ids
  text = {
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": len(tokenizer), "rms_norm_eps": 1e-6,
      "max_position_embeddings": 4096, "eos_token_id": ids("<|im_end|>"), "bos_token_id": ids("<|endoftext|>"),
      "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
  }
  if model_type == "qwen2_vl":
    vision = {"depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "hidden_size": 64, "patch_size": 4}
  else:
    vision = {"depth": 3, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48, "out_hidden_size": 64,
              "patch_size": 4, "window_size": 16, "fullatt_block_indexes": [1], "tokens_per_second": 2}
  return {"model_type": model_type, "text_config": text, "vision_config": vision, "tie_word_embeddings": False,
          "image_token_id": ids("<|image_pad|>"), "video_token_id": ids("<|video_pad|>"),
          "vision_start_token_id": ids("<|vision_start|>"), "vision_end_token_id": ids("<|vision_end|>")}


def save_tiny_qwen2_vl(folder, model_type: str = "qwen2_vl", seed: int = 0):
  """A complete tiny Qwen2-VL / Qwen2.5-VL HF folder (weights, tokenizer, processor configs);
  returns the transformers model (float32, eval mode)."""
  import torch
  import transformers

  folder = Path(folder)
  tokenizer = tiny_tokenizer(special_tokens=QWEN_SPECIAL_TOKENS, chat_template=QWEN2_VL_CHAT_TEMPLATE)
  torch.manual_seed(seed)
  cfg = transformers.CONFIG_MAPPING[model_type].from_dict(tiny_qwen2_vl_config(tokenizer, model_type))
  architecture = {"qwen2_vl": "Qwen2VLForConditionalGeneration",
                  "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}[model_type]
  model = getattr(transformers, architecture)(cfg)
  randomize_(model, seed)
  model.eval()
  model.save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  processor = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
               "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD), "resample": 3,
               "rescale_factor": 1 / 255, "patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
               "min_pixels": 16 * 16, "max_pixels": 32 * 32,
               "size": {"shortest_edge": 16 * 16, "longest_edge": 32 * 32}}
  (folder / "preprocessor_config.json").write_text(json.dumps(
      {**processor, "image_processor_type": "Qwen2VLImageProcessor"}, indent=2))
  (folder / "video_preprocessor_config.json").write_text(json.dumps(
      {**processor, "video_processor_type": "Qwen2VLVideoProcessor"}, indent=2))
  return model
