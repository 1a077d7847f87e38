"""Benchmark loaders: each reads a benchmark's published files into `Question`s, in file order.

What each loader reads, exactly (DIR is `--data`):

nextqa, intentqa
    DIR/test.csv, or DIR/val.csv (`split="val"`; the default takes test.csv when
    it exists). The NExT-QA multiple-choice layout, one question a row: columns
    `video` (IntentQA's release calls it `video_id`; either is read), `question`,
    `a0`..`a4`, `answer` (0-4), `qid` (the question's number within its video)
    and `type` (CW, CH, TN, TC, TP, DB, DC, DL, DO); `frame_count`, `width`,
    `height` are not used. Videos: DIR/videos/<video>.mp4, or, when
    DIR/map_vid_vidorID.json exists (NExT-QA's release), DIR/videos/<map[video]>.mp4.
    Id "<video>_<qid>".
egoschema
    DIR/questions.json (the EgoSchema release): a list of objects with `q_uid`,
    `question`, `option 0`..`option 4`. DIR/subset_answers.json, when present:
    {q_uid: answer index} for the 500-question subset whose answers are public.
    Videos DIR/videos/<q_uid>.mp4. `split="subset"` keeps the questions with a
    public answer; the default ("full") keeps all, type "subset" or "hidden",
    and the command line writes a submission file (q_uid,answer) for them. Id: q_uid.
mvbench
    DIR/json/<task>.json for MVBench's 20 tasks (OpenGVLab/MVBench): a list of
    objects with `video`, `question`, `candidates` (the options), `answer` (the
    correct candidate's text) and, for the STAR, STA and TVQA tasks, `start` and
    `end` (seconds). Videos DIR/video/<prefix>/<video>, with MVBench's own prefix
    per task (`MVBENCH_TASKS`); Episodic Reasoning's <video> is a folder of JPEG
    frames at 3 fps. Tasks whose JSON is absent are skipped. Id "<task>/<index>", type: task.
milebench
    DIR/<Task>/<Task>.json for each MileBench task folder (FreedomIntelligence/MileBench):
    `meta_data.task_instruction` (a list of strings), `meta_data.question_type`
    ("multi-choice" or "open-ended") and `data`, a list of objects with `sample_id`,
    `task_instruction_id`, `task_instance.context` (text with {image#i} / {table#i}
    placeholders), `task_instance.images_path` (files in DIR/<Task>/images/),
    `task_instance.choice_list` (multi-choice) and `response` (the answer's text).
    Id "<Task>/<sample_id>", type: Task. The images are shown to the model as
    the frames of one video placed before the text (our pipeline takes one
    visual block), so {image#i} becomes "<Image i> " as in MileBench's own
    combined-image mode.

Prompts follow each benchmark's evaluation in lmms-eval (NExT-QA, IntentQA and
EgoSchema: "A. option" lines and "Answer with the option's letter from the given
choices directly."; MVBench: "(A) option" lines and "Only give the best option.")
or its own code (MileBench's "Choice list:" and "Your answer is: ").
"""
from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

from wq_jax.eval import scoring

LETTER_PROMPT = "Answer with the option's letter from the given choices directly."
MVBENCH_PROMPT = "Only give the best option."


@dataclasses.dataclass(frozen=True)
class Media:
  """What a question shows: one video file, a folder of frames, or a list of image files."""
  kind: str  # a key of wq_jax.eval.media.LOADERS: "video" | "frames" | "images"
  paths: tuple[str, ...]
  bound: tuple[float, float] | None = None  # (start, end) seconds to sample within
  fps: float | None = None  # frame rate of a folder of frames


@dataclasses.dataclass(frozen=True)
class Question:
  qid: str  # unique within its task
  prompt: str  # the user's text; the chat template is applied by `generate`
  media: Media
  options: tuple[str, ...]  # empty for an open-ended question
  answer: int | str | None  # the option's index; the reference text if open-ended; None if not public
  type: str  # the group the summary reports (question type or subtask)
  metric: str = "choice"  # a key of scoring.METRICS


def _choice_prompt(question: str, options: Sequence[str]) -> str:
  return f"{question.strip()}\n{scoring.option_lines([o.strip() for o in options])}\n{LETTER_PROMPT}"


