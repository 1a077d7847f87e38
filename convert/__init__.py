"""Hugging Face checkpoints -> our params: `python -m convert SRC_DIR OUT_DIR [--dtype ...]`.

`convert_checkpoint` writes a converted folder; `load_checkpoint` reads it back
as (params, family config, files). Tables of tensor names live in
`convert.tables`, one per model family.
"""
from convert.checkpoint import CheckpointFiles, convert_checkpoint, load_checkpoint
from convert.framework import ConversionError

__all__ = ["CheckpointFiles", "ConversionError", "convert_checkpoint", "load_checkpoint"]
