"""`python -m wq_jax.eval`: each benchmark's loader on synthetic files in its published layout,
the scoring rules, and resumable, loss-free, data-parallel runs on a tiny converted LLaVA-OneVision.

The media (mp4s, JPEG frame folders, images) are written at test time. The 4-device runs go
through subprocesses: XLA_FLAGS must be set before jax starts, and this process has started it.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wq_jax
from wq_jax import video as video_io
from wq_jax.eval import runner, scoring, tasks
from wq_jax.eval.__main__ import main as eval_main
from wq_jax.eval.__main__ import method_config
from wq_jax.eval.media import load_media

DATA = Path(__file__).parent / "data" / "eval"
REPO = Path(__file__).parent.parent
BAD, MISSING = "2435100235", "8968804598"  # NExT-QA videos written as junk, and not written at all
FRAMES = 4
SMALL_WINDOWS = wq_jax.WindowQuantConfig(window_size=8)  # 4 frames x 9 tokens + 1 = 37 visual tokens


def make_media(questions, skip=()):
  """Writes every file the questions show, except those whose path contains a name in `skip`."""
  for i, q in enumerate(questions):
    for j, path in enumerate(map(Path, q.media.paths)):
      if any(s in str(path) for s in skip) or path.exists():
        continue
      path.parent.mkdir(parents=True, exist_ok=True)
      if q.media.kind == "video":
        video_io.write_test_video(path, video_io.synthetic_frames(16, 48, 64, seed=i))
      elif q.media.kind == "frames":
        path.mkdir()
        for k, frame in enumerate(video_io.synthetic_frames(12, 48, 64, seed=i)):
          Image.fromarray(frame).save(path / f"{k + 1:05d}.jpg")
      else:  # images of two sizes: the loader must bring them to one
        Image.fromarray(video_io.synthetic_frames(1, 40 + 8 * (j % 2), 56, seed=j)[0]).save(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("eval_data")
  shutil.copytree(DATA, root, dirs_exist_ok=True)
  for task in ("nextqa", "intentqa", "egoschema", "mvbench", "milebench"):
    make_media(tasks.load(task, root / task), skip=(BAD, MISSING))
  (root / "nextqa" / "videos" / f"{BAD}.mp4").write_bytes(b"not a video at all" * 20)
  return root


@pytest.fixture(scope="module")
def model(llava_converted):
  return wq_jax.load(llava_converted.folder)


# ----------------------------------------------------------------------------- loaders


def test_nextqa_loader(data):
  qs = tasks.load("nextqa", data / "nextqa")
  assert [q.qid for q in qs] == ["4010069381_0", "4010069381_1", "5555301483_0", "5555301483_1", f"{BAD}_0",
                                 f"{MISSING}_0"]
  assert [q.answer for q in qs] == [2, 0, 1, 3, 4, 2]
  assert [q.type for q in qs] == ["CW", "TN", "DC", "DL", "CW", "TP"]
  q = qs[0]
  assert q.options[2] == "unwrap it" and q.metric == "choice"
  assert q.prompt.startswith("why did the boy pick up one present")
  assert "\nA. share with the girl\nB. approach lady sitting there\n" in q.prompt
  assert q.prompt.endswith(tasks.LETTER_PROMPT)
  assert q.media == tasks.Media("video", (str(data / "nextqa" / "videos" / "4010069381.mp4"),))
  with pytest.raises(FileNotFoundError, match="val"):
    tasks.load("nextqa", data / "nextqa", split="val")


def test_intentqa_loader_reads_the_video_id_column(data):
  qs = tasks.load("intentqa", data / "intentqa")
  assert [(q.qid, q.answer, q.type) for q in qs] == [("3238737531_3", 1, "CW"), ("3238737531_5", 0, "CH"),
                                                     ("6233408665_2", 3, "TP")]
  assert load_media(qs[2].media, FRAMES).shape == (FRAMES, 48, 64, 3)


def test_egoschema_loader_keeps_hidden_answers_apart(data):
  qs = tasks.load("egoschema", data / "egoschema")
  assert [q.answer for q in qs] == [3, 1, None]
  assert [q.type for q in qs] == ["subset", "subset", "hidden"]
  assert qs[0].qid == "001934bb-81bd-4cd8-a574-0472ef3f6678"
  assert "\nD. C is cleaning dishes.\n" in qs[0].prompt
  assert [q.qid for q in tasks.load("egoschema", data / "egoschema", split="subset")] == [q.qid for q in qs[:2]]


def test_mvbench_loader_bounds_and_frame_folders(data):
  qs = tasks.load("mvbench", data / "mvbench")
  assert [q.qid for q in qs] == ["action_sequence/0", "action_sequence/1", "object_shuffle/0",
                                 "episodic_reasoning/0"]
  assert [q.answer for q in qs] == [0, 2, 2, 2]
  assert "Option:\n(A) Ate the medicine.\n(B) Tidied up the blanket." in qs[0].prompt
  assert qs[0].media.paths[0].endswith("video/star/Charades_v1_480/ZS9XR.mp4")
  assert qs[0].media.bound == (0.5, 1.5) and qs[2].media.bound is None
  # 16 frames at 8 fps: 0.5-1.5 s is frames 4..12; the TVQA folder (12 JPEGs at 3 fps), 1-3 s is frames 3..9.
  assert load_media(qs[0].media, None).shape[0] == 9
  assert load_media(qs[2].media, None).shape[0] == 16
  assert qs[3].media.kind == "frames" and load_media(qs[3].media, None).shape[0] == 7
  assert load_media(qs[3].media, FRAMES).shape == (FRAMES, 48, 64, 3)
  assert [q.type for q in tasks.load("mvbench", data / "mvbench", subtasks=["object_shuffle"])] == ["object_shuffle"]
  with pytest.raises(ValueError, match="unknown MVBench tasks"):
    tasks.load("mvbench", data / "mvbench", subtasks=["no_such_task"])


def test_milebench_loader_choice_and_open_ended(data):
  qs = tasks.load("milebench", data / "milebench")
  assert [(q.qid, q.metric) for q in qs] == [("ActionSequence/0", "choice"), ("ActionSequence/1", "choice"),
                                             ("CLEVR-Change/7", "rouge_l")]
  assert qs[1].answer == 2 and qs[2].answer == "the small cyan metal cylinder changed to red."
  assert "<Image 1> <Image 2> <Image 3> \nQuestion" in qs[0].prompt and "{image#" not in qs[2].prompt
  assert qs[0].prompt.endswith("D. Took the box.\nYour answer is: ")
  frames = load_media(qs[1].media, None)  # images of two sizes stack at the first one's size
  assert frames.shape == (4, 40, 56, 3) and frames.dtype == np.uint8
  assert load_media(qs[1].media, 8).shape[0] == 8


# ----------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("reply, want", [
    ("C", 2), ("C.", 2), ("(B) approach lady sitting there", 1), ("The answer is E.", 4), ("D. cry", 3),
    ("unwrap it", 2), ("I think the boy wants to unwrap it because he is curious", 2), ("", None),
    ("no idea", None), ("A or maybe (D)", 3),
])
def test_parse_choice(reply, want):
  options = ["share with the girl", "approach lady sitting there", "unwrap it", "playing with toy train", "cry"]
  assert scoring.parse_choice(reply, options) == want


def test_open_ended_metrics():
  # LCS of "the cat is on the mat" and "the cat sat on the mat": {the, cat, on, mat}, 4 of 5 distinct words each.
  assert scoring.rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(0.8, abs=1e-6)
  assert scoring.normalize("The Cube, (red)!") == "the cube red"
  assert scoring.judge("rouge_l", "", (), "a red cube")[1] == 0.0
  assert scoring.judge("needle", "The password is 7421.", (), "7421")[1] == 1.0
  assert scoring.judge("needle", "The password is 74210.", (), "7421")[1] == 0.0
  assert scoring.judge("contains", "it is the 74210 one", (), "7421")[1] == 1.0


def test_method_config_from_the_command_line():
  name, config, label = method_config("windowquant:alpha=1,reorder=false", {"window_size": "8"})
  assert (name, label) == ("windowquant", "windowquant:window_size=8,alpha=1,reorder=false")
  assert config == wq_jax.WindowQuantConfig(alpha=1.0, reorder=False, window_size=8)
  assert method_config("kivi2", {"alpha": "3"}) == ("kivi2", None, "kivi2")
  with pytest.raises(ValueError, match="has no"):
    method_config("fp16:alpha=3", {})


def test_summary_counts_errors_apart():
  row = lambda qid, t, score, error=None: {"qid": qid, "method": "m", "type": t, "score": score, "error": error,
                                           "bits": {"16": 1, "4": 1, "2": 2}}
  s = runner.summarize([row("a", "CW", 1.0), row("b", "CW", 0.0), row("c", "TN", 1.0), row("d", "TN", None, "x")])
  assert s["m"]["overall"] == {"questions": 4, "scored": 3, "errors": 1, "accuracy": pytest.approx(200 / 3)}
  assert s["m"]["types"]["CW"]["accuracy"] == 50.0 and s["m"]["mean_of_types"] == 75.0
  assert s["m"]["window_share"] == {"16": 0.25, "4": 0.25, "2": 0.5}
  assert "overall" in runner.comparison_table(s)


def test_a_torn_last_line_is_cut_off(tmp_path):
  out = tmp_path / "r.jsonl"
  runner.append_rows(out, [{"qid": "a"}, {"qid": "b"}])
  with open(out, "a") as f:
    f.write('{"qid": "c", "pred')
  assert runner.read_rows(out) == [{"qid": "a"}, {"qid": "b"}]
  assert out.read_text().endswith('"b"}\n')


# ----------------------------------------------------------------------------- runs on the tiny model


def _cfg(method, config=None, **kw):
  return runner.RunConfig(task="nextqa", method=method, config=config, num_frames=FRAMES, batch_size=2,
                          max_new_tokens=4, **kw)


RUNS = (("fp16", None), ("windowquant", SMALL_WINDOWS))


# The reference run's tests on one worker (`--dist loadgroup`): each worker would run it again.
uses_reference = pytest.mark.xdist_group("eval_reference")


@pytest.fixture(scope="module")
def reference(model, data, tmp_path_factory):
  """An uninterrupted run of all six NExT-QA questions, fp16 and windowquant: (output path, rows)."""
  out = tmp_path_factory.mktemp("reference") / "r.jsonl"
  qs = tasks.load("nextqa", data / "nextqa")
  for method, config in RUNS:
    runner.run_task(model, qs, _cfg(method, config), out, progress=False)
  return out, runner.read_rows(out)


@uses_reference
def test_bad_videos_become_error_rows_and_the_run_goes_on(reference):
  _, rows = reference
  assert len(rows) == 12
  by = {(r["method"], r["qid"]): r for r in rows}
  for method, _ in RUNS:
    assert by[method, f"{BAD}_0"]["error"].startswith("VideoDecodeError")
    assert by[method, f"{MISSING}_0"]["error"].startswith("FileNotFoundError")
    good = [r for r in rows if r["method"] == method and r["error"] is None]
    assert len(good) == 4
    for r in good:
      assert r["score"] in (0.0, 1.0) and r["correct"] == (r["prediction"] == r["answer"])
      assert sum(r["bits"].values()) == {"fp16": 2 * 1, "windowquant": 2 * 4}[method]  # layers x windows
  assert by["fp16", "4010069381_0"]["bits"] == {"16": 2, "4": 0, "2": 0}


@uses_reference
def test_a_resumed_run_gives_the_rows_of_an_uninterrupted_one(model, data, reference, tmp_path):
  ref_out, ref_rows = reference
  out = tmp_path / "r.jsonl"
  qs = tasks.load("nextqa", data / "nextqa")
  for method, config in RUNS:
    runner.run_task(model, qs[:2], _cfg(method, config), out, progress=False)
    runner.run_task(model, qs, _cfg(method, config), out, progress=False)
  assert runner.read_rows(out) == ref_rows
  before = out.read_bytes()
  runner.run_task(model, qs, _cfg("fp16"), out, progress=False)
  assert out.read_bytes() == before  # nothing left to do, nothing written
  with pytest.raises(ValueError, match="frames=4"):
    runner.run_task(model, qs, runner.RunConfig(task="nextqa", method="fp16", num_frames=8), out, progress=False)


@uses_reference
def test_retry_errors_replaces_the_error_row(model, data, reference, tmp_path):
  root = tmp_path / "nextqa"
  shutil.copytree(data / "nextqa", root)
  out = tmp_path / "r.jsonl"
  shutil.copy(reference[0], out)
  qs = tasks.load("nextqa", root)
  (root / "videos" / f"{BAD}.mp4").unlink()
  make_media(qs, skip=(MISSING,))
  runner.run_task(model, qs, _cfg("fp16"), out, retry_errors=True, progress=False)
  rows = [r for r in runner.read_rows(out) if r["method"] == "fp16"]
  assert sorted(r["qid"] for r in rows) == sorted(q.qid for q in qs)
  fixed = {r["qid"]: r for r in rows}
  assert fixed[f"{BAD}_0"]["error"] is None and fixed[f"{MISSING}_0"]["error"].startswith("FileNotFoundError")


def test_loglik_scoring_picks_the_letter_with_the_largest_prefill_logit(model, data, tmp_path):
  qs = tasks.load("nextqa", data / "nextqa")[:3]
  rows = runner.run_task(model, qs, _cfg("fp16", scoring="loglik"), tmp_path / "r.jsonl", progress=False)
  letters = scoring.letter_token_ids(model.tokenizer, 5)
  for q, row in zip(qs, rows):
    inputs = wq_jax.preprocess(model, load_media(q.media, FRAMES), q.prompt)
    last = np.asarray(wq_jax.logits(model, inputs))[0, -1]
    assert row["prediction"] == int(np.argmax(last[letters]))
    assert row["correct"] == (row["prediction"] == q.answer)


def test_egoschema_writes_a_submission_file(llava_converted, data, tmp_path, capsys):
  out = tmp_path / "ego.jsonl"
  assert eval_main(["--task", "egoschema", "--data", str(data / "egoschema"), "--ckpt",
                    str(llava_converted.folder), "--method", "fp16", "--frames", str(FRAMES), "--max-new-tokens",
                    "4", "--output", str(out), "--no-progress"]) == 0
  lines = (tmp_path / "ego.fp16.submission.csv").read_text().splitlines()
  assert lines[0] == "q_uid,answer" and len(lines) == 4
  assert lines[3].startswith("00f93e1e-cf4e-4835-88b4-4ad68216e86f,")
  summary = json.loads((tmp_path / "ego.summary.json").read_text())["methods"]["fp16"]
  assert summary["types"]["hidden"]["scored"] == 0 and summary["types"]["subset"]["scored"] == 2
  assert "overall" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 4 devices, killed mid-way

# Runs the command line with `generate` stalling from its second call on, so the kill
# lands while the second batch is in flight, after the first was flushed.
STALLED_MAIN = """
import sys, time
from wq_jax import generation
real, calls = generation.generate, []
def stalled(*args, **kwargs):
  calls.append(1)
  if len(calls) > 1:
    time.sleep(600)
  return real(*args, **kwargs)
