"""Training curves: a real smoke run and synthetic trainer states, drawn headless to PNG."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
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
    # An infinite value cannot be drawn either: left out, not carried into the smoothed points after it.
    overflow = [{"step": 1, "x": float("inf")}, {"step": 2, "x": 1.0}, {"step": 3, "x": float("-inf")}]
    assert series([*overflow, {"step": 4, "x": 3.0}], "x", smooth=2) == ([2, 4], [1.0, 2.0])


def test_a_run_with_no_step_logged_is_named_and_one_with_a_single_step_is_drawn(tmp_path, caplog):
    """A run stopped (or still) before its first log has nothing to draw: said so, naming its folder, not as
    an unknown metric; beside another run it is left out with a warning. One logged step is drawn."""
    empty, one = tmp_path / "empty-run", tmp_path / "one-step"
    empty.mkdir()
    summary = {"step": 0, "train_runtime": 1.0, "train_loss": 0.0}  # all a run stopped at once logs
    (empty / "trainer_state.json").write_text(json.dumps({"global_step": 0, "log_history": [summary]}))
    with pytest.raises(SystemExit) as err:
        main([str(empty), "-o", str(tmp_path / "x.png")])
    assert str(err.value).startswith(f"prompt-aug-plot: error: {empty}: no training step logged yet")
    assert not (tmp_path / "x.png").exists()
    _write_state(one, 1, with_eval=False)
    out = tmp_path / "two.png"
    main([str(empty), str(one), "-o", str(out)])
    _assert_picture(out)
    assert f"{empty}: no training step logged yet; drawn without it" in caplog.text


def test_folder_without_trainer_state_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"empty: no trainer_state.json"):
        main([str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")])
    with pytest.raises(
        SystemExit, match=rf"^prompt-aug-plot: error: {re.escape(str(tmp_path / 'missing'))}: no such folder$"
    ):
        main([str(tmp_path / "missing"), "-o", str(tmp_path / "x.png")])
    _write_state(tmp_path / "run", 3)
    given = tmp_path / "run" / "trainer_state.json"  # the state file, for its folder
    with pytest.raises(SystemExit) as exit_info:
        main([str(given), "-o", str(tmp_path / "x.png")])
    assert str(exit_info.value.code) == (
        f"prompt-aug-plot: error: {given}: a file, not a run folder; give the folder that holds it "
        f"({tmp_path / 'run'})"
    )
    for name in ("x.foo", "noext"):  # matplotlib would raise, or write noext.png and say "wrote noext"
        with pytest.raises(
            SystemExit, match=rf"^prompt-aug-plot: error: --output .*{name}: give a file name"
        ):
            main([str(tmp_path / "empty"), "-o", str(tmp_path / name)])


def test_an_evaluation_of_other_weights_is_not_drawn_as_the_runs_and_a_cut_file_is_one_line(tmp_path, caplog):
    from prompt_aug.model_card import weights_fingerprint
    from prompt_aug.plot import load_run

    run = tmp_path / "run"
    _write_state(run, 4)
    (run / "model.safetensors").write_bytes(bytes(range(256)) * 16)
    (run / "eval").mkdir()
    weights = {"weights": weights_fingerprint(run)}
    results = {"settings": weights, "results": {"qwen-math": {"macro": 0.4, "micro": 0.5}}}
    (run / "eval" / "results.json").write_text(json.dumps(results))
    assert load_run(run).eval_results == results
    (run / "model.safetensors").write_bytes(bytes(range(255, -1, -1)) * 16)  # trained further since
    with caplog.at_level("WARNING", logger="prompt_aug.plot"):
        assert load_run(run).eval_results is None
    assert "holds an evaluation of other weights than those in" in caplog.text
    (run / "eval" / "results.json").write_text('{"settings": {"wei')  # cut short
    with pytest.raises(
        SystemExit, match=r"^prompt-aug-plot: error: .*results.json: cannot be read .*evaluate again"
    ):
        main([str(run), "-o", str(tmp_path / "x.png")])
    for other in ("[1, 2]", '{"results": {"qwen-math": {"accuracy": 0.4}}}'):  # not prompt-aug-eval's
        (run / "eval" / "results.json").write_text(other)
        with pytest.raises(SystemExit, match=r"results.json: not prompt-aug-eval's results .*evaluate again"):
            main([str(run), "-o", str(tmp_path / "x.png")])
    (run / "eval" / "results.json").unlink()
    (run / "trainer_state.json").write_text('{"global_step": 4, "log_hi')
    with pytest.raises(SystemExit, match=r"^prompt-aug-plot: error: .*trainer_state.json: cannot be read"):
        main([str(run), "-o", str(tmp_path / "x.png")])


# ---------------------------------------------------------------------------------------------
# Template colours, gaps, legends, eval sources, rounds


def _write_rounds(
    folder: Path, drawn: dict[int, list[str]], with_round: bool = True, eval_at: int | None = None
) -> None:
    """A run of 2 optimizer steps per round; ``drawn`` maps a round to the templates it drew."""
    history = []
    for rnd, names in sorted(drawn.items()):
        for step in (2 * rnd - 1, 2 * rnd):
            entry = {"step": step, "entropy": 0.5, "reward": 0.4}
            if with_round:
                entry["round"] = rnd
            if step % 2:  # the round's metrics are logged at its first step
                entry.update({f"templates/{n}/accuracy": 0.1 * rnd + 0.01 * i for i, n in enumerate(names)})
            if step == eval_at:
                entry.update({"eval/math500/accuracy": 0.5, "eval/macro": 0.4, "eval/micro": 0.45})
            history.append(entry)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": 2 * max(drawn), "log_history": history})
    )


def _template_lines(fig, run_name: str) -> dict:
    (ax,) = [a for a in fig.axes if a.get_title() == f"Per-template training accuracy: {run_name}"]
    return {line.get_label(): line for line in ax.get_lines()}


def test_a_template_keeps_one_colour_in_every_panel_and_every_picture(tmp_path):
    from prompt_aug.plot import build_figure

    _write_rounds(tmp_path / "a", {1: ["abel", "qwen-math", "open-r1"], 2: ["abel", "qwen-math", "open-r1"]})
    _write_rounds(tmp_path / "b", {1: ["open-r1", "reflective"], 2: ["open-r1", "reflective"]})
    both = build_figure([tmp_path / "a", tmp_path / "b"])
    alone = build_figure([tmp_path / "b"])
    a, b, b_alone = _template_lines(both, "a"), _template_lines(both, "b"), _template_lines(alone, "b")
    assert a["open-r1"].get_color() == b["open-r1"].get_color() == b_alone["open-r1"].get_color()
    assert b["reflective"].get_color() == b_alone["reflective"].get_color()
    colours = [a[n].get_color() for n in ("abel", "qwen-math", "open-r1")] + [b["reflective"].get_color()]
    assert len({tuple(c) for c in colours}) == 4


def test_a_template_absent_from_a_round_leaves_a_gap(tmp_path):
    import math

    from prompt_aug.plot import build_figure

    _write_rounds(tmp_path / "r", {1: ["abel", "qwen-math"], 2: ["qwen-math"], 3: ["abel", "qwen-math"]})
    lines = _template_lines(build_figure([tmp_path / "r"]), "r")
    xs, ys = list(lines["abel"].get_xdata()), list(lines["abel"].get_ydata())
    assert xs == [1, 3, 5] and not math.isnan(ys[0]) and math.isnan(ys[1]) and not math.isnan(ys[2])
    assert not any(math.isnan(y) for y in lines["qwen-math"].get_ydata())


def test_legends_do_not_cover_any_panel(tmp_path):
    from prompt_aug.plot import build_figure

    _write_state(tmp_path / "a", 20)  # 3 templates and eval points
    (tmp_path / "a" / "eval").mkdir()
    (tmp_path / "a" / "eval" / "results.json").write_text(
        json.dumps({"results": {"qwen-math": {"macro": 0.4, "micro": 0.5}}})
    )
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    fig = build_figure([tmp_path / "a", tmp_path / "b"])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    panels = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(panel) for panel in panels), legend.get_texts()[0].get_text()


def test_the_eval_panel_says_where_its_points_come_from(tmp_path):
    from prompt_aug.plot import build_figure

    _write_rounds(tmp_path / "r", {1: ["abel"], 2: ["abel"]}, eval_at=2)
    (tmp_path / "r" / "eval").mkdir()
    (tmp_path / "r" / "eval" / "results.json").write_text(
        json.dumps({"runs": 5, "limit": 50, "results": {"qwen-math": {"macro": 0.4, "micro": 0.5}}})
    )
    (ax,) = [a for a in build_figure([tmp_path / "r"]).axes if a.get_title().startswith("Evaluation")]
    text = " ".join(t.get_text() for t in ax.texts)
    assert "logged during training (math500" in text
    assert (
        "eval/results.json from prompt-aug-eval (template qwen-math, 5 runs, first 50 per benchmark)" in text
    )
    # A second run evaluated otherwise (sampled, one benchmark): each run's markers say their own protocol.
    _write_rounds(tmp_path / "s", {1: ["abel"], 2: ["abel"]}, eval_at=2)
    (tmp_path / "s" / "eval").mkdir()
    (tmp_path / "s" / "eval" / "results.json").write_text(
        json.dumps(
            {
                "runs": 1,
                "benchmarks": ["aime24"],
                "settings": {"temperature": 1.0},
                "results": {"qwen-math": {"macro": 0.1, "micro": 0.1}},
            }
        )
    )
    figure = build_figure([tmp_path / "r", tmp_path / "s"])
    (ax,) = [a for a in figure.axes if a.get_title() == "Evaluation (strict grading)"]
    text = " ".join(t.get_text() for t in ax.texts)
    assert "not comparable across runs" in text
    assert "r: template qwen-math, 5 runs, first 50 per benchmark" in text
    assert "s: template qwen-math, sampled at temperature 1, 1 run, aime24" in text


def test_x_axis_in_generation_rounds(tmp_path):
    from prompt_aug.plot import PlotError, build_figure

    _write_rounds(tmp_path / "r", {1: ["abel"], 2: ["abel"], 3: ["abel"]}, eval_at=4)
    fig = build_figure([tmp_path / "r"], x="round")
    assert {ax.get_xlabel() for ax in fig.axes if ax.get_visible()} == {"generation round"}
    assert list(_template_lines(fig, "r")["abel"].get_xdata()) == [1, 2, 3]
    (ev,) = [a for a in fig.axes if a.get_title().startswith("Evaluation")]
    assert list(ev.get_lines()[0].get_xdata()) == [2]  # eval at step 4 = round 2
    out = tmp_path / "rounds.png"
    main([str(tmp_path / "r"), "-o", str(out), "--x", "round"])
    assert out.is_file()
    _write_rounds(tmp_path / "old", {1: ["abel"]}, with_round=False)
    with pytest.raises(PlotError, match=r"no `round` key.*--x step"):
        build_figure([tmp_path / "old"], x="round")
    # A run beside it that has logged no step yet is drawn without lines, as under --x step, not refused.
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "trainer_state.json").write_text(json.dumps({"global_step": 0, "log_history": []}))
    fig = build_figure([tmp_path / "r", empty], x="round")
    assert list(_template_lines(fig, "r")["abel"].get_xdata()) == [1, 2, 3]


def test_the_shuffled_control_is_drawn_in_the_accuracy_panel_beside_the_run(tmp_path):
    # The control logs no correctness_reward, only its shuffle, whose round mean is the true accuracy.
    from prompt_aug.plot import build_figure

    run, control = tmp_path / "learn", tmp_path / "learn-control"
    _write_state(run, 10, with_eval=False)
    key = "rewards/shuffled_correctness_reward/mean"
    history = [{"step": s, "reward": 1.0, key: 0.5 - 0.03 * s} for s in range(1, 11)]
    control.mkdir()
    (control / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": history}))
    fig = build_figure([run, control])
    (panel,) = [ax for ax in fig.axes if ax.get_title() == "Training accuracy"]
    drawn = [list(line.get_ydata()) for line in panel.get_lines()]
    assert [0.5 - 0.03 * s for s in range(1, 11)] in drawn
    assert [0.3 + 0.04 * s for s in range(1, 11)] in drawn


def test_groups_give_an_arms_seeds_one_colour_and_a_style_each(tmp_path):
    from prompt_aug.plot import build_figure

    for i, name in enumerate(["bank-s0", "bank-s1", "one-s0", "one-s1"]):
        _write_state(tmp_path / name / "train", 10, offset=0.01 * i, with_eval=False)
    dirs = [tmp_path / n / "train" for n in ["bank-s0", "bank-s1", "one-s0", "one-s1"]]
    names = ["bank s0", "bank s1", "one s0", "one s1"]
    fig = build_figure(dirs, names=names, groups=["bank", "bank", "one", "one"])
    (entropy,) = [a for a in fig.axes if a.get_title() == "Entropy"]
    lines = entropy.get_lines()
    colours = [tuple(line.get_color()) for line in lines]
    assert colours[0] == colours[1] != colours[2] == colours[3]
    assert [line.get_linestyle() for line in lines] == ["-", "--", "-", "--"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == names
    # Without the per-template panels: the five curve panels, and no template legend below them.
    bare = build_figure(dirs, names=names, groups=["bank", "bank", "one", "one"], templates=False)
    titles = [a.get_title() for a in bare.axes if a.get_visible()]
    assert len(titles) == 5 and not any(t.startswith("Per-template") for t in titles)
    assert len(bare.legends) == 1
    # Without groups every run has its own colour, all solid.
    plain = next(a for a in build_figure(dirs).axes if a.get_title() == "Entropy").get_lines()
    assert len({tuple(line.get_color()) for line in plain}) == 4
    assert {line.get_linestyle() for line in plain} == {"-"}


def test_past_ten_runs_the_colours_come_round_in_another_line_style(tmp_path):
    from prompt_aug.plot import build_figure

    for i in range(11):
        _write_state(tmp_path / f"run{i}", 3, offset=0.01 * i, with_eval=False)
    fig = build_figure([tmp_path / f"run{i}" for i in range(11)], templates=False)
    lines = next(a for a in fig.axes if a.get_title() == "Entropy").get_lines()
    drawn = [(tuple(line.get_color()), line.get_linestyle()) for line in lines]
    assert len(set(drawn)) == 11
    assert drawn[10] == (drawn[0][0], "--") and {style for _, style in drawn[:10]} == {"-"}
    legend = {
        t.get_text(): h.get_linestyle()
        for t, h in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles)
    }
    assert legend["run0"] == "-" and legend["run10"] == "--"


def test_per_template_panels_are_labelled_as_the_share_graded_right(tmp_path):
    from prompt_aug.plot import build_figure

    _write_state(tmp_path / "a", 3, with_eval=False)  # templates/<name>/accuracy: a share from 0 to 1
    (panel,) = [a for a in build_figure([tmp_path / "a"]).axes if a.get_title().startswith("Per-template")]
    assert panel.get_ylabel() == "share graded right"


def test_an_output_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    _write_state(tmp_path / "a", 3, with_eval=False)
    (tmp_path / "file").write_text("")
    output = tmp_path / "file" / "curves.png"  # a file where its folder should be
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "a"), "-o", str(output)])
    message = str(exc.value)
    assert message.startswith(f"prompt-aug-plot: error: --output {output}: cannot write it")
    assert "\n" not in message and "a folder you can write to" in message


@pytest.mark.parametrize(
    "flag, values, message",
    [
        ("--groups", ["bank"], "--groups: 1 given for 2 runs"),
        ("--names", ["a", "b", "c"], "--names: 3 given for 2 runs"),
        ("--names", ["a", "a"], "repeat a name"),
    ],
)
def test_names_or_groups_that_do_not_match_the_runs_are_refused(tmp_path, capsys, flag, values, message):
    for name in ("a", "b"):
        _write_state(tmp_path / name, 3, with_eval=False)
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "a"), str(tmp_path / "b"), flag, *values, "-o", str(tmp_path / "c.png")])
    assert message in str(exc.value) and "prompt-aug-plot" in str(exc.value)
    assert not (tmp_path / "c.png").exists()


def test_a_run_trained_further_is_drawn_from_its_newest_state(tmp_path, caplog):
    """A finished run resumed with a larger max_steps keeps its old root trainer_state.json until it
    finishes again: its newer checkpoints' state is drawn. On a tie the root's (it has the summary)."""
    from prompt_aug.plot import build_figure, load_run

    run = tmp_path / "run"
    _write_state(run, 4, with_eval=False)  # the first training's save_state()
    _write_state(run / "checkpoint-4", 4, with_eval=False)
    _write_state(run / "checkpoint-6", 6, with_eval=False)  # resumed to 8 steps, still running
    assert find_trainer_state(run) == run / "checkpoint-6" / "trainer_state.json"
    assert load_run(run).final_step == 6
    (entropy,) = [a for a in build_figure([run]).axes if a.get_title() == "Entropy"]
    assert list(entropy.get_lines()[0].get_xdata()) == [1, 2, 3, 4, 5, 6]
    # A checkpoint being written is passed over, with a warning naming it.
    (run / "checkpoint-8").mkdir()
    (run / "checkpoint-8" / "trainer_state.json").write_text('{"global_step": 8, "log_hi')
    with caplog.at_level("WARNING", logger="prompt_aug.plot"):
        assert find_trainer_state(run) == run / "checkpoint-6" / "trainer_state.json"
    assert "checkpoint-8/trainer_state.json: cannot be read" in caplog.text
    shutil.rmtree(run / "checkpoint-8")
    _write_state(run, 6, with_eval=False)  # finished again at the checkpoint's step
    assert find_trainer_state(run) == run / "trainer_state.json"


def test_the_final_evaluation_is_drawn_at_the_step_of_the_weights_it_graded(tmp_path):
    # Finished and evaluated at step 4, then resumed and still training: checkpoint-6 is newer, and the
    # evaluation is still of the step-4 weights in the folder.
    from prompt_aug.plot import build_figure

    run = tmp_path / "run"
    _write_state(run, 4, with_eval=False)
    _write_state(run / "checkpoint-6", 6, with_eval=False)
    (run / "eval").mkdir()
    (run / "eval" / "results.json").write_text(
        json.dumps({"results": {"qwen-math": {"macro": 0.4, "micro": 0.5}}})
    )
    (panel,) = [a for a in build_figure([run]).axes if a.get_title() == "Evaluation (strict grading)"]
    markers = [line for line in panel.get_lines() if line.get_marker() in ("*", "P")]
    assert [list(line.get_xdata()) for line in markers] == [[4], [4]]


def test_runs_in_folders_of_one_name_are_told_apart_and_a_run_given_twice_is_refused(tmp_path):
    from prompt_aug.plot import build_figure

    dirs = [tmp_path / seed / "arm" / "train" for seed in ("s0", "s1")]
    for i, folder in enumerate(dirs):
        _write_state(folder, 3, offset=0.1 * i, with_eval=False)
    fig = build_figure(dirs)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["s0/arm/train", "s1/arm/train"]
    (entropy,) = [a for a in fig.axes if a.get_title() == "Entropy"]
    assert len(entropy.get_lines()) == 2  # each run's own curve
    with pytest.raises(SystemExit, match=r"^prompt-aug-plot: error: .*s0/arm/train: given twice"):
        main([str(dirs[0]), str(dirs[0]), "-o", str(tmp_path / "c.png")])


def test_templates_of_a_custom_bank_each_get_their_own_colour(tmp_path):
    """Names outside the built-in bank, across the runs of one picture, never share a colour, nor take a
    built-in template's; a built-in template keeps its colour; the same runs give the same colours."""
    from prompt_aug.plot import build_figure

    mine = ["cot", "direct", "socratic", "pot", "short", "verify", "t1", "t2", "t3", "t4"]
    _write_rounds(tmp_path / "a", {1: [*mine[:6], "abel"], 2: [*mine[:6], "abel"]})
    _write_rounds(tmp_path / "b", {1: mine[4:], 2: mine[4:]})
    figure = build_figure([tmp_path / "a", tmp_path / "b"])
    a, b = _template_lines(figure, "a"), _template_lines(figure, "b")
    colours = {name: tuple(line.get_color()) for lines in (a, b) for name, line in lines.items()}
    assert len(colours) == 11 and len(set(colours.values())) == 11
    assert tuple(a["short"].get_color()) == tuple(b["short"].get_color())
    _write_rounds(tmp_path / "builtin", {1: ["abel", "qwen-math"], 2: ["abel", "qwen-math"]})
    builtin = _template_lines(build_figure([tmp_path / "builtin"]), "builtin")
    assert tuple(builtin["abel"].get_color()) == colours["abel"]
    again = build_figure([tmp_path / "a", tmp_path / "b"])
    assert {n: tuple(line.get_color()) for n, line in _template_lines(again, "b").items()} == {
        n: colours[n] for n in mine[4:]
    }
    legend = {
        t.get_text(): tuple(h.get_color())
        for t, h in zip(figure.legends[1].get_texts(), figure.legends[1].legend_handles)
    }
    assert legend == colours


