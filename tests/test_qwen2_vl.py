"""Qwen2-VL and Qwen2.5-VL against transformers (torch, float32) with copied random weights:
the vision tower's layout, rotary, blocks, merger and whole tower; M-RoPE positions;
prefill logits through save_pretrained -> python -m convert -> load; greedy decode.
(The 7B presets' sizes are checked with the others in test_convert.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers import vision_utils

from convert import __main__ as convert_cli
from convert import checkpoint, framework, tables
from models import family, qwen2, qwen2_vl, registry
from models import qwen2_vl_vision as vision
from models.testing import randomize_
from wq_jax import cache as kv_cache
from wq_jax import methods

KINDS = ("qwen2_vl", "qwen2_5_vl")
IMAGE, VIDEO, START, END = 990, 991, 992, 993
# Grids in patches (t, rows, cols). Windows are 2x2 merged tokens: 6x8 pads a whole empty
# window column (transformers' quirk), 10x6 pads both sides.
GRIDS = np.array([[2, 6, 8], [1, 4, 4], [1, 10, 6]])


def tiny_config(kind: str) -> dict:
  """config.json as transformers 5 saves it: Qwen2 64 wide, 2 layers; tower 32 wide, 4 px patches."""
  text = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 994,
    "eos_token_id": 995,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
  }
  if kind == "qwen2_vl":
    vc = {"depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "hidden_size": 64, "patch_size": 4}
  else:
    vc = {
      "depth": 3,
      "hidden_size": 32,
      "num_heads": 2,
      "intermediate_size": 48,
      "out_hidden_size": 64,
      "patch_size": 4,
      "window_size": 16,
      "fullatt_block_indexes": [1],
      "tokens_per_second": 2,
    }
  return {
    "model_type": kind,
    "text_config": text,
    "vision_config": vc,
    "tie_word_embeddings": False,
    "image_token_id": IMAGE,
    "video_token_id": VIDEO,
    "vision_start_token_id": START,
    "vision_end_token_id": END,
  }


def hf_class(kind: str):
  return getattr(transformers, registry.get(kind).hf_architecture)


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
  return request.param


@pytest.fixture(scope="module")
def hf_model(kind):
  torch.manual_seed(0)
  model = hf_class(kind)(transformers.CONFIG_MAPPING[kind].from_dict(tiny_config(kind)))
  randomize_(model, seed=1)
  return model.eval()


@pytest.fixture(scope="module")
def cfg(kind):
  return qwen2_vl.parse_config(tiny_config(kind))


@pytest.fixture(scope="module")
def params(kind, cfg, hf_model):
  """Converted in memory from the state dict (the table reads both naming schemes)."""
  fam = registry.get(kind)
  tensors = {k: v.numpy() for k, v in hf_model.state_dict().items()}
  tree = framework.convert_tensors(tables.TABLES[kind](cfg), fam.abstract_params(cfg), tensors)
  return jax.tree.map(jnp.asarray, tree)


def rel_err(ours, ref) -> float:
  ref = np.asarray(ref)
  return float(np.abs(np.asarray(ours) - ref).max() / np.abs(ref).max())


def layer_params(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


# --------------------------------------------------------------------------- vision tower


def test_layout_matches_transformers(cfg):
  lay = vision.layout(cfg.vision, GRIDS)
  grid = torch.tensor(GRIDS)
  hf_pos = vision_utils.get_vision_position_ids(grid, cfg.vision.spatial_merge_size).numpy()
  np.testing.assert_array_equal(lay.pos, hf_pos[lay.order])
  cu = vision_utils.get_vision_cu_seqlens(grid).numpy()
  np.testing.assert_array_equal(lay.frames.index[lay.frames.valid], np.arange(cu[-1]))
  np.testing.assert_array_equal(lay.frames.valid.sum(1), np.diff(cu))
  if cfg.vision.window_size is None:
    assert lay.windows is None
    np.testing.assert_array_equal(lay.order, np.arange(cu[-1]))
    return
  index, cu_windows = vision_utils.get_vision_window_index(
    grid, cfg.vision.spatial_merge_size, cfg.vision.window_size, cfg.vision.patch_size
  )
  np.testing.assert_array_equal(lay.unmerge, torch.argsort(index).numpy())
  np.testing.assert_array_equal(lay.windows.valid.sum(1), np.diff(cu_windows.numpy()))
  seg, slot = lay.windows.seg, lay.windows.slot
  np.testing.assert_array_equal(lay.windows.index[seg, slot], np.arange(len(seg)))


def test_rotary_matches_transformers(cfg, hf_model):
  pos = vision_utils.get_vision_position_ids(torch.tensor(GRIDS), cfg.vision.spatial_merge_size)
  with torch.no_grad():
    cos, sin = hf_model.model.visual.rotary_pos_emb(torch.zeros(1), pos)
  ours = vision.rotary(cfg.vision, jnp.asarray(pos.numpy()))
  np.testing.assert_allclose(ours[0], cos.numpy(), atol=1e-6)
  np.testing.assert_allclose(ours[1], sin.numpy(), atol=1e-6)


def test_blocks_match_transformers(cfg, hf_model, params):
  """Every block on the same random input in the tower's working order; Qwen2.5-VL's
  windowed blocks get cu_window_seqlens, its full-attention block cu_seqlens."""
  tower = hf_model.model.visual
  lay = vision.layout(cfg.vision, GRIDS)
  grid = torch.tensor(GRIDS)
  cu = vision_utils.get_vision_cu_seqlens(grid)
  if cfg.vision.window_size is not None:
    _, cu_windows = vision_utils.get_vision_window_index(
      grid, cfg.vision.spatial_merge_size, cfg.vision.window_size, cfg.vision.patch_size
    )
  cos, sin = vision.rotary(cfg.vision, jnp.asarray(lay.pos))
  x = np.random.default_rng(0).standard_normal((len(lay.order), cfg.vision.width)).astype(np.float32)
  for i in range(cfg.vision.depth):
    full = cfg.vision.window_size is None or i in cfg.vision.fullatt_block_indexes
    with torch.no_grad():
      ref = tower.blocks[i](
        torch.tensor(x),
        cu_seqlens=cu if full else cu_windows,
        position_embeddings=(torch.tensor(np.asarray(cos)), torch.tensor(np.asarray(sin))),
      )
    ours = vision.block(
      layer_params(params["vision"]["blocks"], i),
      jnp.asarray(x),
      cos,
      sin,
      lay.frames if full else lay.windows,
      cfg.vision,
    )
    assert rel_err(ours, ref.numpy()) < 1e-5, f"block {i}"


def test_merger_matches_transformers(cfg, hf_model, params):
  x = np.random.default_rng(1).standard_normal((64, cfg.vision.width)).astype(np.float32)
  with torch.no_grad():
    ref = hf_model.model.visual.merger(torch.tensor(x))
  assert rel_err(vision.merger(params["vision"]["merger"], jnp.asarray(x), cfg.vision), ref.numpy()) < 1e-5


def test_tower_matches_transformers(cfg, hf_model, params):
  pixels = np.random.default_rng(2).standard_normal((int(GRIDS.prod(1).sum()), cfg.vision.patch_dim))
  pixels = pixels.astype(np.float32)
  with torch.no_grad():
    ref = hf_model.model.visual(torch.tensor(pixels), grid_thw=torch.tensor(GRIDS), output_hidden_states=True)
  features, inter = qwen2_vl.visual_features(params, cfg, pixels, GRIDS)
  lay = vision.layout(cfg.vision, GRIDS)
  assert rel_err(inter["patch_embed"][lay.order], ref.hidden_states[0].numpy()) < 1e-5
  for i, hidden in enumerate(ref.hidden_states[1:]):
    assert rel_err(inter["blocks"][i], hidden.numpy()) < 1e-5, f"block {i}"
  assert features.shape == ref.pooler_output.shape
  assert rel_err(features, ref.pooler_output.numpy()) < 1e-5


# --------------------------------------------------------------------------- M-RoPE positions


def mixed_batch(cfg, rng):
  """Two rows: text, image, text, video, text; and left padding, video, text, image, text."""

  def run(token, grid):
    return [START] + [token] * int(np.prod(grid) // cfg.vision.merge_unit) + [END]

  images, videos = np.array([[1, 4, 6], [1, 8, 4]]), np.array([[3, 6, 4], [6, 4, 8]])
  text = lambda n: rng.integers(0, 900, n).tolist()  # noqa: E731
  rows = [
    text(5) + run(IMAGE, images[0]) + text(7) + run(VIDEO, videos[0]) + text(3),
    text(2) + run(VIDEO, videos[1]) + text(4) + run(IMAGE, images[1]) + text(6),
  ]
  width = max(map(len, rows))
  ids = np.zeros((2, width), np.int64)
  mask = np.zeros((2, width), np.int64)
  ids[0, : len(rows[0])], mask[0, : len(rows[0])] = rows[0], 1
  ids[1, width - len(rows[1]) :], mask[1, width - len(rows[1]) :] = rows[1], 1
  return ids, mask, images, videos


@pytest.mark.parametrize("seconds", [None, [0.7, 1 / 3]])
def test_rope_index_matches_transformers(cfg, hf_model, seconds):
  ids, mask, images, videos = mixed_batch(cfg, np.random.default_rng(3))
  types = qwen2_vl.token_types(cfg, ids)
  kwargs = dict(image_grid_thw=images, video_grid_thw=videos, attention_mask=mask)
  if cfg.model_type == "qwen2_5_vl" and seconds is not None:
    kwargs["second_per_grid_ts"] = np.asarray(seconds, np.float32)
  ref_pos, ref_delta = hf_model.model.get_rope_index(
    torch.tensor(ids), torch.tensor(types), **{k: torch.tensor(v) for k, v in kwargs.items()}
  )
  pos, delta = qwen2_vl.get_rope_index(cfg, ids, types, **kwargs)
  np.testing.assert_array_equal(pos, ref_pos.numpy())
  np.testing.assert_array_equal(delta, ref_delta.numpy())


def test_rope_index_text_only_is_arange(cfg):
  pos, delta = qwen2_vl.get_rope_index(cfg, np.zeros((2, 7), np.int64))
  np.testing.assert_array_equal(pos, np.broadcast_to(np.arange(7), (3, 2, 7)))
  np.testing.assert_array_equal(delta, 0)


# --------------------------------------------------------------------------- the whole model


@pytest.fixture(scope="module")
def loaded(kind, hf_model, tmp_path_factory):
  """save_pretrained -> python -m convert --dtype float32 -> load."""
  root = tmp_path_factory.mktemp(kind)
  hf_model.save_pretrained(root / "hf")
  assert convert_cli.main([str(root / "hf"), str(root / "jax"), "--dtype", "float32", "--quiet"]) == 0
  params, cfg, _ = checkpoint.load_checkpoint(root / "jax")
  return params, cfg


def video_prompt(cfg, rng, grid, text_after):
  ids = rng.integers(0, 900, 12).tolist() + [START] + [VIDEO] * int(np.prod(grid) // cfg.vision.merge_unit)
  ids = np.array([ids + [END] + rng.integers(0, 900, text_after).tolist()])
  pixels = rng.standard_normal((int(np.prod(grid)), cfg.vision.patch_dim)).astype(np.float32)
  inputs = {
    "input_ids": ids,
    "attention_mask": np.ones_like(ids),
    "pixel_values_videos": pixels,
    "video_grid_thw": np.array([grid]),
    "mm_token_type_ids": qwen2_vl.token_types(cfg, ids),
  }
  if cfg.model_type == "qwen2_5_vl":
    inputs["second_per_grid_ts"] = np.array([1.5], np.float32)
  return inputs


def prompts(cfg):
  rng = np.random.default_rng(4)
  text = rng.integers(0, 900, (1, 600))
  video = video_prompt(cfg, rng, (4, 8, 12), 40)
  image_and_video = video_prompt(cfg, rng, (2, 4, 8), 10)
  grid = np.array([[1, 6, 10]])
  image = [START] + [IMAGE] * int(grid.prod() // cfg.vision.merge_unit) + [END]
  image_and_video["input_ids"] = np.concatenate([np.array([image]), image_and_video["input_ids"]], 1)
  image_and_video["attention_mask"] = np.ones_like(image_and_video["input_ids"])
  image_and_video["mm_token_type_ids"] = qwen2_vl.token_types(cfg, image_and_video["input_ids"])
  image_and_video["pixel_values"] = rng.standard_normal((60, cfg.vision.patch_dim)).astype(np.float32)
  image_and_video["image_grid_thw"] = grid
  return {
    "text": {"input_ids": text, "attention_mask": np.ones_like(text)},
    "video": video,
    "image_and_video": image_and_video,
  }


@pytest.mark.parametrize("prompt", ["text", "video", "image_and_video"])
def test_prefill_logits_match_transformers(kind, hf_model, loaded, prompt):
  params, cfg = loaded
  inputs = prompts(cfg)[prompt]
  with torch.no_grad():
    ref = hf_model(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()
  ours = np.asarray(registry.get(kind).logits(params, cfg, inputs))
  assert ours.shape == ref.shape
  assert rel_err(ours, ref) < 1e-3
  assert (ours.argmax(-1) == ref.argmax(-1)).mean() > 0.99


def test_placeholder_count_mismatch_is_an_error(kind, cfg, params):
  inputs = prompts(cfg)["video"]
  for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
    inputs[key] = inputs[key][:, 1:-60]
  with pytest.raises(ValueError, match="Video features and video tokens do not match"):
    registry.get(kind).embed_inputs(params, cfg, inputs)


def test_greedy_decode_matches_transformers_for_16_steps(kind, hf_model, loaded):
  """Video prompt, prefill -> fp16-method cache -> 15 decode steps at M-RoPE position
  p + delta, delta = max(prefill positions) + 1 - prompt length (transformers' rope_deltas)."""
  params, cfg = loaded
  steps, start = 16, 13  # the video tokens follow 12 text tokens and <|vision_start|>
  inputs = video_prompt(cfg, np.random.default_rng(5), (4, 8, 12), 30)
  ids = inputs["input_ids"]
  num_visual = int((ids == VIDEO).sum())
  with torch.no_grad():
    gen = hf_model.generate(
      **{k: torch.tensor(v) for k, v in inputs.items()},
      generation_config=transformers.GenerationConfig(
        max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0
      ),
      output_logits=True,
      return_dict_in_generate=True,
    )
  want_tokens = gen.sequences[:, ids.shape[1] :].numpy()
  want_logits = np.stack([x.numpy() for x in gen.logits], axis=1)
  assert len(np.unique(want_tokens)) > 8  # a varied continuation, not one repeated token

  e = registry.get(kind).embed_inputs(params, cfg, inputs)
  delta = np.asarray(e.positions).max(axis=(0, 2)) + 1 - ids.shape[1]
  _, rope_deltas = qwen2_vl.get_rope_index(
    cfg, ids, None, None, inputs["video_grid_thw"], inputs.get("second_per_grid_ts")
  )
  np.testing.assert_array_equal(delta, rope_deltas[:, 0])
  assert delta[0] < 0  # M-RoPE gives the video fewer positions than tokens
  out = family.prefill(params["decoder"], cfg.text, e.embeds, e.positions, e.attention_mask, last_only=True)
  method, mcfg = methods.resolve("fp16")
  seq_lens = [ids.shape[1]]
  plan_inputs = methods.PlanInputs(
    scores=np.zeros((1, num_visual // mcfg.window_size)),
    sensitivity=np.asarray(out.sensitivity).mean(-1),
    num_layers=cfg.text.num_layers,
    visual_start=start,
    num_visual=num_visual,
    seq_lens=seq_lens,
  )
  opts = method.cache_options(mcfg)
  cache = kv_cache.build_cache(
    out.keys,
    out.values,
    method.plan(mcfg, plan_inputs),
    visual_start=start,
    num_visual=num_visual,
    seq_lens=seq_lens,
    max_new_tokens=steps,
    window_size=opts.window_size,
    value_channel_group=opts.value_channel_group,
    meta_dtype=opts.meta_dtype,
  )
  step = jax.jit(qwen2.decode_step, static_argnames=("cfg", "implementation"))
  logits = [out.logits]
  for i in range(steps - 1):
    token = jnp.argmax(logits[-1], axis=-1).astype(jnp.int32)
    position = jnp.broadcast_to(jnp.asarray(ids.shape[1] + i + delta, jnp.int32), (3, 1))
    nxt, cache = step(params["decoder"], cfg.text, token, position, cache)
    logits.append(nxt)
  logits = np.stack([np.asarray(x) for x in logits], axis=1)
  np.testing.assert_array_equal(logits.argmax(-1), want_tokens)
  assert rel_err(logits, want_logits) < 1e-3
