"""Conversion tables by HF `model_type` (the keys of `models.registry`): config -> `Table`."""
from __future__ import annotations

from typing import Any, Callable

from convert.framework import Table
from convert.tables import internvl, llava, llava_onevision, qwen2_vl

TABLES: dict[str, Callable[[Any], Table]] = {
    "internvl": internvl.table,
    "internvl_chat": internvl.table,
    "llava": llava.table,
    "llava_next": llava.table,
    "llava_onevision": llava_onevision.table,
    "qwen2_vl": qwen2_vl.table,
    "qwen2_5_vl": qwen2_vl.table,
}
