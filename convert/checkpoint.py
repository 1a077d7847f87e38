"""HF folder -> converted checkpoint, and back into params.

A converted checkpoint is a folder:

    params/            orbax checkpoint of the numpy param tree
    wq_config.json     {"format", "version", "model_type", "dtype", "config" (parsed), "hf_config"}
    tokenizer, processor, chat template and generation files copied from the HF folder

Tensors stream from the safetensors files one at a time (memory-mapped by
`safe_open`) into preallocated leaves, and orbax writes those leaves in place,
so host memory holds one copy of the model in the target dtype plus one
tensor (the mapped file pages are page cache, reclaimable). The folder is written under a
temporary name and renamed at the end: a failure leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from convert import tables
from convert.framework import ConversionError, fill, plan, set_path, tree_paths
from models import registry

# Version 2: the decoder's attention output weight is [L, N*H, D] (version 1: [L, N, H, D]), q, k and v are
# one [L, D, K, G+2, H] weight and gate and up one [L, D, 2, F] (version 1: five).
FORMAT, VERSION = "windowquant-jax", 2
WQ_CONFIG, PARAMS = "wq_config.json", "params"
DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
          "float32": np.dtype(np.float32)}
# Copied verbatim when present: what the tokenizer and processors need.
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.json", "chat_template.jinja",
    "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
    "generation_config.json",
)


@dataclasses.dataclass(frozen=True)
class CheckpointFiles:
  root: Path  # the converted folder; tokenizer and processor files sit here
  params: Path
  files: tuple[str, ...]  # the side files present


def read_hf_config(src: Path) -> dict:
  path = src / "config.json"
  if not src.is_dir():
    raise ConversionError(f"{src}: not a folder")
  if not path.is_file():
    raise ConversionError(f"{path}: no config.json in the checkpoint folder")
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{path}: not valid JSON ({e})") from e


def _family(hf_config: dict, where: Path):
  model_type = hf_config.get("model_type")
  if model_type not in registry.FAMILIES or model_type not in tables.TABLES:
    raise ConversionError(f"{where}: unknown model family model_type={model_type!r}; "
                          f"known: {', '.join(registry.known())}")
  return registry.get(model_type), tables.TABLES[model_type]


def safetensors_index(src: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
  """{tensor name: (file, shape)} from the headers of every (possibly sharded) safetensors file."""
  index_file = src / "model.safetensors.index.json"
  if index_file.is_file():
    try:
      weight_map = json.loads(index_file.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise ConversionError(f"{index_file}: unreadable shard index ({e!r})") from e
    files = sorted({src / f for f in weight_map.values()})
  else:
    weight_map, files = None, sorted(src.glob("*.safetensors"))
  if not files:
    raise ConversionError(f"{src}: no *.safetensors files (PyTorch .bin checkpoints are not supported)")
  found: dict[str, tuple[Path, tuple[int, ...]]] = {}
  for f in files:
    if not f.is_file():
      raise ConversionError(f"{f}: listed in {index_file.name} but missing")
    try:
      with safe_open(f, framework="np") as st:
        for name in st.keys():
          if name in found:
            raise ConversionError(f"{f}: tensor {name!r} also in {found[name][0].name}")
          found[name] = (f, tuple(st.get_slice(name).get_shape()))
    except SafetensorError as e:
      raise ConversionError(f"{f}: truncated or corrupt safetensors file ({e})") from e
  if weight_map is not None:
    absent = sorted(n for n, f in weight_map.items() if found.get(n, (None,))[0] != src / f)
    if absent:
      raise ConversionError(f"{index_file}: {len(absent)} indexed tensor(s) not in their shard: "
                            + ", ".join(absent[:20]))
  return found


def _save_params(path: Path, params: dict) -> None:
  """A synchronous orbax save that adds no second copy of the tree: numpy leaves are written
  in place (no defensive deepcopy) and without OCDBT, whose write buffers would hold one."""
  registry_ = ocp.type_handlers.create_type_handler_registry(
      (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
      (jax.Array, ocp.type_handlers.ArrayHandler()))  # unused; orbax warns when it is absent
  handler = ocp.PyTreeCheckpointHandler(use_ocdbt=False, type_handler_registry=registry_)
  ocp.Checkpointer(handler).save(path, args=ocp.args.PyTreeSave(params))


def convert_checkpoint(src, out, dtype: str = "bfloat16", progress: bool = True) -> Path:
  """Converts the HF folder `src` into `out` (which must not exist). Raises ConversionError."""
  src, out = Path(src), Path(out).absolute()
  if dtype not in DTYPES:
    raise ConversionError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
  if out.exists():
    raise ConversionError(f"{out}: already exists; remove it or choose another output folder")
  hf_config = read_hf_config(src)
  family, make_table = _family(hf_config, src / "config.json")
  try:
    cfg = family.parse_config(hf_config)
  except (KeyError, TypeError, ValueError) as e:
    raise ConversionError(f"{src / 'config.json'}: cannot parse the {family.model_type} config ({e!r})") from e
  abstract = family.abstract_params(cfg, DTYPES[dtype])
  index = safetensors_index(src)
  try:
    assignments = plan(make_table(cfg), abstract, {n: shape for n, (_, shape) in index.items()})
  except ConversionError as e:
    raise ConversionError(f"{src}: checkpoint does not match the {family.model_type} config:\n{e}") from e
  assignments.sort(key=lambda a: (str(index[a.hf_name][0]), a.hf_name))

  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
  try:
    with contextlib.ExitStack() as stack, tqdm(total=len(assignments), desc=f"converting {src.name}",
                                               unit="tensor", disable=not progress) as bar:
      handles = {f: stack.enter_context(safe_open(f, framework="np")) for f in {f for f, _ in index.values()}}

      def read(name: str) -> np.ndarray:
        try:
          return handles[index[name][0]].get_tensor(name)
        except SafetensorError as e:
          raise ConversionError(f"{index[name][0]}: cannot read {name!r} ({e})") from e

      params = fill(assignments, abstract, read, DTYPES[dtype], progress=bar.update)
    _save_params(tmp / PARAMS, params)
    del params
    meta = {"format": FORMAT, "version": VERSION, "model_type": family.model_type, "dtype": dtype,
            "config": dataclasses.asdict(cfg), "hf_config": hf_config}
    (tmp / WQ_CONFIG).write_text(json.dumps(meta, indent=2))
    for name in SIDE_FILES:
      if (src / name).is_file():
        shutil.copy2(src / name, tmp / name)
    os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out


def load_checkpoint(path) -> tuple[dict, Any, CheckpointFiles]:
  """(params on the default device, the family config, the folder's files) of a converted checkpoint."""
  root = Path(path).absolute()
  meta_file = root / WQ_CONFIG
  if not meta_file.is_file() or not (root / PARAMS).is_dir():
    raise ConversionError(f"{root}: not a converted checkpoint (no {WQ_CONFIG} and {PARAMS}/); "
                          f"convert a Hugging Face folder first: python -m convert SRC_DIR {root}")
  try:
    meta = json.loads(meta_file.read_text())
  except json.JSONDecodeError as e:
    raise ConversionError(f"{meta_file}: not valid JSON ({e})") from e
  if meta.get("format") != FORMAT or meta.get("version") != VERSION:
    raise ConversionError(f"{meta_file}: format {meta.get('format')!r} version {meta.get('version')!r}, "
                          f"expected {FORMAT!r} version {VERSION}; convert the Hugging Face folder again: "
                          f"python -m convert SRC_DIR NEW_DIR")
  family, _ = _family(meta["hf_config"], meta_file)
  cfg = family.parse_config(meta["hf_config"])
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                        family.abstract_params(cfg, DTYPES[meta["dtype"]]))
  # Straight into device arrays, one leaf at a time, so the host holds at most one leaf
  # in flight (restoring the whole tree at once buffered every leaf: a 7B model did not
  # fit 23 GB of host memory on CPU; leaf by leaf it peaks at 20 GB).
  ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
  params: dict = {}
  for path, leaf in tree_paths(target).items():
    one: dict = {}
    set_path(one, path, leaf)
    restored = ckptr.restore(root / PARAMS, args=ocp.args.PyTreeRestore(
        item=one, restore_args=ocp.checkpoint_utils.construct_restore_args(one), partial_restore=True))
    set_path(params, path, tree_paths(restored)[path])
  files = tuple(n for n in SIDE_FILES if (root / n).is_file())
  return params, cfg, CheckpointFiles(root, root / PARAMS, files)
