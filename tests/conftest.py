"""Shared fixtures: a tiny LLaVA-OneVision saved as an HF folder, and its conversion (session-scoped)."""
from __future__ import annotations

import types

import jax
import pytest

from convert.__main__ import main as convert_main
from convert.checkpoint import load_checkpoint
from models import testing

# Tests compare float32 results at tight tolerances; on GPUs the default matmul precision is TF32.
jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(scope="session")
def tiny_tokenizer():
  return testing.tiny_tokenizer()


@pytest.fixture(scope="session")
def llava_hf(tmp_path_factory):
  """(transformers model in float32 eval mode, its saved HF folder)."""
  folder = tmp_path_factory.mktemp("llava_onevision_hf")
  model = testing.save_tiny_llava_onevision(folder, seed=0)
  return types.SimpleNamespace(model=model, folder=folder)


@pytest.fixture(scope="session")
def llava_converted(llava_hf, tmp_path_factory):
  """The HF folder through `python -m convert --dtype float32` and `load_checkpoint`."""
  out = tmp_path_factory.mktemp("llava_onevision_converted") / "ckpt"
  assert convert_main([str(llava_hf.folder), str(out), "--dtype", "float32", "--quiet"]) == 0
  params, cfg, files = load_checkpoint(out)
  return types.SimpleNamespace(params=params, cfg=cfg, files=files, folder=out)