def test_a_dynamic_sampling_run_is_drawn_over_everything_it_generated(tmp_path):
    """TRL's reward, accuracy and truncation keys of a dynamic-sampling run cover the trained groups only;
    the panels and the console line take the same metrics over every generated completion, which a run
    without dynamic sampling (every group trained) logs under TRL's keys."""
    from types import SimpleNamespace

    from prompt_aug.logging_utils import compact_line
    from prompt_aug.plot import build_figure

    dapo, grpo = tmp_path / "dapo", tmp_path / "grpo"
    generated = "dynamic_sampling/generated/"
    history = [
        {
            "step": s, "round": s, "rewards/correctness_reward/mean": 0.5, "reward": 0.6,
            "completions/clipped_ratio": 0.0, f"{generated}rewards/correctness_reward/mean": 0.25,
            f"{generated}reward": 0.35, f"{generated}completions/clipped_ratio": 0.3,
        }
        for s in range(1, 5)
    ]  # fmt: skip
    dapo.mkdir()
    (dapo / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": history}))
    _write_state(grpo, 4, with_eval=False)
    panels = {a.get_title(): a for a in build_figure([dapo, grpo]).axes}
    expected = {"Training accuracy": 0.25, "Total reward": 0.35, "Truncation rate": 0.3}
    for title, value in expected.items():
        dapo_line, grpo_line = panels[title].get_lines()
        assert list(dapo_line.get_ydata()) == [value] * 4, title
        assert "all generated" in panels[title].get_ylabel(), title
    assert list(grpo_line.get_ydata()) == [0.1 / s for s in range(1, 5)]  # TRL's key where it is all
    alone = {a.get_title(): a.get_ylabel() for a in build_figure([grpo]).axes}
    assert alone["Training accuracy"] == "share graded right"
    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1)
    line = compact_line({**history[0], "loss": 0.0}, 1, 4, args)
    assert line == "round 1 | step 1/4 | reward 0.350 | accuracy 0.250 | truncated 0.300"