def _check_unique(task: str, questions: list[Question]) -> list[Question]:
  seen = set()
  for q in questions:
    if q.qid in seen:
      raise ValueError(f"{task}: question id {q.qid!r} appears twice")
    seen.add(q.qid)
  return questions


def _need(path: Path, what: str) -> Path:
  if not path.exists():
    raise FileNotFoundError(f"{what} not found: {path}")
  return path


# ----------------------------------------------------------------------------- NExT-QA, IntentQA


def _csv_split(root: Path, split: str | None) -> Path:
  if split is not None:
    return _need(root / f"{split}.csv", f"the {split} split")
  for name in ("test.csv", "val.csv"):
    if (root / name).exists():
      return root / name
  raise FileNotFoundError(f"neither test.csv nor val.csv in {root}")


def load_nextqa(root: Path, split: str | None = None, subtasks=None) -> list[Question]:
  """NExT-QA multiple choice (and IntentQA, which shares the layout); module docstring."""
  mapping_file = root / "map_vid_vidorID.json"
  mapping = json.loads(mapping_file.read_text()) if mapping_file.exists() else {}
  questions = []
  with open(_csv_split(root, split), newline="") as f:
    for row in csv.DictReader(f):
      video = row.get("video") or row.get("video_id")
      if video is None:
        raise ValueError(f"{f.name} has no `video` (or `video_id`) column")
      options = tuple(row[f"a{i}"] for i in range(5))
      path = root / "videos" / f"{mapping.get(video, video)}.mp4"
      questions.append(Question(
          qid=f"{video}_{row['qid']}", prompt=_choice_prompt(row["question"], options),
          media=Media("video", (str(path),)), options=options, answer=int(row["answer"]), type=row["type"]))
  return _check_unique(str(root), questions)


# ----------------------------------------------------------------------------- EgoSchema


def load_egoschema(root: Path, split: str | None = None, subtasks=None) -> list[Question]:
  """EgoSchema's questions.json with the public subset answers; module docstring."""
  if split not in (None, "full", "subset"):
    raise ValueError(f"egoschema splits are 'full' and 'subset', got {split!r}")
  items = json.loads(_need(root / "questions.json", "EgoSchema questions").read_text())
  answers_file = root / "subset_answers.json"
  answers = json.loads(answers_file.read_text()) if answers_file.exists() else {}
  questions = []
  for item in items:
    uid = item["q_uid"]
    answer = answers.get(uid)
    if split == "subset" and answer is None:
      continue
    options = tuple(item[f"option {i}"] for i in range(5))
    questions.append(Question(
        qid=uid, prompt=_choice_prompt(item["question"], options),
        media=Media("video", (str(root / "videos" / f"{uid}.mp4"),)), options=options,
        answer=None if answer is None else int(answer), type="subset" if answer is not None else "hidden"))
  return _check_unique("egoschema", questions)


# ----------------------------------------------------------------------------- MVBench

# task -> (folder under DIR/video, media kind), from MVBench's own evaluation notebook.
MVBENCH_TASKS: dict[str, tuple[str, str]] = {
    "action_sequence": ("star/Charades_v1_480", "video"),
    "action_prediction": ("star/Charades_v1_480", "video"),
    "action_antonym": ("ssv2_video", "video"),
    "fine_grained_action": ("Moments_in_Time_Raw/videos", "video"),
    "unexpected_action": ("FunQA_test/test", "video"),
    "object_existence": ("clevrer/video_validation", "video"),
    "object_interaction": ("star/Charades_v1_480", "video"),
    "object_shuffle": ("perception/videos", "video"),
    "moving_direction": ("clevrer/video_validation", "video"),
    "action_localization": ("sta/sta_video", "video"),
    "scene_transition": ("scene_qa/video", "video"),
    "action_count": ("perception/videos", "video"),
    "moving_count": ("clevrer/video_validation", "video"),
    "moving_attribute": ("clevrer/video_validation", "video"),
    "state_change": ("perception/videos", "video"),
    "fine_grained_pose": ("nturgbd", "video"),
    "character_order": ("perception/videos", "video"),
    "egocentric_navigation": ("vlnqa", "video"),
    "episodic_reasoning": ("tvqa/frames_fps3_hq", "frames"),
    "counterfactual_inference": ("clevrer/video_validation", "video"),
}
TVQA_FPS = 3.0


