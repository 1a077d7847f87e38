"""Conversion as data: a table from our parameter paths to Hugging Face tensor names.

A `Rule` maps one leaf of our param tree ("decoder/layers/q/w") to one HF
tensor name, after the table's `renames` have put HF names in canonical form.
A name with "{l}" is one tensor a layer, stacked along the leading L axis of
the leaf. A rule's hook turns the HF tensor into our layout; each hook also
says which HF shape it expects for a given target shape, so every shape is
checked from the file headers before any data is read.

A rule may fill one `part` of its leaf, a range along one axis (of a layer's
slice, for a stacked leaf): our fused weights take several HF tensors, as q, k
and v fill one [D, K, G+2, H] projection.

Accounting is strict: every leaf of the `eval_shape` tree gets exactly one
rule, or parts that tile one of its axes; every HF tensor is used (a fused
tensor by one rule per part) or matches one of the table's `ignore` patterns,
and a failure lists everything missing, left over or misshapen.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable, Mapping, NamedTuple

import jax
import numpy as np

Shape = tuple[int, ...]


class ConversionError(Exception):
  """A checkpoint that does not fit the family's table; the message names every problem."""


@dataclasses.dataclass(frozen=True)
class Hook:
  """HF tensor -> our layout, with the HF shape it expects for a target (per-layer) shape."""
  name: str
  hf_shape: Callable[[Shape], Shape]
  apply: Callable[[np.ndarray, Shape], np.ndarray]


def _prod(shape: Iterable[int]) -> int:
  return int(np.prod(tuple(shape), dtype=np.int64))


HOOKS: dict[str, Hook] = {h.name: h for h in (
    Hook("identity", lambda s: s, lambda x, s: x),
    # nn.Linear weight [E, D] -> [D, E].
    Hook("linear", lambda s: (s[1], s[0]), lambda x, s: x.T),
    # nn.Linear weight [N*H, D] -> [D, N, H]: split the output into heads (or into any trailing axes).
    Hook("linear_to_heads", lambda s: (_prod(s[1:]), s[0]), lambda x, s: x.T.reshape(s)),
    # nn.Linear weight [D, N*H] -> [N, H, D]: the output projection reads heads.
    Hook("linear_from_heads", lambda s: (s[-1], _prod(s[:-1])), lambda x, s: x.T.reshape(s)),
    # bias [N*H] -> [N, H].
    Hook("split_heads", lambda s: (_prod(s),), lambda x, s: x.reshape(s)),
    # nn.Conv2d / Conv3d weight [E, C, ...] -> [C, ..., E].
    Hook("conv", lambda s: (s[-1], *s[:-1]), lambda x, s: np.moveaxis(x, 0, -1)),
)}


@dataclasses.dataclass(frozen=True)
class Rule:
  path: str  # our leaf, "/"-separated
  hf: str  # canonical HF name; "{l}" = layer index, stacked along the leaf's axis 0
  hook: str | Hook = "identity"  # a name in HOOKS, or a table's own Hook (e.g. one that knows the head count)
  # (axis, start, stop): the rule fills [start, stop) of that axis of the leaf (of a layer's slice if stacked)
  part: tuple[int, int, int] | None = None

  @property
  def stacked(self) -> bool:
    return "{l}" in self.hf

  def region(self, shape: Shape) -> tuple[slice, ...]:
    """The index of this rule's part of an array of `shape` (the whole of it without a part)."""
    if self.part is None:
      return (slice(None),) * len(shape)
    axis, start, stop = self.part
    return (slice(None),) * axis + (slice(start, stop),)

  def target_shape(self, shape: Shape) -> Shape:
    """The shape of this rule's part of an array of `shape`."""
    if self.part is None:
      return tuple(shape)
    axis, start, stop = self.part
    return (*shape[:axis], stop - start, *shape[axis + 1:])


@dataclasses.dataclass(frozen=True)
class Table:
  rules: tuple[Rule, ...]
  renames: tuple[tuple[str, str], ...] = ()  # (regex, replacement) applied in order to HF names
  ignore: tuple[str, ...] = ()  # regexes of HF tensors that are deliberately not converted

  def canonical(self, name: str) -> str:
    for pattern, repl in self.renames:
      name = re.sub(pattern, repl, name)
    return name

  def ignored(self, canonical_name: str) -> bool:
    return any(re.fullmatch(p, canonical_name) for p in self.ignore)


class Assignment(NamedTuple):
  """One HF tensor into one leaf (or one layer slice of a stacked leaf), or into a part of it."""
  path: str
  layer: int | None
  hf_name: str  # the name as stored in the checkpoint
  hook: Hook
  region: tuple[slice, ...] = ()  # of the leaf (or layer slice); () is all of it