def _entropy_line(run: Path) -> tuple[list, list]:
    from prompt_aug.plot import build_figure

    (entropy,) = [a for a in build_figure([run]).axes if a.get_title() == "Entropy"]
    line = entropy.get_lines()[0]
    return list(line.get_xdata()), list(line.get_ydata())


def test_a_run_resumed_from_an_earlier_checkpoint_is_drawn_not_the_longer_line_it_abandoned(tmp_path, caplog):
    """Finished at step 100, then resumed from a collapse checkpoint at step 40: the root state and the old
    checkpoint-90 still reach further, but the resumed line's checkpoint-60 was written since."""
    import os
    import time

    run = tmp_path / "run"
    old = [{"step": s, "round": s, "entropy": 0.01} for s in range(1, 101)]
    new = [{"step": s, "round": s, "entropy": 0.01 if s <= 40 else 0.5} for s in range(1, 61)]
    for folder, history in ((run, old), (run / "checkpoint-90", old[:90]), (run / "checkpoint-60", new)):
        folder.mkdir(parents=True, exist_ok=True)
        state = {"global_step": history[-1]["step"], "log_history": history}
        (folder / "trainer_state.json").write_text(json.dumps(state))
    hour_ago = time.time() - 3600
    for folder in (run, run / "checkpoint-90"):
        os.utime(folder / "trainer_state.json", (hour_ago, hour_ago))
    with caplog.at_level("WARNING", logger="prompt_aug.plot"):
        assert find_trainer_state(run) == run / "checkpoint-60" / "trainer_state.json"
        xs, values = _entropy_line(run)
    assert xs == list(range(1, 61)) and values[49] == 0.5
    warnings = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(warnings) == 2  # one per read (find_trainer_state, the figure), naming the longest set aside
    assert "run/trainer_state.json reaches step 100" in warnings[0]


