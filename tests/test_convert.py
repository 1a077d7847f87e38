"""python -m convert: exact round trip, dtypes, shards, every failure it must name; preset sizes."""
import json
import math
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from convert import ConversionError, convert_checkpoint, load_checkpoint, tables
from convert.__main__ import main as convert_main
from convert.framework import convert_tensors, tree_paths
from models import presets, registry

FAMILY = registry.get("llava_onevision")


def _leaves(tree):
  return {k: np.asarray(v) for k, v in tree_paths(tree).items()}


def test_round_trip_is_exact_and_copies_the_side_files(llava_hf, llava_converted):
  cfg = FAMILY.parse_config(json.loads((llava_hf.folder / "config.json").read_text()))
  assert llava_converted.cfg == cfg
  state = {k: v.numpy() for k, v in llava_hf.model.state_dict().items()}
  want = _leaves(convert_tensors(tables.TABLES["llava_onevision"](cfg), FAMILY.abstract_params(cfg), state))
  got = _leaves(llava_converted.params)
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # Spot checks of the layouts against the torch modules themselves.
  attn = llava_hf.model.model.language_model.layers[1].self_attn
  qkv = got["decoder/layers/qkv/w"][1]  # [D, K, G+2, H]: a KV head's G queries, its key, its value
  kv, g = qkv.shape[1], qkv.shape[2] - 2
  np.testing.assert_array_equal(qkv[:, :, :g].reshape(64, kv * g, 16),
                                attn.q_proj.weight.detach().numpy().T.reshape(64, 4, 16))
  np.testing.assert_array_equal(qkv[:, :, g], attn.k_proj.weight.detach().numpy().T.reshape(64, kv, 16))
  np.testing.assert_array_equal(qkv[:, :, g + 1], attn.v_proj.weight.detach().numpy().T.reshape(64, kv, 16))
  mlp = llava_hf.model.model.language_model.layers[1].mlp
  np.testing.assert_array_equal(got["decoder/layers/gate_up/w"][1][:, 1], mlp.up_proj.weight.detach().numpy().T)
  o = llava_hf.model.model.language_model.layers[1].self_attn.o_proj.weight.detach().numpy()
  np.testing.assert_array_equal(got["decoder/layers/o/w"][1], o.T)  # [N*H, D]: checkpoint format 2
  conv = llava_hf.model.model.vision_tower.embeddings.patch_embedding.weight.detach().numpy()
  np.testing.assert_array_equal(got["vision/patch_embed/w"], conv.transpose(1, 2, 3, 0))
  for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
               "video_preprocessor_config.json", "processor_config.json", "generation_config.json"):
    assert (llava_converted.folder / name).read_bytes() == (llava_hf.folder / name).read_bytes(), name
    assert name in llava_converted.files.files
  meta = json.loads((llava_converted.folder / "wq_config.json").read_text())
  assert (meta["model_type"], meta["dtype"]) == ("llava_onevision", "float32")


def test_sharded_checkpoint_to_bfloat16(llava_hf, llava_converted, tmp_path):
  src = tmp_path / "sharded"
  llava_hf.model.save_pretrained(src, max_shard_size="300KB")
  assert len(list(src.glob("*.safetensors"))) > 1 and (src / "model.safetensors.index.json").is_file()
  params, _, _ = load_checkpoint(convert_checkpoint(src, tmp_path / "out", dtype="bfloat16", progress=False))
  got, ref = _leaves(params), _leaves(llava_converted.params)
  for k in ref:
    assert got[k].dtype == ml_dtypes.bfloat16, k
    np.testing.assert_array_equal(got[k], ref[k].astype(ml_dtypes.bfloat16), err_msg=k)


def _broken_copy(llava_hf, tmp_path, edit):
  """A copy of the HF folder whose tensors dict went through `edit`."""
  dst = tmp_path / "broken"
  shutil.copytree(llava_hf.folder, dst)
  tensors = safetensors.numpy.load_file(dst / "model.safetensors")
  edit(tensors)
  safetensors.numpy.save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
  return dst


def _fails(src, tmp_path, *needles):
  out = tmp_path / "out"
  with pytest.raises(ConversionError) as info:
    convert_checkpoint(src, out, dtype="float32", progress=False)
  for needle in needles:
    assert needle in str(info.value), (needle, str(info.value))
  assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))  # nothing half-written
  return str(info.value)


def test_missing_tensor_is_named(llava_hf, tmp_path):
  name = "language_model.model.layers.1.mlp.up_proj.weight"
  src = _broken_copy(llava_hf, tmp_path, lambda t: t.pop(name))
  _fails(src, tmp_path, "missing", "language_model.layers.1.mlp.up_proj.weight", "decoder/layers/gate_up/w layer 1")