generation.generate = stalled
from wq_jax.eval.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def _lines(path: Path) -> int:
  return path.read_text().count("\n") if path.exists() else 0


@uses_reference
def test_an_interrupted_4_device_run_loses_nothing_and_a_rerun_completes_it(llava_converted, data, reference,
                                                                            tmp_path):
  out = tmp_path / "r.jsonl"
  args = ["--task", "nextqa", "--data", str(data / "nextqa"), "--ckpt", str(llava_converted.folder), "--method",
          "fp16", "--frames", str(FRAMES), "--batch-size", "2", "--max-new-tokens", "4", "--output", str(out),
          "--no-progress"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  with open(tmp_path / "stalled.log", "w") as log:
    proc = subprocess.Popen([sys.executable, "-c", STALLED_MAIN, *args], env=env, cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
      deadline = time.monotonic() + 300
      while _lines(out) < 2:
        assert proc.poll() is None, (tmp_path / "stalled.log").read_text()
        assert time.monotonic() < deadline, "the first batch never arrived"
        time.sleep(0.05)
      written = out.read_text()
    finally:
      proc.kill()
      proc.wait()
  assert out.read_text() == written and written.count("\n") == 2

  done = subprocess.run([sys.executable, "-m", "wq_jax.eval", *args], env=env, cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "data parallel over 4 devices" in done.stderr
  rows = runner.read_rows(out)
  assert out.read_text().startswith(written)
  assert sorted(r["qid"] for r in rows) == sorted(q.qid for q in tasks.load("nextqa", data / "nextqa"))
  # fp16 answers do not depend on the batch: 4 devices give the rows of the in-process run.
  want = {r["qid"]: r for r in reference[1] if r["method"] == "fp16"}
  for r in rows:
    assert (r["prediction"], r["text"], r["error"]) == (want[r["qid"]]["prediction"], want[r["qid"]]["text"],
                                                        want[r["qid"]]["error"])