def tree_paths(tree) -> dict[str, object]:
  """{"a/b/c": leaf} for a nested-dict pytree."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(k.key) for k in path): leaf for path, leaf in flat}


def set_path(tree: dict, path: str, value) -> None:
  *parents, last = path.split("/")
  for p in parents:
    tree = tree.setdefault(p, {})
  tree[last] = value


def plan(table: Table, abstract, hf_shapes: Mapping[str, Shape]) -> list[Assignment]:
  """Matches every leaf of `abstract` (ShapeDtypeStructs) to HF tensors, checking names and shapes.

  hf_shapes maps the checkpoint's own tensor names to their shapes. Raises
  ConversionError listing every missing, unused or misshapen tensor.
  """
  leaves = tree_paths(abstract)
  canonical: dict[str, str] = {}
  problems: list[str] = []
  for name in hf_shapes:
    c = table.canonical(name)
    if c in canonical:
      problems.append(f"two tensors map to {c!r}: {canonical[c]!r} and {name!r}")
    canonical[c] = name

  ruled: dict[str, list[Rule]] = {}
  for rule in table.rules:
    ruled.setdefault(rule.path, []).append(rule)
  for path in sorted(set(ruled) - set(leaves)):
    problems.append(f"table bug: rule for unknown parameter {path!r}")
  for path, rules in ruled.items():
    if path in leaves:
      problems += _coverage(path, rules, leaves[path].shape)
  no_rule = sorted(set(leaves) - set(ruled))

  assignments, missing, shapes, used = [], [], [], set()
  for path, leaf in leaves.items():
    for rule in ruled.get(path, ()):
      _assign(rule, path, leaf, canonical, hf_shapes, assignments, missing, shapes, used)
  extra = sorted(canonical[c] for c in canonical if c not in used and not table.ignored(c))

  if no_rule:
    problems.append("parameters missing (no rule in the table): " + ", ".join(no_rule))
  if missing:
    problems.append(f"{len(missing)} tensor(s) missing from the checkpoint:\n  " + "\n  ".join(missing))
  if extra:
    problems.append(f"{len(extra)} tensor(s) in the checkpoint left unused:\n  " + "\n  ".join(extra))
  if shapes:
    problems.append(f"{len(shapes)} tensor(s) with the wrong shape:\n  " + "\n  ".join(shapes))
  if problems:
    raise ConversionError("\n".join(problems))
  return assignments


def _coverage(path: str, rules: list[Rule], shape: Shape) -> list[str]:
  """Table bugs of one leaf's rules: more than one without parts, or parts that do not tile one axis."""
  if len(rules) == 1 and rules[0].part is None:
    return []
  if any(r.part is None for r in rules):
    return [f"table bug: two rules for parameter {path!r}"]
  axes = {r.part[0] for r in rules}
  stacked = {r.stacked for r in rules}
  if len(axes) != 1 or len(stacked) != 1:
    return [f"table bug: the parts of {path!r} are not ranges of one axis"]
  axis = axes.pop()
  size = (shape[1:] if stacked.pop() else shape)[axis]
  covered = sorted((r.part[1], r.part[2]) for r in rules)
  ends = [0] + [stop for _, stop in covered]
  if [start for start, _ in covered] != ends[:-1] or ends[-1] != size:
    return [f"table bug: the parts of {path!r} do not tile axis {axis} of size {size}: {covered}"]
  return []


def _assign(rule, path, leaf, canonical, hf_shapes, assignments, missing, shapes, used) -> None:
  """Plans one rule (a tensor a layer if stacked), adding to the lists of what `plan` reports."""
  hook = rule.hook if isinstance(rule.hook, Hook) else HOOKS[rule.hook]
  layer_ids = range(leaf.shape[0]) if rule.stacked else (None,)
  whole = tuple(leaf.shape[1:]) if rule.stacked else tuple(leaf.shape)
  target = rule.target_shape(whole)
  region = rule.region(whole) if rule.part else ()
  for l in layer_ids:
    c = rule.hf.format(l=l) if rule.stacked else rule.hf
    if c not in canonical:
      missing.append(f"{c} (for {path}{'' if l is None else f' layer {l}'})")
      continue
    used.add(c)
    want, got = tuple(hook.hf_shape(target)), tuple(hf_shapes[canonical[c]])
    if want != got:
      shapes.append(f"{canonical[c]}: shape {got}, expected {want} for {path} (hook {hook.name})")
      continue
    assignments.append(Assignment(path, l, canonical[c], hook, region))


def fill(
    assignments: Iterable[Assignment],
    abstract,
    read: Callable[[str], np.ndarray],
    dtype,
    progress: Callable[[int], object] | None = None,
) -> dict:
  """Builds the numpy param tree, reading one HF tensor at a time into preallocated leaves."""
  leaves = tree_paths(abstract)
  out = {path: np.empty(leaf.shape, dtype) for path, leaf in leaves.items()}
  for a in assignments:
    x = read(a.hf_name)
    target = out[a.path] if a.layer is None else out[a.path][a.layer]
    if a.region:
      target = target[a.region]  # a basic-slicing view: writing it fills the leaf
    target[...] = a.hook.apply(x, target.shape).astype(dtype, copy=False)
    if progress is not None:
      progress(1)
  tree: dict = {}
  for path, value in out.items():
    set_path(tree, path, value)
  return tree


def convert_tensors(table: Table, abstract, tensors: Mapping[str, np.ndarray], dtype=np.float32) -> dict:
  """In-memory conversion of a {HF name: array} dict (a state dict), with the same checks."""
  assignments = plan(table, abstract, {k: tuple(v.shape) for k, v in tensors.items()})
  return fill(assignments, abstract, lambda name: np.asarray(tensors[name]), dtype)