def test_parts_of_one_leaf_must_tile_an_axis():
  """Rules with parts fill one leaf from several tensors; a gap or an overlap is a table bug, named."""
  from convert.framework import Rule, Table, plan

  abstract = {"w": jax.ShapeDtypeStruct((2, 3, 5), np.float32)}  # [L, D, 5] from a [2, D] and a [3, D]
  tensors = {"a.0": (2, 3), "a.1": (2, 3), "b.0": (3, 3), "b.1": (3, 3)}
  a = Rule("w", "a.{l}", "linear", part=(1, 0, 2))
  for b, error in ((Rule("w", "b.{l}", "linear", part=(1, 2, 5)), None),
                   (Rule("w", "b.{l}", "linear", part=(1, 1, 4)), "do not tile axis 1 of size 5"),
                   (Rule("w", "b.{l}", "linear"), "two rules for parameter 'w'")):
    if error is None:
      assignments = plan(Table((a, b)), abstract, tensors)
      assert [(x.hf_name, x.region) for x in assignments][:2] == [("a.0", (slice(None), slice(0, 2))),
                                                                   ("a.1", (slice(None), slice(0, 2)))]
      full = convert_tensors(Table((a, b)), abstract, {k: np.full(v, k[0] == "b", np.float32)
                                                      for k, v in tensors.items()})["w"]
      np.testing.assert_array_equal(full[:, :, :2], 0.0)
      np.testing.assert_array_equal(full[:, :, 2:], 1.0)
    else:
      with pytest.raises(ConversionError, match=error):
        plan(Table((a, b)), abstract, tensors)


def test_extra_tensor_is_named(llava_hf, tmp_path):
  src = _broken_copy(llava_hf, tmp_path, lambda t: t.update({"multi_modal_projector.linear_3.weight": np.ones(3)}))
  _fails(src, tmp_path, "left unused", "multi_modal_projector.linear_3.weight")


def test_wrong_shape_is_named(llava_hf, tmp_path):
  name = "vision_tower.encoder.layers.0.self_attn.k_proj.weight"
  src = _broken_copy(llava_hf, tmp_path, lambda t: t.update({name: np.ones((32, 31), np.float32)}))
  _fails(src, tmp_path, "wrong shape", name, "(32, 31)", "expected (32, 32)", "vision/layers/k/w")


def test_unknown_family_is_named(llava_hf, tmp_path):
  src = tmp_path / "other"
  shutil.copytree(llava_hf.folder, src)
  cfg = json.loads((src / "config.json").read_text())
  (src / "config.json").write_text(json.dumps({**cfg, "model_type": "llava_next_video"}))
  _fails(src, tmp_path, "config.json", "unknown model family", "'llava_next_video'", "llava_onevision")


def test_missing_config_is_named(llava_hf, tmp_path):
  src = tmp_path / "noconfig"
  shutil.copytree(llava_hf.folder, src)
  (src / "config.json").unlink()
  _fails(src, tmp_path, str(src / "config.json"), "no config.json")


def test_truncated_safetensors_is_named(llava_hf, tmp_path):
  src = tmp_path / "truncated"
  shutil.copytree(llava_hf.folder, src)
  data = (src / "model.safetensors").read_bytes()
  (src / "model.safetensors").write_bytes(data[: len(data) // 2])
  _fails(src, tmp_path, str(src / "model.safetensors"), "truncated or corrupt")


def test_cli_reports_errors_and_refuses_to_overwrite(llava_hf, llava_converted, capsys):
  assert convert_main([str(llava_hf.folder), str(llava_converted.folder), "--quiet"]) == 1
  assert "already exists" in capsys.readouterr().err


def test_a_checkpoint_of_an_older_format_asks_for_conversion(llava_converted, tmp_path):
  old = tmp_path / "old"
  shutil.copytree(llava_converted.folder, old)
  meta = json.loads((old / "wq_config.json").read_text())
  (old / "wq_config.json").write_text(json.dumps({**meta, "version": 1}))
  with pytest.raises(ConversionError, match=r"version 1, expected 'windowquant-jax' version 2; convert the Hugging"):
    load_checkpoint(old)


def test_loading_an_unconverted_folder_is_an_error(llava_hf):
  with pytest.raises(ConversionError, match="not a converted checkpoint"):
    load_checkpoint(llava_hf.folder)


@pytest.mark.parametrize("name", presets.names())
def test_preset_parameter_counts_equal_transformers(name):
  fam, cfg = presets.config(name)
  ours = sum(math.prod(x.shape) for x in jax.tree.leaves(fam.abstract_params(cfg)))
  with torch.device("meta"):
    model = getattr(transformers, fam.hf_architecture)(presets.hf_config(name))
  assert ours == sum(p.numel() for p in model.parameters())
