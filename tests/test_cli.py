"""`python -m wq_jax generate` prints the answer and a summary, and writes the plan charts."""
from wq_jax import video as video_io
from wq_jax.__main__ import main


def test_generate_command_prints_answer_summary_and_plot(llava_converted, tmp_path, capsys):
  clip = video_io.write_test_video(tmp_path / "clip.mp4", video_io.synthetic_frames(16, 64, 64, seed=3))
  plot = tmp_path / "plan.png"
  code = main(["generate", "--ckpt", str(llava_converted.folder), "--video", str(clip), "--prompt",
               "What is happening?", "--frames", "16", "--max-new-tokens", "4", "--window-size", "8",
               "--plot", str(plot)])
  assert code == 0
  out, err = capsys.readouterr()
  assert out.strip()  # the answer (random weights: any text)
  assert "bit widths per layer" in err and "layer   1:" in err
  assert "MB held" in err and "tokens/s" in err
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
