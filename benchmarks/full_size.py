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


def stand_in_tokenizer(folder: Path, vocab_size: int, specials: dict[str, int]) -> None:
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
                                 chat_template=testing.LLAVA_ONEVISION_CHAT_TEMPLATE)
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
