"""Training curves: a real smoke run and synthetic trainer states, drawn headless to PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prompt_aug.plot import find_trainer_state, main, series

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smoke" / "tiny_cpu.yaml"
TEMPLATES = ["abel", "qwen-math", "open-r1"]


def _assert_picture(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000
    pixels = matplotlib.image.imread(str(path))
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    assert pixels[..., :3].std() > 0.05  # not a blank canvas
    assert len({tuple(p) for p in pixels[::7, ::7, :3].reshape(-1, 3).round(2).tolist()}) > 20


def _write_state(folder: Path, steps: int, offset: float = 0.0, with_eval: bool = True) -> None:
    history = []
    for step in range(1, steps + 1):
        entry = {
            "step": step,
            "entropy": 0.6 - 0.02 * step + offset,
            "reward": 0.5 + 0.05 * step,
            "rewards/correctness_reward/mean": 0.3 + 0.04 * step + offset,
            "completions/mean_length": 400.0 + 10 * step,
            "completions/clipped_ratio": 0.1 / step,
        }
        for i, name in enumerate(TEMPLATES):
            entry[f"templates/{name}/accuracy"] = 0.2 + 0.05 * step + 0.1 * i
        if with_eval and step % 5 == 0:
            entry.update(
                {
                    "eval/math500/accuracy": 0.5 + 0.02 * step,
                    "eval/macro": 0.3 + 0.01 * step,
                    "eval/micro": 0.35 + 0.01 * step,
                }
            )
        history.append(entry)
    history.append({"step": steps, "train_runtime": 12.0, "train_loss": 0.01})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": steps, "log_history": history}))


def test_plot_real_smoke_run(tmp_path):
    from prompt_aug.train import main as train

    run = tmp_path / "smoke-run"
    train(["--config", str(RECIPE), "--output_dir", str(run), "--max_steps", "2"])
    assert find_trainer_state(run) == run / "trainer_state.json"
    out = tmp_path / "curves.png"
    main([str(run), "-o", str(out)])
    _assert_picture(out)


def test_plot_overlays_runs_with_eval_and_checkpoint_only_state(tmp_path):
    a, b = tmp_path / "baseline", tmp_path / "prompt-aug"
    _write_state(a, 20)
    _write_state(b / "checkpoint-5", 5, offset=0.1, with_eval=False)  # an older checkpoint
    _write_state(b / "checkpoint-20", 20, offset=0.1, with_eval=False)  # the last one: used
    (a / "eval").mkdir()
    (a / "eval" / "results.json").write_text(
        json.dumps({"results": {"qwen-math": {"macro": 0.41, "micro": 0.45}}})
    )
    assert find_trainer_state(b) == b / "checkpoint-20" / "trainer_state.json"
    out = tmp_path / "figs" / "curves.png"
    main([str(a), str(b), "-o", str(out), "--smooth", "3", "--title", "baseline vs prompt augmentation"])
    _assert_picture(out)


def test_series_skips_missing_points_and_smooths():
    history = [
        {"step": 1, "x": 1.0},
        {"step": 2},
        {"step": 3, "x": 3.0},
        {"step": 4, "x": float("nan")},
        {"step": 5, "x": 5.0},
    ]
    assert series(history, "x") == ([1, 3, 5], [1.0, 3.0, 5.0])
    assert series(history, "x", smooth=2) == ([1, 3, 5], [1.0, 2.0, 4.0])


def test_folder_without_trainer_state_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"empty: no trainer_state.json"):
        main([str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match=r"no such folder"):
        main([str(tmp_path / "missing"), "-o", str(tmp_path / "x.png")])
