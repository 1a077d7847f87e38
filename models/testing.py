"""Tiny random-weight checkpoints built locally (no hub), for tests and demos. Needs torch.

`save_tiny_llava_onevision(folder)` writes what a user's HF folder holds:
config.json, model.safetensors, a byte-level BPE tokenizer with the
LLaVA-OneVision special tokens and chat template, and the image / video
processor configs sized for the tiny SigLIP. `save_tiny_qwen2_vl` and
`save_tiny_llava` (LLaVA-1.5 / LLaVA-NeXT over Llama or Mistral) do the same
for their families.
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


def tiny_tokenizer(vocab_size: int = 320, special_tokens=SPECIAL_TOKENS, chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
                   eos_token: str = "<|im_end|>", pad_token: str = "<|endoftext|>", bos_token: str | None = None):
  """A byte-level BPE tokenizer (any text encodes) with the special tokens first (ids 0, 1, ...);
  with `bos_token`, every encoding starts with it (as Llama's tokenizer does)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(_CORPUS, trainer)
  if bos_token is not None:
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B",
        special_tokens=[(bos_token, tok.token_to_id(bos_token))])
  return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token, pad_token=pad_token, bos_token=bos_token,
                                 chat_template=chat_template)


def with_overrides(cfg: dict, overrides: dict) -> dict:
  """`cfg` with `overrides` applied; a dict override updates a nested config instead of replacing it."""
  for key, value in overrides.items():
    cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
  return cfg


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
  return with_overrides(cfg, overrides)


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


# ----------------------------------------------------------------------------- LLaVA-1.5 / LLaVA-NeXT

LLAVA_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<image>")
# llava-hf's template: "USER: <image>\n{text} ASSISTANT:", images before the text of a turn.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
# LLaVA-NeXT's any-res grid at 42 px tiles: the checkpoints' 336 px grid scaled by 1/8.
TINY_LLAVA_NEXT_PINPOINTS = [[42, 84], [84, 42], [84, 84], [126, 42], [42, 126]]


def llava_tokenizer():
  return tiny_tokenizer(special_tokens=LLAVA_SPECIAL_TOKENS, chat_template=LLAVA_CHAT_TEMPLATE, eos_token="</s>",
                        pad_token="<pad>", bos_token="<s>")


