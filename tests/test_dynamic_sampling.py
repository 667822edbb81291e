"""Dynamic sampling: a round trains only groups whose rewards differ, on one or two processes, after resume.

The runs train the smoke recipe with the rewards of `tests/dynamic_harness.py`, which make half of all
questions zero-spread (a quarter all-right, a quarter all-wrong) whatever the tiny model writes.
The end-to-end tests, measured on the shared 2-core development box under heavy load: 10-40 s each and
about 90 s for the 3-round fixture (all over 20 s but one); about 4 min for the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch
from bench_tools import run_bench
from launch import torchrun
from safetensors.torch import load_file

from prompt_aug import train
from prompt_aug.cli import UsageError
from prompt_aug.extensions.dynamic_sampling import (
    DynamicSampler,
    extra_question_indices,
    from_args,
    group_outcome,
    group_spread,
    plan_round,
    signal_column,
)
from prompt_aug.metrics import correctness_scores, ending_ids
from prompt_aug.trainer import PromptAugGRPOTrainer
from rewards import get_reward_funcs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dynamic_harness

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")
NUM_GEN = 4
METRICS = "dynamic_sampling/"


# ---------------------------------------------------------------------------------------------
# The pieces


def test_spread_uses_a_tolerance_not_exact_zero():
    # A group whose rewards differ only by float noise (0.1 + 0.2 vs 0.3) has no spread.
    noisy = torch.tensor([0.1 + 0.2, 0.3, 0.3, 0.3], dtype=torch.float64)
    assert float(noisy.std()) > 0
    assert group_spread(noisy, 4, 1e-4) == [False]
    assert group_spread(torch.tensor([0.0, 0.0, 0.0, 1.0]), 4, 1e-4) == [True]
    # NaN (a reward function returned None) is ignored; a group of NaN has no spread.
    assert group_spread(
        torch.tensor([float("nan"), 1.0, 0.0, 1.0, float("nan")] + [float("nan")] * 3), 4, 1e-4
    ) == [
        True,
        False,
    ]


def test_the_default_tolerance_sees_a_one_token_overlong_penalty_as_spread():
    # TRL divides by std + 1e-4: a group this close to flat still gets advantages of about +-1 there, so it
    # is not flat; the default tolerance is far below that, above float noise alone.
    group = torch.tensor([-0.5] * 7 + [-0.5 + 1 / 4096])
    assert group_spread(group, 8, DynamicSampler().std_tol) == [True]
    assert group_spread(torch.tensor([0.1 + 0.2] + [0.3] * 7), 8, DynamicSampler().std_tol) == [False]


@pytest.mark.parametrize(
    ("aggregation", "spread"), [("sum_then_normalize", False), ("normalize_then_sum", True)]
)
def test_under_normalize_then_sum_a_flat_total_of_varying_rewards_has_spread(aggregation, spread):
    # Rewards a and b vary in the first group but their weighted total (1 a + 2 b) is 0.5 throughout; TRL's
    # normalize_then_sum scales each within the group before summing, so that group's advantages are not 0.
    # The second group is flat in both.
    from types import SimpleNamespace

    a = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    rewards = torch.stack([a, 0.25 - 0.5 * a], dim=1)
    trainer = SimpleNamespace(
        num_generations=4, reward_weights=torch.tensor([1.0, 2.0]),
        args=SimpleNamespace(multi_objective_aggregation=aggregation),
    )  # fmt: skip
    sampler = DynamicSampler()
    assert sampler._spread(trainer, rewards, sampler._signal(trainer, rewards)) == [spread, False]
    # A reward function of weight 0 does not count.
    trainer.reward_weights = torch.tensor([1.0, 0.0])
    rewards = torch.stack([torch.ones(8), a], dim=1)
    assert sampler._spread(trainer, rewards, sampler._signal(trainer, rewards)) == [False, False]


def test_under_normalize_then_sum_rewards_that_cancel_once_scaled_give_no_spread():
    # Right answers unformatted, wrong ones formatted: each function varies, but scaled within the group
    # and summed at equal weights they cancel, so every advantage TRL gives the first group is 0. The second
    # group's rewards vary together: spread.
    from types import SimpleNamespace

    from trl.trainer.utils import nanstd

    right = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    formatted = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    rewards = torch.stack([right, formatted], dim=1)
    trainer = SimpleNamespace(
        num_generations=4, reward_weights=torch.tensor([1.0, 1.0]),
        args=SimpleNamespace(multi_objective_aggregation="normalize_then_sum"),
    )  # fmt: skip
    # TRL 1.16's normalize_then_sum, as `_generate_and_score_completions` computes it.
    grouped = rewards.view(-1, 4, 2)
    scaled = (grouped - grouped.nanmean(dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
    total = scaled.sum(dim=2).view(-1)
    advantages = (total - total.nanmean()) / (nanstd(total) + 1e-4)
    assert advantages[:4].abs().max() < 1e-6 < advantages[4:].abs().min()
    sampler = DynamicSampler()
    assert sampler._spread(trainer, rewards, sampler._signal(trainer, rewards)) == [False, True]


def test_outcome_names_all_right_and_all_wrong():
    assert group_outcome(torch.tensor([1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.0, 0.0]), 4, 1e-4) == [
        "all_right",
        "all_wrong",
        "no_spread",
    ]
    # With correctness_pm5 (RLinf's +5 / -5), right and wrong are its scores, read from the reward function.
    funcs = get_reward_funcs(["format", "correctness_pm5"])
    column, right, wrong = correctness_scores(funcs)
    pm5 = torch.tensor([[1.0, 5.0], [1.0, 5.0], [0.0, -5.0], [0.0, -5.0], [1.0, 5.0], [0.0, -5.0]])
    assert column == 1 and group_outcome(pm5[:, column], 2, 1e-4, right, wrong) == [
        "all_right",
        "all_wrong",
        "no_spread",
    ]


def test_plan_keeps_the_first_spread_groups_and_fills_a_shortfall_in_generation_order_spaced_among_them():
    full = plan_round([[True, False, True], [True, True, False]], [[], []], 3)
    assert full.trained == [(0, 0), (0, 2), (1, 0)]
    assert full.status[(1, 1)] == "surplus" and "filled" not in full.status.values()
    short = plan_round(
        [[False, True, False], [False, False, False]], [["all_right", "", "all_wrong"], ["all_wrong"] * 3], 3
    )
    assert short.trained == [(0, 0), (0, 1), (0, 2)]  # the fillers (0, 0) and (0, 2) spaced around the kept
    assert short.counts() == Counter({"kept": 1, "filled": 2, "all_wrong": 3})


def test_filler_groups_are_shared_evenly_by_the_processes():
    """Two kept groups and six fillers in a round of 8 groups on 2 processes (4 each, cut in order): each
    process trains 3 fillers, not the second process 4 and the first 2 (a per-micro-batch token mean would
    scale the second's kept rows down). Kept and fillers each stay in generation order."""
    plan = plan_round([[True, True, False, False, False, False, False, False]], [[]], 8)
    fillers = [plan.status[key] == "filled" for key in plan.trained]
    assert sum(fillers[:4]) == sum(fillers[4:]) == 3
    assert [key for key in plan.trained if plan.status[key] == "kept"] == [(0, 0), (0, 1)]
    assert [key for key in plan.trained if plan.status[key] == "filled"] == [(0, g) for g in range(2, 8)]
    for processes in (2, 4):
        plan = plan_round([[g < 3 for g in range(16)]], [[]], 16)
        counts = [
            sum(plan.status[key] == "filled" for key in share)
            for share in (plan.trained[i : i + 16 // processes] for i in range(0, 16, 16 // processes))
        ]
        assert max(counts) - min(counts) <= 1, (processes, counts)


def test_extra_questions_depend_on_seed_round_and_pass_only():
    uids = [f"q{i}" for i in range(100)]
    a = extra_question_indices(42, 7, 1, uids, 10, set())
    assert a == extra_question_indices(42, 7, 1, uids, 10, set())
    assert (
        a
        != extra_question_indices(42, 7, 2, uids, 10, set())
        != extra_question_indices(42, 8, 1, uids, 10, set())
    )
    assert a != extra_question_indices(43, 7, 1, uids, 10, set())
    seen = {uids[i] for i in a}
    assert not seen & {uids[i] for i in extra_question_indices(42, 7, 1, uids, 10, seen)}
    # A training set smaller than the request repeats questions instead of failing.
    assert len(extra_question_indices(0, 0, 1, uids[:3], 8, set(uids[:3]))) == 8


def test_bad_keys_are_named(tmp_path):
    with pytest.raises(UsageError, match="dynamic_sampling_signal: 'acc'"):
        train.train(["--config", SMOKE, "--dynamic_sampling", "true", "--dynamic_sampling_signal", "acc",
                     "--output_dir", str(tmp_path / "out")])  # fmt: skip
    with pytest.raises(UsageError, match="dynamic_sampling_signal: 'acc'"):  # the dry run too
        train.train(["--config", SMOKE, "--dry_run", "--dynamic_sampling", "true",
                     "--dynamic_sampling_signal", "acc"])  # fmt: skip
    with pytest.raises(ValueError, match="dynamic_sampling: true needs prompt_augmentation: true"):
        train.parse_args(["--config", SMOKE, "--dynamic_sampling", "true", "--prompt_augmentation", "false"])
    with pytest.raises(ValueError, match="dynamic_sampling_max_passes"):
        DynamicSampler(max_passes=0)
    with pytest.raises(ValueError, match="dynamic_sampling_max_passes: must be at least 1"):
        train.parse_args(
            ["--config", SMOKE, "--dynamic_sampling", "true", "--dynamic_sampling_max_passes", "0"]
        )
    funcs = get_reward_funcs(["correctness", "format"])
    names = [f.__name__ for f in funcs]
    args = train.parse_args(
        ["--config", SMOKE, "--dynamic_sampling", "true", "--dynamic_sampling_signal", "format"]
    ).training_args
    assert from_args(args, funcs, names).signal_index == 1
    # The trainer's own name for a reward function works too, as do functions passed in code.
    args.dynamic_sampling_signal = "format_reward"
    assert from_args(args, funcs, names).signal_index == 1
    assert signal_column("mine", [len, funcs[0]], ["mine", names[0]]) == 0
    with pytest.raises(ValueError, match=r"'format' is neither 'total' nor one of .*\['mine'\]"):
        signal_column("format", [len], ["mine"])
    args = train.parse_args(["--config", SMOKE]).training_args
    assert from_args(args, funcs, names) is None


def _run(out: Path, *extra: str, spy: list | None = None, generated: list | None = None) -> Path:
    """Train the smoke recipe into ``out``. ``spy`` gets (global step, completion ids, mask) per loss call;
    ``generated``, per call of TRL's generation, the global step and each completion's length and whether it
    was cut at the length limit (did not end in a stop or pad token, as TRL judges it)."""
    with pytest.MonkeyPatch.context() as mp:
        if generated is not None:
            generate = PromptAugGRPOTrainer.trl_generate_round

            def recording_generate(self, prompts):
                result = generate(self, prompts)
                ending = set(ending_ids(self))
                cut = [ids[-1] not in ending for ids in result.completion_ids]
                generated.append((self.state.global_step, [len(i) for i in result.completion_ids], cut))
                return result

            mp.setattr(PromptAugGRPOTrainer, "trl_generate_round", recording_generate)
        if spy is not None:
            original = PromptAugGRPOTrainer.compute_loss

            def recording_compute_loss(self, model, inputs, *args, **kwargs):
                spy.append(
                    (
                        self.state.global_step,
                        inputs["completion_ids"].clone(),
                        inputs["completion_mask"].clone(),
                    )
                )
                return original(self, model, inputs, *args, **kwargs)

            mp.setattr(PromptAugGRPOTrainer, "compute_loss", recording_compute_loss)
        train.main(["--config", SMOKE, "--output_dir", str(out), *extra])
    return out


def _records(run: Path, step: int) -> pd.DataFrame:
    return pd.read_parquet(run / "completions" / f"completions_{step:05d}.parquet")


def _history(run: Path) -> dict[int, dict]:
    history = json.loads((run / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h for h in history if "loss" in h}


DYNAMIC = ("--reward_funcs", dynamic_harness.FLAT_HALF, "--dynamic_sampling", "true")


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    # 3 rounds of 4 questions (2 optimizer steps each); checkpoints at steps 2, 4, 6. What each generation
    # call produced is kept beside the run, in `GENERATED`.
    generated: list = []
    run = _run(tmp_path_factory.mktemp("dyn") / "A", *DYNAMIC, "--max_steps", "6", generated=generated)
    (run / GENERATED).write_text(json.dumps(generated))
    return run


GENERATED = "generated_lengths.json"


ROUND_STEPS = (1, 3, 5)  # the step at which each round of `dynamic_run` is generated and logged


@pytest.mark.slow
@pytest.mark.parametrize("step", ROUND_STEPS)
def test_only_spread_groups_are_kept_and_the_known_flat_ones_dropped(dynamic_run, step):
    records = _records(dynamic_run, step)
    kept = records[records["kept"]]
    assert len(kept) == 16  # the round is full: 4 groups of 4
    # Each record's reward is its own completion's (none moved to another row, kept or dropped).
    assert records["flat_half_reward"].tolist() == pytest.approx(
        dynamic_harness.flat_half_reward(records["completion"].tolist(), records["uid"].tolist())
    )
    for uid, group in records.groupby("uid"):
        assert len(group) == NUM_GEN and group["template"].nunique() == 1 and group["kept"].nunique() == 1
        kind = dynamic_harness.question_number(uid) % 4
        status = group["group_status"].iloc[0]
        spread = group["flat_half_reward"].std() > 1e-4
        assert spread == (kind not in (dynamic_harness.ALL_RIGHT, dynamic_harness.ALL_WRONG))
        if kind == dynamic_harness.ALL_RIGHT:
            assert status == "all_right"
        elif kind == dynamic_harness.ALL_WRONG:
            assert status == "all_wrong"
        else:
            assert status in ("kept", "surplus")
    # Trained rows carry TRL's group-normalised advantage; dropped rows none.
    assert kept["advantage"].notna().all() and records.loc[~records["kept"], "advantage"].isna().all()
    for _, group in kept.groupby("uid"):
        r = group["flat_half_reward"]
        expected = (r - r.mean()) / (r.std() + 1e-4)
        assert group["advantage"].to_numpy() == pytest.approx(expected.to_numpy(), abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("step", ROUND_STEPS)
def test_metrics_match_the_records(dynamic_run, step):
    records, logged = _records(dynamic_run, step), _history(dynamic_run)[step]
    groups = records.groupby("uid").first()
    status = Counter(groups["group_status"])
    assert logged[METRICS + "groups_generated"] == len(groups)
    assert logged[METRICS + "groups_kept"] == status["kept"] == 4
    assert logged[METRICS + "dropped_all_right"] == status["all_right"]
    assert logged[METRICS + "dropped_all_wrong"] == status["all_wrong"]
    assert logged[METRICS + "groups_surplus"] == status["surplus"]
    assert logged[METRICS + "groups_filled"] == 0 and logged[METRICS + "cap_hit"] == 0
    assert logged[METRICS + "generation_passes"] == records["generation_pass"].max() + 1
    assert logged[METRICS + "kept_share"] == pytest.approx(4 / len(groups))
    assert (
        0 <= logged[METRICS + "trained/completions/clipped_ratio"] <= 1
    )  # the guard's entropy mask reads it
    for name, rows in records.groupby("template"):
        assert logged[f"templates/{name}/count"] == len(rows)
        assert logged[f"templates/{name}/kept"] == rows["kept"].sum()
    # TRL's reward metrics are over the trained rows: none of them is zero-spread.
    assert logged["frac_reward_zero_std"] == 0
    assert logged["reward"] == pytest.approx(records.loc[records["kept"], "flat_half_reward"].mean())
    # The same metrics over every generated row, dropped groups included (what the collapse guard reads),
    # and the repetition the guard watches (the smoke recipe sets its ceiling).
    everything = records["flat_half_reward"].mean()
    assert logged[METRICS + "generated/reward"] == pytest.approx(everything)
    assert logged[METRICS + "generated/rewards/flat_half_reward/mean"] == pytest.approx(everything)
    assert 0 <= logged[METRICS + "generated/completions/clipped_ratio"] <= 1
    # TRL's own truncation metric is taken in each generation pass, so it too covers every generated row.
    assert logged["completions/clipped_ratio"] == pytest.approx(
        logged[METRICS + "generated/completions/clipped_ratio"]
    )
    # TRL's length metrics are over the round's every completion, as TRL computes them over one round: the
    # true minimum and the terminated lengths of all passes together, not a mean of each pass's (in which a
    # pass with no terminated completion counts 0). Generation ran once per pass, never for the replay.
    calls = [c for c in json.loads((dynamic_run / GENERATED).read_text()) if c[0] == step - 1]
    assert len(calls) == logged[METRICS + "generation_passes"]
    lengths = torch.tensor([n for c in calls for n in c[1]], dtype=torch.float)
    cut = torch.tensor([x for c in calls for x in c[2]])
    ended = lengths[~cut] if (~cut).any() else torch.zeros(1)
    expected = {
        "mean_length": lengths.mean(), "min_length": lengths.min(), "max_length": lengths.max(),
        "clipped_ratio": cut.float().mean(), "mean_terminated_length": ended.mean(),
        "min_terminated_length": ended.min(), "max_terminated_length": ended.max(),
    }  # fmt: skip
    for name, value in expected.items():
        assert logged[f"completions/{name}"] == pytest.approx(value.item()), name
    assert 0 <= logged["completions/repetition_ratio"] <= 1 and "collapse/repetition" in logged
    assert all(f"templates/{name}/repetition" in logged for name in records["template"].unique())


@pytest.mark.slow
def test_a_log_line_over_several_rounds_gives_the_kept_share_of_all_their_groups(dynamic_run, tmp_path):
    """The same run logged once over its three rounds: ``kept_share`` is their groups kept over their groups
    generated (rounds that took more passes weigh more), not the mean of the three rounds' shares."""
    history = _history(dynamic_run)
    generated = [history[s][METRICS + "groups_generated"] for s in ROUND_STEPS]
    assert len(set(generated)) > 1, generated  # else both readings agree and nothing is shown
    once = _history(_run(tmp_path / "once", *DYNAMIC, "--max_steps", "6", "--logging_steps", "6"))[6]
    assert once[METRICS + "groups_kept"] == 4
    assert once[METRICS + "kept_share"] == pytest.approx(3 * 4 / sum(generated))


@pytest.mark.slow
def test_some_round_needed_a_second_pass_and_its_questions_are_new(dynamic_run):
    passes = [_records(dynamic_run, s)["generation_pass"].max() + 1 for s in ROUND_STEPS]
    assert max(passes) >= 2, passes  # with half the questions flat, a 4-question round rarely fills at once
    for step in ROUND_STEPS:
        records = _records(dynamic_run, step)
        assert records.groupby("uid")["generation_pass"].nunique().max() == 1  # no question twice in a round


@pytest.mark.slow
def test_resume_at_a_round_boundary_reproduces_the_uninterrupted_run(dynamic_run, tmp_path):
    # Resume from the checkpoint after the first round (mid-epoch) into a fresh folder.
    resumed = _run(
        tmp_path / "B",
        *DYNAMIC,
        "--max_steps",
        "6",
        "--resume_from_checkpoint",
        str(dynamic_run / "checkpoint-2"),
    )
    columns = ["step", "uid", "template", "kept", "group_status", "generation_pass", "completion"]
    for step in (3, 4, 5, 6):
        pd.testing.assert_frame_equal(_records(resumed, step)[columns], _records(dynamic_run, step)[columns])
    assert (resumed / "checkpoint-6").is_dir()


@pytest.mark.slow
def test_trained_rows_are_the_kept_records_with_several_iterations(tmp_path):
    # steps_per_generation 2 x num_iterations 2: one round, trained twice over 4 optimizer steps.
    spy: list = []
    extra = ("--num_iterations", "2", "--max_steps", "4", "--save_strategy", "no")
    run = _run(tmp_path / "it", *DYNAMIC, *extra, spy=spy)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "tiny-random-qwen2")
    records = _records(run, 1)
    kept = Counter(records.loc[records["kept"], "completion"])
    assert sum(kept.values()) == 16 and (~records["kept"]).any()
    for iteration in (
        0,
        1,
    ):  # global steps 0-1, then 2-3: each pass over the round trains exactly the kept rows
        trained = Counter()
        for global_step, ids, mask in spy:
            if global_step // 2 == iteration:
                texts = tokenizer.batch_decode(
                    [i[m.bool()] for i, m in zip(ids, mask)], skip_special_tokens=True
                )
                trained.update(texts)
        assert trained == kept
    initial = load_file(str(run / "tiny-random-qwen2" / "model.safetensors"))
    final = load_file(str(run / "model.safetensors"))
    assert any(not torch.equal(initial[k], final[k]) for k in initial), "no weight changed"


@pytest.mark.slow
def test_at_the_cap_zero_spread_groups_fill_the_round(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="prompt_aug.dynamic_sampling"):
        run = _run(
            tmp_path / "cap",
            *DYNAMIC,
            "--dynamic_sampling_max_passes",
            "1",
            "--max_steps",
            "6",
            "--save_strategy",
            "no",
        )
    records, logged = _records(run, 1), _history(run)[1]
    # A warning names the key at the first round that hits the cap, then only after a round that fills up.
    capped = [_history(run)[step][METRICS + "cap_hit"] == 1 for step in ROUND_STEPS]
    starts = [r + 1 for r, hit in enumerate(capped) if hit and (r == 0 or not capped[r - 1])]
    warned = [m for m in caplog.messages if "dynamic_sampling_max_passes: 1" in m]
    assert [int(m.split("round ")[1].split()[0]) for m in warned] == starts and starts[0] == 1
    assert f"round 1 found {int(logged[METRICS + 'groups_kept'])} of 4 groups with reward spread" in warned[0]
    assert (
        f"so {int(logged[METRICS + 'groups_filled'])} groups with no spread in the signal fill it"
        in warned[0]
    )
    assert logged[METRICS + "cap_hit"] == 1 and logged[METRICS + "generation_passes"] == 1
    filled = records[records["group_status"] == "filled"]
    assert logged[METRICS + "groups_filled"] == filled["uid"].nunique() > 0
    assert records["kept"].all() and len(records) == 16
    assert (filled["advantage"].abs() < 1e-6).all()  # zero spread, zero advantage


@pytest.mark.slow
def test_flag_off_trains_exactly_as_with_no_group_dropped(tmp_path):
    # Every group has spread under `text_hash`, so dynamic sampling keeps pass 0 whole: the replayed round
    # must train exactly as the flag-off path, which is the trainer without dynamic sampling.
    off = _run(tmp_path / "off", "--reward_funcs", dynamic_harness.TEXT_HASH, "--save_strategy", "no")
    on = _run(
        tmp_path / "on",
        "--reward_funcs",
        dynamic_harness.TEXT_HASH,
        "--dynamic_sampling",
        "true",
        "--save_strategy",
        "no",
    )
    for step in (1, 3):
        a, b = _records(off, step), _records(on, step)
        assert b["kept"].all() and (b["generation_pass"] == 0).all()
        assert {"kept", "group_status", "generation_pass"}.isdisjoint(a.columns)
        pd.testing.assert_frame_equal(a, b[a.columns])
    assert not any(k.startswith(METRICS) for h in _history(off).values() for k in h)
    before, after = load_file(str(off / "model.safetensors")), load_file(str(on / "model.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # Not vacuous: both runs trained (a pair of untrained runs would match too).
    initial = load_file(str(off / "tiny-random-qwen2" / "model.safetensors"))
    still = [k for k in initial if torch.equal(initial[k], before[k])]
    assert not still, f"tensors the runs left unchanged: {still}"


# ---------------------------------------------------------------------------------------------
# Two processes


@pytest.mark.slow
def test_two_processes_agree_and_keep_straddling_groups_whole(tmp_path):
    # 6 rows per process and 4 rollouts per question: in every pass and in the trained round, the second
    # group of 4 has 2 rows on rank 0 and 2 on rank 1. Each process records the rows its loss calls get
    # (dynamic_harness.record_trained_rows).
    out, trained = tmp_path / "run", tmp_path / "trained"
    trained.mkdir()
    cmd = [
        *torchrun(2),
        str(REPO / "tests/dynamic_harness.py"), "--config", SMOKE, "--output_dir", str(out),
        *DYNAMIC, "--max_steps", "4", "--per_device_train_batch_size", "3", "--steps_per_generation", "2",
        "--num_generations", "4", "--save_strategy", "no",
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "DYNAMIC_HARNESS_TRAINED": str(trained),
    }
    result = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [
        json.loads(line)
        for rank in (0, 1)
        for line in (trained / f"rank{rank}.jsonl").read_text().splitlines()
    ]
    assert {c["process"] for c in calls} == {0, 1}
    history = _history(out)
    for step in (1, 3):
        records = _records(out, step)
        kept = records[records["kept"]].reset_index(drop=True)
        assert len(kept) == 12 and kept.groupby("uid").size().eq(NUM_GEN).all()
        assert (kept.groupby("uid")["flat_half_reward"].std() > 1e-4).all()
        assert (records.groupby(["generation_pass", "uid"])["process"].nunique() == 2).any()
        # The round's rows as the loss got them (global steps step-1 and step): each kept row once, on one
        # process, with the advantage it trained with.
        rows = [
            (c["process"], text, advantage)
            for c in calls
            if c["step"] in (step - 1, step)
            for text, advantage in zip(c["completions"], c["advantages"], strict=True)
        ]
        assert kept["completion"].is_unique and sorted(t for _, t, _ in rows) == sorted(kept["completion"])
        by_text = {text: (process, advantage) for process, text, advantage in rows}
        kept = kept.assign(
            trained_on=[by_text[t][0] for t in kept["completion"]],
            trained_advantage=[by_text[t][1] for t in kept["completion"]],
        )
        assert kept.groupby("trained_on").size().to_dict() == {0: 6, 1: 6}  # 2 steps of 3 rows a process
        straddling = [uid for uid, group in kept.groupby("uid") if group["trained_on"].nunique() == 2]
        assert straddling, kept[["uid", "trained_on"]]
        for uid, group in kept.groupby("uid"):  # normalised over the whole group, across the processes
            r = group["flat_half_reward"]
            expected = ((r - r.mean()) / (r.std() + 1e-4)).to_numpy()
            assert group["trained_advantage"].to_numpy() == pytest.approx(expected, abs=1e-4), uid
            assert group["advantage"].to_numpy() == pytest.approx(expected, abs=1e-4), uid
        groups = records.groupby("uid").first()
        assert history[step][METRICS + "groups_generated"] == len(groups)
        assert history[step][METRICS + "groups_kept"] == (groups["group_status"] == "kept").sum() == 3


# ---------------------------------------------------------------------------------------------
# The recipe


def _spread_on_even_questions(completions, prompts, **kwargs):
    """Spread (0, 1, 0, 1 within a group) on the questions with an even number, none on the others."""
    even = ["is 0+" in str(p) or "is 2+" in str(p) or "is 4+" in str(p) for p in prompts]
    return [float(i % 2) if e else 0.0 for i, e in enumerate(even)]


def test_a_dataset_without_ids_draws_extra_questions_by_the_ids_the_collator_derives(
    tiny_model_dir, tmp_path
):
    """A plain TRL dataset (a ``prompt`` column, no ``uid``) under dynamic sampling: a round short of spread
    groups draws extra questions, identified as the collator identifies them (from the question)."""
    import datasets

    from prompt_aug import PromptAugGRPOConfig
    from prompt_aug.collator import row_uid
    from prompt_aug.extensions.dynamic_sampling import dataset_uids

    rows = datasets.Dataset.from_list([{"prompt": f"What is {a}+1?", "level": a % 3} for a in range(6)])
    assert dataset_uids(rows) == [row_uid({}, f"What is {a}+1?") for a in range(6)]
    questions = rows.add_column("question", [f"Find {a}+1." for a in range(6)])  # read before the prompt
    assert dataset_uids(questions) == [row_uid({}, f"Find {a}+1.") for a in range(6)]
    with_ids = rows.add_column("uid", [f"u{a}" for a in range(6)])
    assert dataset_uids(with_ids) == [f"u{a}" for a in range(6)]
    some_missing = rows.add_column("uid", [None, "u1", "", "u3", None, "u5"])  # drawn by the question there
    assert (
        dataset_uids(some_missing)
        == [row_uid({"uid": uid}, f"What is {a}+1?") for a, uid in enumerate(some_missing["uid"])]
        == [
            row_uid({}, "What is 0+1?"),
            "u1",
            row_uid({}, "What is 2+1?"),
            "u3",
            row_uid({}, "What is 4+1?"),
            "u5",
        ]
    )
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, max_steps=2, seed=1,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=4, save_strategy="no",
        dynamic_sampling=True, dynamic_sampling_max_passes=4,
    )  # fmt: skip
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=_spread_on_even_questions, args=args, train_dataset=rows
    )
    trainer.train()
    passes = [
        h["dynamic_sampling/generation_passes"]
        for h in trainer.state.log_history
        if "dynamic_sampling/generation_passes" in h
    ]
    assert passes and max(passes) >= 2, passes  # half the questions are flat: some round drew extra ones
    assert trainer.state.global_step == 2


def test_trl_evaluation_with_completion_logs_runs_beside_dynamic_sampling(tiny_model_dir, tmp_path):
    """An ``eval_dataset`` evaluated during training, with ``log_completions``: the evaluation round's
    records share TRL's completions table with the training rounds' (which carry ``kept``,
    ``group_status`` and ``generation_pass``), so they need those columns too."""
    import datasets

    from prompt_aug import PromptAugGRPOConfig

    rows = datasets.Dataset.from_list([{"prompt": f"What is {a}+1?"} for a in range(6)])
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, max_steps=2, seed=1,
        per_device_train_batch_size=8, per_device_eval_batch_size=8, num_generations=4,
        max_completion_length=4, save_strategy="no", dynamic_sampling=True, log_completions=True,
        num_completions_to_print=0, eval_strategy="steps", eval_steps=1, logging_steps=1,
    )  # fmt: skip
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=_spread_on_even_questions, args=args, train_dataset=rows,
        eval_dataset=rows.select(range(4)),
    )  # fmt: skip
    trainer.train()
    evaluated = [h["step"] for h in trainer.state.log_history if "eval_reward" in h]
    assert evaluated == [1, 2] and trainer.state.global_step == 2


def test_dynamic_recipe_is_the_paper_run_plus_dynamic_sampling():
    import yaml

    paper_dir = REPO / "recipes/qwen2.5-math-1.5b"
    paper = yaml.safe_load((paper_dir / "prompt_aug.yaml").read_text())
    dynamic = yaml.safe_load((paper_dir / "prompt_aug_dynamic.yaml").read_text())
    differ = {k for k in set(paper) | set(dynamic) if paper.get(k) != dynamic.get(k)}
    # Only naming and the dynamic-sampling block differ: the fidelity values are the paper recipe's.
    assert differ - {"output_dir", "run_name"} == {
        "dynamic_sampling", "dynamic_sampling_signal", "dynamic_sampling_max_passes",
        "dynamic_sampling_std_tol",
    }  # fmt: skip
    assert (
        dynamic["vllm_importance_sampling_correction"],
        dynamic["delta"],
        dynamic["save_total_limit"],
        dynamic["wandb_completions_rows"],
    ) == (False, 3.0, 3, 16)
    script_args, training_args, _, _ = train.parse_args(
        ["--config", str(paper_dir / "prompt_aug_dynamic.yaml"), "--dry_run"]
    )
    funcs = get_reward_funcs(script_args.reward_funcs)
    sampler = from_args(training_args, funcs, [f.__name__ for f in funcs])
    assert sampler.signal_index == script_args.reward_funcs.index("correctness") and sampler.max_passes == 4


@pytest.mark.parametrize(
    ("value", "expected"),
    [("-1", "must be at least 0"), ("nan", "is NaN"), ("inf", "is infinite; give a finite number")],
)
def test_a_spread_tolerance_that_is_no_finite_number_from_0_is_refused_in_one_line(value, expected):
    """inf would call every group flat, and every round would train on fillers."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(
            [
                "--config",
                SMOKE,
                "--dry_run",
                "--dynamic_sampling",
                "true",
                "--dynamic_sampling_std_tol",
                value,
            ]
        )
    message = str(exit_info.value.code)
    assert f"dynamic_sampling_std_tol: {expected}" in message and "\n" not in message, message
    with pytest.raises(ValueError, match="dynamic_sampling_std_tol must be a finite number >= 0"):
        DynamicSampler(std_tol=float(value))  # built in code, the sampler checks it too


@pytest.mark.parametrize(
    ("key", "value"), [("scale_rewards", "batch"), ("multi_objective_aggregation", "normalize_then_sum")]
)
def test_dynamic_sampling_bench_refuses_a_recipe_whose_zero_std_share_is_not_per_group(tmp_path, key, value):
    """The table's "trained groups with spread" is 1 - TRL's ``frac_reward_zero_std``, which counts groups of
    zero spread only under group (or no) scaling with ``sum_then_normalize``; otherwise TRL takes one std over
    the whole batch and the column would read about 1.00 whatever the groups. Such a recipe is refused in one
    line, before any training."""
    recipe = (REPO / "recipes/smoke/tiny_cpu.yaml").read_text().replace("scale_rewards: group\n", "")
    config = tmp_path / "recipe.yaml"
    config.write_text(f"{recipe}\n{key}: {value}\n")
    result = run_bench(["bench/dynamic_sampling.py", "--config", str(config), "--rounds", "1"], timeout=600)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert f"{key} {value}" in result.stderr.splitlines()[-1], result.stderr[-2000:]
    assert "trained groups with spread" not in result.stdout
