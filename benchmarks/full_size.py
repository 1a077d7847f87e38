"""Full-size random-weight models without a download: a Model built in memory from a preset.

The weights are random (models.layers.init_tree, std 0.02) and the tokenizer is
a word-level stand-in with the preset's vocabulary size and special-token ids,
so shapes, bytes and speeds are those of the real model; text is meaningless.
`tiny_llava_onevision` builds the tests' tiny model the same way, for CPU runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp

from models import presets, registry, testing
from wq_jax.api import Model

SIGLIP_NORM = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def stand_in_tokenizer(folder: Path, vocab_size: int, specials: dict[str, int],
                       chat_template: str = testing.LLAVA_ONEVISION_CHAT_TEMPLATE) -> None:
  """A word-level tokenizer whose vocabulary is `vocab_size` entries, specials at their ids."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {f"w{i}": i for i in range(vocab_size)}
  for token, i in specials.items():
    vocab.pop(f"w{i}")
    vocab[token] = i
  tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 additional_special_tokens=[t for t in specials if t not in
                                                            ("<|im_end|>", "<|endoftext|>")],
                                 chat_template=chat_template)
  fast.save_pretrained(folder)


def llava_onevision(name: str, folder: Path, dtype=jnp.bfloat16, seed: int = 0) -> Model:
  """A random-weight LLaVA-OneVision preset (e.g. 'llava-onevision-qwen2-7b') ready for `generate`."""
  folder.mkdir(parents=True, exist_ok=True)
  hf = presets.hf_config(name).to_dict()
  text = hf["text_config"]
  stand_in_tokenizer(folder, text["vocab_size"], {
      "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
      "<image>": hf["image_token_index"], "<video>": hf["video_token_index"]})
  size = hf["vision_config"]["image_size"]
  video = {**SIGLIP_NORM, "size": {"height": size, "width": size}, "resample": 3, "do_resize": True,
           "do_rescale": True, "do_normalize": True, "rescale_factor": 1 / 255}
  (folder / "video_preprocessor_config.json").write_text(json.dumps(video))
  return random_weight_model(hf, folder, dtype, seed)


# Qwen2-VL's video processor as released (Qwen/Qwen2-VL-7B-Instruct): CLIP's normalization, 14 px patches,
# 2 frames a temporal patch, 2 x 2 merged; its default pixel budget a frame.
QWEN2_VL_VIDEO = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
                  "do_resize": True, "do_rescale": True, "do_normalize": True, "rescale_factor": 1 / 255,
                  "resample": 3, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                  "min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28}
# Frames the benchmarks feed Qwen2-VL, a side: 448 px is kept as is by its processor (a multiple of 28 within
# the budget), 32 x 32 patches -> 256 tokens a temporal patch of 2 frames, 128 a frame (LLaVA-OneVision: 196).
QWEN2_VL_FRAME_SIDE = 448


def qwen2_vl(name: str, folder: Path, dtype=jnp.bfloat16, seed: int = 0, hf: dict | None = None) -> Model:
  """A random-weight Qwen2-VL preset (e.g. 'qwen2-vl-7b-instruct'), or the config dict `hf`, ready for
  `generate`."""
  folder.mkdir(parents=True, exist_ok=True)
  hf = hf or presets.hf_config(name).to_dict()
  ids = ("bos_token_id", "eos_token_id", "vision_start_token_id", "vision_end_token_id", "vision_token_id",
         "image_token_id", "video_token_id")
  text = hf.get("text_config") or hf
  found = {key: hf.get(key, text.get(key)) for key in ids}
  stand_in_tokenizer(folder, text["vocab_size"], {
      "<|endoftext|>": found["bos_token_id"], "<|im_start|>": found["bos_token_id"] + 1,  # Qwen's vocabulary
      "<|im_end|>": found["eos_token_id"], "<|vision_start|>": found["vision_start_token_id"],
      "<|vision_end|>": found["vision_end_token_id"], "<|vision_pad|>": found["vision_token_id"],
      "<|image_pad|>": found["image_token_id"], "<|video_pad|>": found["video_token_id"]},
      chat_template=testing.QWEN2_VL_CHAT_TEMPLATE)
  (folder / "video_preprocessor_config.json").write_text(json.dumps(QWEN2_VL_VIDEO))
  return random_weight_model(hf, folder, dtype, seed)


def model(preset: str, folder: Path, dtype=jnp.bfloat16, seed: int = 0) -> Model:
  """A random-weight LLaVA-OneVision or Qwen2-VL preset, by the preset's model type."""
  kind = presets.hf_config(preset).model_type
  if kind == "llava_onevision":
    return llava_onevision(preset, folder, dtype, seed)
  if kind in ("qwen2_vl", "qwen2_5_vl"):
    return qwen2_vl(preset, folder, dtype, seed)
  raise ValueError(f"preset {preset!r} is a {kind}: the full-size benchmarks build LLaVA-OneVision and Qwen2-VL")


def frame_side(model: Model) -> int:
  """The side of the square synthetic frames a benchmark feeds this model."""
  vision = model.config.vision
  return vision.image_size if hasattr(vision, "image_size") else QWEN2_VL_FRAME_SIDE


def tiny_llava_onevision(folder: Path, dtype=jnp.bfloat16, seed: int = 0) -> Model:
  """The tests' tiny LLaVA-OneVision (`models.testing`: its config, byte-level tokenizer and
  processor files) with random weights; no torch needed."""
  folder.mkdir(parents=True, exist_ok=True)
  tokenizer = testing.tiny_tokenizer()
  tokenizer.save_pretrained(folder)
  hf = testing.tiny_llava_onevision_config(tokenizer)
  testing.save_processor_configs(folder, hf["vision_config"]["image_size"], hf["image_grid_pinpoints"])
  return random_weight_model(hf, folder, dtype, seed)


def random_weight_model(hf: dict, folder: Path, dtype, seed: int) -> Model:
  """A Model of config.json dict `hf` with random weights, its tokenizer and processor files in `folder`."""
  family = registry.get(hf["model_type"])
  cfg = family.parse_config(hf)
  params = jax.jit(lambda key: family.init_params(cfg, key, dtype))(jax.random.PRNGKey(seed))
  return Model(params=params, config=cfg, model_type=hf["model_type"], root=folder, hf_config=hf,
               dtype=jnp.dtype(dtype).name)