def tiny_llava_config(tokenizer, model_type: str = "llava", decoder: str = "llama", **overrides: Any) -> dict:
  """config.json for a tiny LLaVA-1.5 ("llava") or LLaVA-NeXT ("llava_next"): CLIP 32 wide, 2 layers,
  42 px / 14 px patches (3x3 = 9 rows a tile, feature layer -2); a Llama or Mistral decoder 64 wide,
  2 layers, 4 heads, 2 KV heads."""
  ids = tokenizer.convert_tokens_to_ids
  text = {
      "model_type": decoder, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": len(tokenizer), "rms_norm_eps": 1e-5,
      "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": ids("<s>"),
      "eos_token_id": ids("</s>"), "pad_token_id": ids("<pad>"),
  }
  if decoder == "mistral":
    text.update(sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
  cfg = {
      "model_type": model_type,
      "image_token_index": ids("<image>"),
      "vision_feature_layer": -2,
      "vision_feature_select_strategy": "default",
      "projector_hidden_act": "gelu",
      "tie_word_embeddings": False,
      "vision_config": {
          "model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 42, "patch_size": 14, "projection_dim": 16,
      },
      "text_config": text,
  }
  if model_type == "llava_next":
    cfg["image_grid_pinpoints"] = TINY_LLAVA_NEXT_PINPOINTS
  return with_overrides(cfg, overrides)


def save_tiny_llava(folder, model_type: str = "llava", decoder: str = "llama", seed: int = 0, **overrides: Any):
  """A complete tiny LLaVA-1.5 / LLaVA-NeXT HF folder (weights, tokenizer, preprocessor config);
  returns the transformers model (float32, eval mode)."""
  import torch
  import transformers

  folder = Path(folder)
  tokenizer = llava_tokenizer()
  torch.manual_seed(seed)
  cfg = transformers.CONFIG_MAPPING[model_type].from_dict(tiny_llava_config(tokenizer, model_type, decoder, **overrides))
  architecture = {"llava": "LlavaForConditionalGeneration", "llava_next": "LlavaNextForConditionalGeneration"}
  model = getattr(transformers, architecture[model_type])(cfg)
  randomize_(model, seed)
  model.eval()
  model.save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  size = cfg.vision_config.image_size
  processor = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
               "do_center_crop": True, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD), "resample": 3,
               "rescale_factor": 1 / 255, "size": {"shortest_edge": size},
               "crop_size": {"height": size, "width": size}}
  if model_type == "llava_next":
    processor.update(image_processor_type="LlavaNextImageProcessor", processor_class="LlavaNextProcessor",
                     image_grid_pinpoints=cfg.image_grid_pinpoints, do_pad=True)
  else:
    processor.update(image_processor_type="CLIPImageProcessor", processor_class="LlavaProcessor")
  (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
  return model


# ----------------------------------------------------------------------------- InternVL (both layouts)

INTERNVL_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>")
# transformers' InternVL template: an image is "<IMG_CONTEXT>\n" before the turn's text (the
# processor then writes <img> + the image's context tokens + </img> in its place).
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{{ '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def internvl_tokenizer():
  return tiny_tokenizer(special_tokens=INTERNVL_SPECIAL_TOKENS, chat_template=INTERNVL_CHAT_TEMPLATE)


def tiny_internvl_config(tokenizer, decoder: str = "llama", **overrides: Any) -> dict:
  """config.json (transformers' native layout) for a tiny InternVL: InternViT 32 wide, 2 layers,
  56 px / 7 px patches (8x8 grid, pixel-shuffled to 4x4 = 16 rows a tile); a Llama (InternLM2 as
  transformers converts it) or Qwen2 decoder 64 wide, 2 layers, 4 heads, 2 KV heads."""
  ids = tokenizer.convert_tokens_to_ids
  cfg = {
      "model_type": "internvl",
      "image_token_id": ids("<IMG_CONTEXT>"),
      "image_seq_length": 16,
      "downsample_ratio": 0.5,
      "projector_hidden_act": "gelu",
      "vision_feature_layer": -1,
      "vision_feature_select_strategy": "default",
      "tie_word_embeddings": False,
      "vision_config": {
          "model_type": "internvl_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 56, "patch_size": 7, "attention_bias": True,
      },
      "text_config": {
          "model_type": decoder, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": len(tokenizer), "rms_norm_eps": 1e-5,
          "max_position_embeddings": 4096, "tie_word_embeddings": False, "eos_token_id": ids("<|im_end|>"),
          "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
      },
  }
  return with_overrides(cfg, overrides)


def _save_internvl_side_files(folder: Path, tokenizer, image_size: int) -> None:
  tokenizer.save_pretrained(folder)
  processor = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
               "crop_to_patches": False, "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD),
               "resample": 3, "rescale_factor": 1 / 255, "size": {"height": image_size, "width": image_size},
               "image_processor_type": "GotOcr2ImageProcessor", "processor_class": "InternVLProcessor"}
  (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))


def save_tiny_internvl(folder, decoder: str = "llama", seed: int = 0, **overrides: Any):
  """A complete tiny InternVL HF folder in transformers' layout; returns the model (float32, eval mode)."""
  import torch
  import transformers

  folder = Path(folder)
  tokenizer = internvl_tokenizer()
  torch.manual_seed(seed)
  cfg = transformers.InternVLConfig.from_dict(tiny_internvl_config(tokenizer, decoder, **overrides))
  model = transformers.InternVLForConditionalGeneration(cfg)
  randomize_(model, seed)
  model.eval()
  model.save_pretrained(folder)
  _save_internvl_side_files(folder, tokenizer, cfg.vision_config.image_size[0])
  return model


def save_internvl_chat_layout(folder, model) -> None:
  """Writes `model` (a transformers InternVL over Llama) in the original InternVL2 layout: config.json
  with vision_config / llm_config (InternLM2), the fused InternViT qkv and InternLM2 wqkv, the
  original names (the mapping in `convert.tables.internvl`, run backwards)."""
  import numpy as np
  from safetensors.numpy import save_file

  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  c, v, t = model.config, model.config.vision_config, model.config.text_config
  if t.model_type != "llama" or c.vision_feature_select_strategy != "default":
    raise ValueError("the original layout holds an InternLM2 (transformers' Llama) and drops the class token")
  sd = {k: p.detach().numpy() for k, p in model.state_dict().items()}
  out = {}
  vt, lm = "model.vision_tower.", "model.language_model."
  emb = vt + "embeddings."
  out["vision_model.embeddings.class_embedding"] = sd[emb + "cls_token"]
  out["vision_model.embeddings.position_embedding"] = sd[emb + "position_embeddings"]
  for n in ("weight", "bias"):
    out[f"vision_model.embeddings.patch_embedding.{n}"] = sd[emb + f"patch_embeddings.projection.{n}"]
  names = {"layernorm_before": "norm1", "layernorm_after": "norm2", "attention.projection_layer": "attn.proj",
           "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
  for i in range(v.num_hidden_layers):
    ours, theirs = vt + f"encoder.layer.{i}.", f"vision_model.encoder.layers.{i}."
    for a, b in names.items():
      for n in ("weight", "bias"):
        out[theirs + f"{b}.{n}"] = sd[ours + f"{a}.{n}"]
    out[theirs + "ls1"], out[theirs + "ls2"] = sd[ours + "lambda_1"], sd[ours + "lambda_2"]
    for n in ("weight", "bias") if v.attention_bias else ("weight",):
      out[theirs + f"attn.qkv.{n}"] = np.concatenate([sd[ours + f"attention.{p}_proj.{n}"] for p in "qkv"])
  for a, b in (("layer_norm", "mlp1.0"), ("linear_1", "mlp1.1"), ("linear_2", "mlp1.3")):
    for n in ("weight", "bias"):
      out[f"{b}.{n}"] = sd[f"model.multi_modal_projector.{a}.{n}"]
  heads, kv, hd = t.num_attention_heads, t.num_key_value_heads, t.head_dim
  out["language_model.model.tok_embeddings.weight"] = sd[lm + "embed_tokens.weight"]
  out["language_model.model.norm.weight"] = sd[lm + "norm.weight"]
  out["language_model.output.weight"] = sd["lm_head.weight"]
  for i in range(t.num_hidden_layers):
    ours, theirs = lm + f"layers.{i}.", f"language_model.model.layers.{i}."
    q = sd[ours + "self_attn.q_proj.weight"].reshape(kv, heads // kv, hd, -1)
    k = sd[ours + "self_attn.k_proj.weight"].reshape(kv, 1, hd, -1)
    val = sd[ours + "self_attn.v_proj.weight"].reshape(kv, 1, hd, -1)
    out[theirs + "attention.wqkv.weight"] = np.concatenate([q, k, val], axis=1).reshape(-1, q.shape[-1])
    out[theirs + "attention.wo.weight"] = sd[ours + "self_attn.o_proj.weight"]
    out[theirs + "attention_norm.weight"] = sd[ours + "input_layernorm.weight"]
    out[theirs + "ffn_norm.weight"] = sd[ours + "post_attention_layernorm.weight"]
    for a, b in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
      out[theirs + f"feed_forward.{b}.weight"] = sd[ours + f"mlp.{a}.weight"]
  save_file({k: np.ascontiguousarray(x) for k, x in out.items()}, str(folder / "model.safetensors"),
            metadata={"format": "pt"})
  rope = t.rope_parameters
  config = {
      "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "downsample_ratio": c.downsample_ratio,
      "select_layer": c.vision_feature_layer, "ps_version": "v2", "template": "internlm2-chat",
      "force_image_size": v.image_size[0], "img_context_token_id": c.image_token_id,
      "vision_config": {
          "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "hidden_size": v.hidden_size,
          "intermediate_size": v.intermediate_size, "num_hidden_layers": v.num_hidden_layers,
          "num_attention_heads": v.num_attention_heads, "image_size": v.image_size[0], "patch_size": v.patch_size[0],
          "num_channels": v.num_channels, "qkv_bias": v.attention_bias, "qk_normalization": False,
          "norm_type": "layer_norm", "layer_norm_eps": v.layer_norm_eps, "hidden_act": v.hidden_act,
          "drop_path_rate": 0.0, "use_flash_attn": False,
      },
      "llm_config": {
          "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2", "hidden_size": t.hidden_size,
          "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_hidden_layers,
          "num_attention_heads": heads, "num_key_value_heads": kv, "rms_norm_eps": t.rms_norm_eps,
          "rope_theta": rope["rope_theta"], "rope_scaling": {"type": "dynamic", "factor": 2.0},
          "max_position_embeddings": t.max_position_embeddings, "vocab_size": t.vocab_size, "bias": False,
          "hidden_act": t.hidden_act, "tie_word_embeddings": False, "eos_token_id": t.eos_token_id,
      },
  }
  (folder / "config.json").write_text(json.dumps(config, indent=2))
  _save_internvl_side_files(folder, internvl_tokenizer(), v.image_size[0])
