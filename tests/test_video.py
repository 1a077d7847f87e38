"""wq_jax.video: decoding real encoded files, uniform sampling, and bad input."""

import dataclasses

import av
import numpy as np
import pytest
from PIL import Image

from wq_jax import video
from wq_jax.video import VideoDecodeError, load_video, probe_video, sample_indices, write_test_video

NUM_FRAMES, HEIGHT, WIDTH = 23, 64, 96
BITS = 5  # frame index stamped as 5 black/white 16x16 blocks, robust to lossy codecs


def stamped_frames(num_frames=NUM_FRAMES, seed=0):
  frames = video.synthetic_frames(num_frames, HEIGHT, WIDTH, seed=seed)
  for t in range(num_frames):
    for bit in range(BITS):
      frames[t, :16, 16 * bit : 16 * bit + 16] = 255 * ((t >> bit) & 1)
  return frames


def read_stamp(frame):
  return sum(int(frame[4:12, 16 * bit + 4 : 16 * bit + 12].mean() > 127) << bit for bit in range(BITS))


def decode_all(path):
  with av.open(str(path)) as container:
    return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


@pytest.fixture(scope="module", params=[".mp4", ".mkv", ".webm", ".avi"])
def encoded(request, tmp_path_factory):
  path = tmp_path_factory.mktemp("videos") / f"clip{request.param}"
  return write_test_video(path, stamped_frames(), fps=10)


def test_sample_indices_is_lmms_eval_linspace():
  np.testing.assert_array_equal(sample_indices(10, 4), [0, 3, 6, 9])
  np.testing.assert_array_equal(sample_indices(100, 8), np.linspace(0, 99, 8, dtype=int))
  np.testing.assert_array_equal(sample_indices(3, 5), [0, 0, 1, 1, 2])  # repeats, as decord returns them
  np.testing.assert_array_equal(sample_indices(5, None), np.arange(5))
  for bad in (0, -2, 2.5, True):
    with pytest.raises(ValueError, match="num_frames"):
      sample_indices(5, bad)


def test_decodes_every_container(encoded):
  info = probe_video(encoded)
  assert (info.num_frames, info.fps, info.height, info.width) == (NUM_FRAMES, 10.0, HEIGHT, WIDTH)
  reference = decode_all(encoded)
  assert [read_stamp(f) for f in reference] == list(range(NUM_FRAMES))
  for num_frames in (1, 6, NUM_FRAMES, 40):
    frames = load_video(encoded, num_frames)
    assert frames.dtype == np.uint8 and frames.shape == (num_frames, HEIGHT, WIDTH, 3)
    expected = np.linspace(0, NUM_FRAMES - 1, num_frames, dtype=int)
    np.testing.assert_array_equal(frames, reference[expected])
    assert [read_stamp(f) for f in frames] == list(expected)
  np.testing.assert_array_equal(load_video(str(encoded)), reference)


def test_frame_count_from_packets_when_header_has_none(tmp_path):
  path = write_test_video(tmp_path / "clip.webm", stamped_frames(), fps=10)
  with av.open(str(path)) as container:
    assert container.streams.video[0].frames == 0  # WebM stores no count
  assert probe_video(path).num_frames == NUM_FRAMES


def test_overstated_frame_count_resamples_decoded_frames(tmp_path, monkeypatch):
  path = write_test_video(tmp_path / "clip.mp4", stamped_frames(), fps=10)
  honest = probe_video(path)
  monkeypatch.setattr(video, "probe_video", lambda p: dataclasses.replace(honest, num_frames=NUM_FRAMES + 9))
  frames = load_video(path, 5)
  assert [read_stamp(f) for f in frames] == list(np.linspace(0, NUM_FRAMES - 1, 5, dtype=int))


def test_arrays_and_frame_lists():
  frames = stamped_frames(9, seed=1)
  np.testing.assert_array_equal(load_video(frames), frames)
  np.testing.assert_array_equal(load_video(frames, 4), frames[[0, 2, 5, 8]])
  np.testing.assert_array_equal(load_video(list(frames), 3), frames[[0, 4, 8]])
  np.testing.assert_array_equal(load_video([Image.fromarray(f) for f in frames], 2), frames[[0, 8]])
  rgba = np.dstack([frames[0], np.full((HEIGHT, WIDTH), 255, np.uint8)])
  rgba[0, 0, 3] = 0  # a transparent pixel composites onto white, as transformers does
  loaded = load_video([Image.fromarray(rgba, "RGBA")])
  np.testing.assert_array_equal(loaded[0, 0, 0], [255, 255, 255])
  np.testing.assert_array_equal(loaded[0, 1:], frames[0, 1:])


def test_missing_file_names_path(tmp_path):
  path = tmp_path / "nowhere.mp4"
  with pytest.raises(FileNotFoundError, match="nowhere.mp4"):
    load_video(path)


@pytest.mark.parametrize(
  "name, content, reason",
  [
    ("notes.mp4", b"this is not a video", "Invalid data"),
    ("empty.mkv", b"", "Invalid data"),
  ],
)
def test_unreadable_file_names_path_and_decoder_message(tmp_path, name, content, reason):
  path = tmp_path / name
  path.write_bytes(content)
  with pytest.raises(VideoDecodeError, match=reason) as err:
    load_video(path, 4)
  assert str(path) in str(err.value) and err.value.path == str(path)
  assert isinstance(err.value, ValueError)


def test_truncated_and_streamless_files(tmp_path):
  whole = write_test_video(tmp_path / "whole.mp4", stamped_frames(), fps=10).read_bytes()
  truncated = tmp_path / "truncated.mp4"
  truncated.write_bytes(whole[: len(whole) // 2])  # the index (moov) is written last
  with pytest.raises(VideoDecodeError, match="truncated.mp4"):
    load_video(truncated)
  streamless = tmp_path / "streamless.mp4"
  with av.open(str(streamless), "w") as container:
    stream = container.add_stream("mpeg4", rate=8)
    stream.width, stream.height = 32, 32
    container.start_encoding()
  with pytest.raises(VideoDecodeError, match="streamless.mp4.*no video stream"):
    load_video(streamless)
  with pytest.raises(VideoDecodeError, match="not a regular file"):
    load_video(tmp_path)


def test_zero_decodable_frames(tmp_path):
  path = tmp_path / "empty.avi"
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=8)
    stream.width, stream.height = 32, 32
    container.start_encoding()
    container.mux(stream.encode(None))
  with pytest.raises(VideoDecodeError, match="empty.avi.*zero frames"):
    load_video(path)


@pytest.mark.parametrize(
  "source",
  [
    np.zeros((2, 8, 8, 3), np.float32),
    np.zeros((8, 8, 3), np.uint8),
    np.zeros((2, 8, 8, 4), np.uint8),
    np.zeros((0, 8, 8, 3), np.uint8),
    [],
    [np.zeros((8, 8, 3), np.uint8), np.zeros((8, 6, 3), np.uint8)],
    [np.zeros((8, 8), np.uint8)],
    42,
  ],
)
def test_bad_arrays_name_expected_layout(source):
  with pytest.raises(ValueError, match=r"\[T, H, W, 3\]"):
    load_video(source)


def test_writer_rejects_odd_sizes_and_unknown_containers(tmp_path):
  with pytest.raises(ValueError, match="even"):
    write_test_video(tmp_path / "odd.mp4", np.zeros((2, 7, 8, 3), np.uint8))
  with pytest.raises(ValueError, match=".gif"):
    write_test_video(tmp_path / "clip.gif", np.zeros((2, 8, 8, 3), np.uint8))