def test_a_live_or_crashed_run_is_drawn_to_its_last_log_line_and_a_log_alone_is_enough(tmp_path):
    from prompt_aug.plot import collapse_events, load_run

    def history(steps: int) -> list[dict]:
        return [{"step": s, "round": (s + 3) // 4, "entropy": 0.5 - s / 100} for s in range(1, steps + 1)]

    run = tmp_path / "live"  # its last checkpoint at step 10, its log at step 25, a line being written
    (run / "checkpoint-10").mkdir(parents=True)
    (run / "checkpoint-10" / "trainer_state.json").write_text(
        json.dumps({"global_step": 10, "log_history": history(10)})
    )
    lines = history(25)
    lines[19]["collapse/fired/entropy"] = 1.0
    (run / "logs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"step": 26, "entr')
    loaded = load_run(run)
    assert loaded.final_step == 25 and collapse_events(loaded.history) == [(20, "entropy")]
    assert _entropy_line(run)[0] == list(range(1, 26))
    alone = tmp_path / "crashed"  # before its first checkpoint
    alone.mkdir()
    (alone / "logs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in history(8)))
    main([str(alone), "-o", str(tmp_path / "crashed.png")])
    assert _entropy_line(alone)[0] == list(range(1, 9))


@pytest.mark.parametrize(
    "text",
    ["null", "[]", '{"global_step": 3, "log_history": null}', '{"global_step": "x", "log_history": []}'],
)
def test_a_trainer_state_of_another_shape_is_one_line_naming_it(tmp_path, text):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(text)
    with pytest.raises(
        SystemExit, match=r"^prompt-aug-plot: error: .*run/trainer_state.json: not a trainer state"
    ):
        main([str(run), "-o", str(tmp_path / "x.png")])


@pytest.mark.parametrize(
    "extra",
    [{"settings": "x"}, {"settings": {"temperature": "hot"}}, {"benchmarks": "math500"}, {"runs": "3"}],
)
def test_an_evaluation_of_another_shape_is_one_line_naming_it(tmp_path, extra):
    run = tmp_path / "run"
    _write_state(run, 4, with_eval=False)
    (run / "eval").mkdir()
    results = {"results": {"qwen-math": {"macro": 0.4, "micro": 0.5}}, **extra}
    (run / "eval" / "results.json").write_text(json.dumps(results))
    with pytest.raises(
        SystemExit, match=r"^prompt-aug-plot: error: .*results.json: not prompt-aug-eval's .*again"
    ):
        main([str(run), "-o", str(tmp_path / "x.png")])


def test_plotting_imports_neither_torch_nor_transformers():
    # A run's curves are drawn on a laptop from its logs; the plot reads them without the training stack.
    code = (
        "import sys, prompt_aug.plot\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_more_than_ten_groups_each_have_their_own_colour(tmp_path):
    """Eleven arms of two seeds: tab10 alone gave the eleventh arm the first one's colour, and its seeds the
    same line styles, so two runs looked the same."""
    from prompt_aug.plot import build_figure

    dirs, groups = [], []
    for arm in range(11):
        for seed in range(2):
            _write_state(tmp_path / f"arm{arm}-s{seed}", 3, offset=0.01 * arm, with_eval=False)
            dirs.append(tmp_path / f"arm{arm}-s{seed}")
            groups.append(f"arm{arm}")
    fig = build_figure(dirs, groups=groups, templates=False)
    lines = next(a for a in fig.axes if a.get_title() == "Entropy").get_lines()
    drawn = [(tuple(line.get_color()), line.get_linestyle()) for line in lines]
    assert len(set(drawn)) == 22
    assert len({colour for colour, _ in drawn}) == 11
    assert drawn[0][0] == drawn[1][0] and [style for _, style in drawn[:2]] == ["-", "--"]


def test_many_runs_do_not_squeeze_the_panels_under_their_legend(tmp_path):
    """The run legend grows a row per four runs: the figure grows with it, the panels keep their height and
    the legend stays off them (with 100 runs it used to cover them, tight_layout giving up)."""
    from prompt_aug.plot import build_figure

    def panel_height(count: int) -> float:
        dirs = [tmp_path / f"run{i}" for i in range(count)]
        for i, folder in enumerate(dirs):
            if not folder.exists():
                _write_state(folder, 3, offset=0.001 * i, with_eval=False)
        fig = build_figure(dirs, templates=False)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        panels = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
        box = fig.legends[0].get_window_extent(renderer)
        assert not any(box.overlaps(panel) for panel in panels), count
        return fig.axes[0].get_position().height * fig.get_size_inches()[1]

    one, many = panel_height(1), panel_height(60)
    assert many > 0.9 * one


def test_an_evaluation_of_a_line_set_aside_is_not_drawn_on_the_resumed_line(tmp_path, caplog):
    """Finished and evaluated at step 100, then resumed from checkpoint-40 and still training: the folder's
    weights (and their evaluation) end the abandoned line, not the one drawn; their markers were drawn at
    step 100, past the line's end, in an evaluation panel of nothing else."""
    import os
    import time

    from prompt_aug.plot import build_figure, load_run

    run = tmp_path / "run"
    old = [{"step": s, "round": s, "entropy": 0.01} for s in range(1, 101)]
    new = [{"step": s, "round": s, "entropy": 0.01 if s <= 40 else 0.5} for s in range(1, 61)]
    for folder, history in ((run, old), (run / "checkpoint-60", new)):
        folder.mkdir(parents=True, exist_ok=True)
        state = {"global_step": history[-1]["step"], "log_history": history}
        (folder / "trainer_state.json").write_text(json.dumps(state))
    hour_ago = time.time() - 3600
    os.utime(run / "trainer_state.json", (hour_ago, hour_ago))
    (run / "eval").mkdir()
    (run / "eval" / "results.json").write_text(
        json.dumps({"results": {"qwen-math": {"macro": 0.4, "micro": 0.5}}})
    )
    with caplog.at_level("WARNING", logger="prompt_aug.plot"):
        assert load_run(run).eval_results is None
    assert "end at step 100 a line set aside" in caplog.text
    titles = [a.get_title() for a in build_figure([run]).axes if a.get_visible()]
    assert "Evaluation (strict grading)" not in titles and "Entropy" in titles
    # The same folder, its weights on the line drawn (finished again at step 60): drawn at their step.
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 60, "log_history": new}))
    (panel,) = [a for a in build_figure([run]).axes if a.get_title() == "Evaluation (strict grading)"]
    assert [list(line.get_xdata()) for line in panel.get_lines()] == [[60], [60]]


@pytest.mark.skipif(shutil.which("xelatex") is not None, reason="xelatex installed: .pgf can be written")
def test_an_image_type_matplotlib_cannot_write_here_is_one_line(tmp_path):
    """.pgf is a type matplotlib lists, but writing it needs a TeX: a RuntimeError traceback before."""
    _write_state(tmp_path / "a", 3, with_eval=False)
    output = tmp_path / "curves.pgf"
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "a"), "-o", str(output)])
    message = str(exc.value)
    assert message.startswith(f"prompt-aug-plot: error: --output {output}: matplotlib cannot write .pgf here")
    assert "such as .png" in message and "\n" not in message


def test_a_smoothing_window_below_one_is_refused(tmp_path):
    _write_state(tmp_path / "a", 3, with_eval=False)
    with pytest.raises(SystemExit, match=r"^prompt-aug-plot: error: --smooth 0: give a number of logged"):
        main([str(tmp_path / "a"), "--smooth", "0", "-o", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()
