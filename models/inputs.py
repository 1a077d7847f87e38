"""Video + prompt -> the inputs the transformers model's forward takes, per family.

The prompt goes through the tokenizer's chat template when it has one (the
family's own template otherwise), the single video placeholder is expanded to
one token per visual embedding, exactly as the HF processors do, and a batch is
padded on the right. Everything here is numpy: the arrays are ready for
`transformers` (as torch tensors) and for our models alike.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from models import preprocess

# Used only when the tokenizer has no chat template.
LLAVA_ONEVISION_TEMPLATE = "<|im_start|>user <video>\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
QWEN2_VL_TEMPLATE = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                     "<|vision_start|><|video_pad|><|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n")
# LLaVA-1.5 and LLaVA-1.6-vicuna ("USER: ... ASSISTANT:"), LLaVA-1.6-mistral ([INST] ... [/INST]).
LLAVA_TEMPLATE = "USER: <image>\n{prompt} ASSISTANT:"
LLAVA_MISTRAL_TEMPLATE = "[INST] <image>\n{prompt} [/INST]"
# InternVL2's internlm2-chat template with its system message, as the original chat() builds it.
INTERNVL_SYSTEM = ("你是由上海人工智能实验室联合商汤科技开发的书生多模态大模型，英文名叫InternVL, "
                   "是一个有用无害的人工智能助手。")
INTERNVL_TEMPLATE = (f"<|im_start|>system\n{INTERNVL_SYSTEM}<|im_end|>\n<|im_start|>user\n<IMG_CONTEXT>\n"
                     "{prompt}<|im_end|>\n<|im_start|>assistant\n")
QWEN_DEFAULT_FPS = 2.0  # the sampled fps assumed for frames given as arrays (Qwen2.5-VL time axis)


def chat_prompt(tokenizer, prompt: str, fallback: str, media: str = "video") -> str:
  """One user turn with one `media` item ("video" or "image") before the prompt."""
  if getattr(tokenizer, "chat_template", None):
    messages = [{"role": "user", "content": [{"type": media}, {"type": "text", "text": prompt}]}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  return fallback.format(prompt=prompt)


def _expand_once(text: str, placeholder: str, count: int, before: str = "", after: str = "") -> str:
  """The prompt's single placeholder becomes `count` of them (between `before` and `after`)."""
  found = text.count(placeholder)
  if found != 1:
    raise ValueError(f"the chat prompt must hold exactly one {placeholder!r} placeholder, found {found}")
  return text.replace(placeholder, before + placeholder * count + after)


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  width = max(len(r) for r in rows)
  ids = np.full((len(rows), width), pad_id, np.int64)
  mask = np.zeros((len(rows), width), np.int64)
  for b, r in enumerate(rows):
    ids[b, : len(r)] = r
    mask[b, : len(r)] = 1
  return ids, mask


def _pad_id(tokenizer) -> int:
  pad = tokenizer.pad_token_id
  return tokenizer.eos_token_id if pad is None else pad


def llava_onevision_inputs(cfg, tokenizer, processor_config: Mapping[str, Any] | None,
                           videos: Sequence[np.ndarray], prompts: Sequence[str]) -> dict[str, np.ndarray]:
  """input_ids, attention_mask, pixel_values_videos [B, T, 3, S, S] (one video a request)."""
  pixels, rows = [], []
  for frames, prompt in zip(videos, prompts):
    pixels.append(preprocess.llava_onevision_video(frames, processor_config)[0])
    count = len(frames) * cfg.tokens_per_frame + 1  # + the image_newline after the video
    text = _expand_once(chat_prompt(tokenizer, prompt, LLAVA_ONEVISION_TEMPLATE), "<video>", count)
    rows.append(tokenizer(text)["input_ids"])
  ids, mask = pad_right(rows, _pad_id(tokenizer))
  return {"input_ids": ids, "attention_mask": mask, "pixel_values_videos": np.stack(pixels)}


