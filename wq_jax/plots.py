"""Charts of a plan: each window's similarity to the prompt, and the layer x window bit widths."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_plan(scores: np.ndarray, plan: np.ndarray, path, title: str = "") -> Path:
  """Writes a PNG: similarity per window (top) over the layer x window bit-plan heatmap (bottom)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.colors import ListedColormap

  scores = np.atleast_2d(scores)
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                    gridspec_kw={"height_ratios": [1, 2]}, constrained_layout=True)
  windows = np.arange(plan.shape[1])
  for b, row in enumerate(scores):
    top.plot(windows, row, marker=".", lw=1, label=f"request {b}" if len(scores) > 1 else None)
  top.set_ylabel("similarity (Eq. 8)")
  if len(scores) > 1:
    top.legend(fontsize="small")
  codes = np.select([plan == 2, plan == 4, plan == 16], [0, 1, 2])
  cmap = ListedColormap(["#d7301f", "#fdae61", "#1a9850"])
  image = bottom.imshow(codes, aspect="auto", cmap=cmap, vmin=-0.5, vmax=2.5, interpolation="nearest")
  bar = fig.colorbar(image, ax=bottom, ticks=[0, 1, 2])
  bar.ax.set_yticklabels(["INT2", "INT4", "16-bit"])
  bottom.set_xlabel("window (original order)")
  bottom.set_ylabel("layer")
  if title:
    fig.suptitle(title)
  path = Path(path)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