def _pick(names: Sequence[str], subtasks: Sequence[str] | None, what: str) -> list[str]:
  if not subtasks:
    return list(names)
  unknown = sorted(set(subtasks) - set(names))
  if unknown:
    raise ValueError(f"unknown {what} {unknown}; known: {sorted(names)}")
  return [n for n in names if n in subtasks]


def load_mvbench(root: Path, split: str | None = None, subtasks=None) -> list[Question]:
  """MVBench's json/<task>.json files; module docstring."""
  _need(root / "json", "MVBench's json folder")
  questions = []
  for task in _pick(list(MVBENCH_TASKS), subtasks, "MVBench tasks"):
    file = root / "json" / f"{task}.json"
    if not file.exists():
      continue
    folder, kind = MVBENCH_TASKS[task]
    for i, item in enumerate(json.loads(file.read_text())):
      options = tuple(item["candidates"])
      bound = (float(item["start"]), float(item["end"])) if "start" in item and "end" in item else None
      prompt = (f"Question:{item['question']}\nOption:\n"
                f"{scoring.option_lines(options, '({letter}) {option}')}\n{MVBENCH_PROMPT}")
      media = Media(kind, (str(root / "video" / folder / item["video"]),), bound=bound,
                    fps=TVQA_FPS if kind == "frames" else None)
      questions.append(Question(qid=f"{task}/{i}", prompt=prompt, media=media, options=options,
                                answer=options.index(item["answer"]), type=task))
  return _check_unique("mvbench", questions)


# ----------------------------------------------------------------------------- MileBench


def _milebench_metric(task: str, question_type: str) -> str:
  """MileBench's evaluate.py: needle tasks and MMCoQA by containment, else by question type."""
  if "NeedleInAHaystack" in task:
    return "needle"
  if "MMCoQA" in task:
    return "contains"
  return {"multi-choice": "choice", "open-ended": "rouge_l"}[question_type]


def load_milebench(root: Path, split: str | None = None, subtasks=None) -> list[Question]:
  """MileBench's <Task>/<Task>.json files; module docstring."""
  names = sorted(p.name for p in root.iterdir() if (p / f"{p.name}.json").is_file()) if root.is_dir() else []
  if not names:
    raise FileNotFoundError(f"no MileBench task folder (<Task>/<Task>.json) in {root}")
  questions = []
  for task in _pick(names, subtasks, "MileBench tasks"):
    core = json.loads((root / task / f"{task}.json").read_text())
    meta = core["meta_data"]
    metric = _milebench_metric(task, meta["question_type"])
    for item in core["data"]:
      inst = item["task_instance"]
      images = tuple(str(root / task / "images" / p) for p in inst["images_path"])
      context = meta["task_instruction"][item["task_instruction_id"]] + "\n" + inst["context"]
      for i in range(len(images)):
        context = context.replace(f"{{image#{i + 1}}}", f"<Image {i + 1}> ")
        context = context.replace(f"{{table#{i + 1}}}", f"<Image {i + 1}> ")
      options = tuple(inst.get("choice_list", ()))
      answer = str(item["response"])
      if metric == "choice":
        context += f"\nChoice list: \n{scoring.option_lines(options)}\nYour answer is: "
        answer = options.index(answer)
      questions.append(Question(qid=f"{task}/{item['sample_id']}", prompt=context,
                                media=Media("images", images), options=options, answer=answer, type=task,
                                metric=metric))
  return _check_unique("milebench", questions)


# ----------------------------------------------------------------------------- registry

TASKS: dict[str, Callable[..., list[Question]]] = {
    "nextqa": load_nextqa,
    "intentqa": load_nextqa,
    "egoschema": load_egoschema,
    "mvbench": load_mvbench,
    "milebench": load_milebench,
}


def load(task: str, root, *, split: str | None = None, subtasks: Sequence[str] | None = None) -> list[Question]:
  """The questions of `task` under the folder `root` (module docstring)."""
  if task not in TASKS:
    raise ValueError(f"unknown task {task!r}; known: {sorted(TASKS)}")
  root = Path(root)
  _need(root, f"the {task} data folder")
  return TASKS[task](root, split=split, subtasks=subtasks)