def qwen2_vl_inputs(cfg, tokenizer, processor_config: Mapping[str, Any] | None, videos: Sequence[np.ndarray],
                    prompts: Sequence[str], fps: Sequence[float] | None = None) -> dict[str, np.ndarray]:
  """input_ids, attention_mask, pixel_values_videos [N, C*tp*p*p], video_grid_thw [B, 3],
  mm_token_type_ids (and second_per_grid_ts for Qwen2.5-VL)."""
  from models import qwen2_vl

  pixels, grids, rows = [], [], []
  merge = int((processor_config or {}).get("merge_size", 2))
  for frames, prompt in zip(videos, prompts):
    pv, grid = preprocess.qwen2_vl_video(frames, processor_config)
    pixels.append(pv)
    grids.append(grid[0])
    count = int(np.prod(grid[0])) // merge**2
    text = _expand_once(chat_prompt(tokenizer, prompt, QWEN2_VL_TEMPLATE), "<|video_pad|>", count)
    rows.append(tokenizer(text)["input_ids"])
  ids, mask = pad_right(rows, _pad_id(tokenizer))
  out = {"input_ids": ids, "attention_mask": mask, "pixel_values_videos": np.concatenate(pixels),
         "video_grid_thw": np.stack(grids).astype(np.int64),
         "mm_token_type_ids": np.asarray(qwen2_vl.token_types(cfg, ids), np.int64)}
  if getattr(cfg, "model_type", "") == "qwen2_5_vl":
    tp = int((processor_config or {}).get("temporal_patch_size", 2))
    fps = list(fps) if fps is not None else [QWEN_DEFAULT_FPS] * len(videos)
    out["second_per_grid_ts"] = np.array([tp / f for f in fps], np.float32)
  return out


def llava_inputs(cfg, tokenizer, processor_config: Mapping[str, Any] | None, videos: Sequence[np.ndarray],
                 prompts: Sequence[str]) -> dict[str, np.ndarray]:
  """LLaVA-1.5 and LLaVA-NeXT: every frame is an image (see `models.llava`). input_ids,
  attention_mask, and pixel_values [B*F, 3, S, S] ("llava") or pixel_values_videos
  [B, F, 3, S, S] ("llava_next": one tile a frame).

  The template's single <image> becomes one placeholder per visual row, frames back to
  back, so a request's visual tokens are one block (the template's "\n" after the
  image follows the last frame)."""
  placeholder = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
  fallback = LLAVA_MISTRAL_TEMPLATE if cfg.decoder == "mistral" else LLAVA_TEMPLATE
  pixels, rows = [], []
  for frames, prompt in zip(videos, prompts):
    if cfg.model_type == "llava_next":
      pixels.append(preprocess.llava_next_frames(frames, processor_config))
    else:
      pixels.append(preprocess.clip_images(list(frames), processor_config))
    text = chat_prompt(tokenizer, prompt, fallback.replace("<image>", placeholder), media="image")
    text = _expand_once(text, placeholder, len(frames) * cfg.tokens_per_frame)
    rows.append(tokenizer(text)["input_ids"])
  window = cfg.text.sliding_window
  if window is not None and max(len(r) for r in rows) > window:
    raise ValueError(f"the prompt takes {max(len(r) for r in rows)} tokens, more than the decoder's sliding window "
                     f"of {window}, which decoding does not apply: use fewer frames")
  ids, mask = pad_right(rows, _pad_id(tokenizer))
  if cfg.model_type == "llava_next":
    return {"input_ids": ids, "attention_mask": mask, "pixel_values_videos": np.stack(pixels)}
  return {"input_ids": ids, "attention_mask": mask, "pixel_values": np.concatenate(pixels)}


def internvl_inputs(cfg, tokenizer, processor_config: Mapping[str, Any] | None, videos: Sequence[np.ndarray],
                    prompts: Sequence[str]) -> dict[str, np.ndarray]:
  """InternVL (both layouts): input_ids, attention_mask, pixel_values [B*F, 3, S, S], one tile a frame.

  The template's <IMG_CONTEXT> becomes <img>, one context token per visual row of all
  frames back to back, </img> (see `models.internvl`). The original release builds its
  internlm2-chat prompt in code (its tokenizer's template takes text contents only), so
  "internvl_chat" always uses INTERNVL_TEMPLATE."""
  context = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
  template = INTERNVL_TEMPLATE.replace("<IMG_CONTEXT>", context)
  pixels, rows = [], []
  for frames, prompt in zip(videos, prompts):
    pixels.append(preprocess.internvl_frames(frames, processor_config, cfg.vision.image_size))
    if cfg.model_type == "internvl_chat":
      text = template.format(prompt=prompt)
    else:
      text = chat_prompt(tokenizer, prompt, template, media="image")
    text = _expand_once(text, context, len(frames) * cfg.tokens_per_frame, "<img>", "</img>")
    rows.append(tokenizer(text)["input_ids"])
  ids, mask = pad_right(rows, _pad_id(tokenizer))
  return {"input_ids": ids, "attention_mask": mask, "pixel_values": np.concatenate(pixels)}


INPUT_BUILDERS: dict[str, Callable[..., dict[str, np.ndarray]]] = {
    "internvl": internvl_inputs,
    "internvl_chat": internvl_inputs,
    "llava": llava_inputs,
    "llava_next": llava_inputs,
    "llava_onevision": llava_onevision_inputs,
    "qwen2_vl": qwen2_vl_inputs,
    "qwen2_5_vl": qwen2_vl_inputs,
}
