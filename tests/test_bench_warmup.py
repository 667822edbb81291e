"""The benches of bench/ that time several modes in one process warm it up first, so that its one-time costs
(modules loaded on first use, first calls) fall on none of the timed modes."""

from __future__ import annotations

import ast

from bench_tools import run_patched_bench


def test_dynamic_sampling_bench_warms_up_before_timing_either_arm():
    """bench/dynamic_sampling.py runs both arms in one process: an untimed round goes first, and the table
    holds the two timed arms only, off then on, each for the rounds asked."""
    patch = """
    calls = []

    def run(config, rounds, dynamic, max_passes, out, recipe_rewards, signal):
        calls.append((rounds, dynamic, max_passes, out.name, recipe_rewards, signal))
        result = {"seconds_per_round": 10.0 + len(calls), "cpu_seconds_per_round": 20.0 + len(calls),
                  "trained_groups_with_spread": 0.5}
        if dynamic:
            result.update(generation_passes=2.0, kept_share=0.5, cap_hit=0.0)
        return result

    bench.run = run
    sys.argv = ["dynamic_sampling.py", "--rounds", "3", "--max_passes", "2"]
    """
    result = run_patched_bench("dynamic_sampling.py", patch, "bench.main()\nprint('CALLS', calls)")
    assert result.returncode == 0, result.stderr[-2000:]
    calls = ast.literal_eval(result.stdout.split("CALLS ", 1)[1].strip())
    warm_up, off, on = calls  # exactly three runs
    assert warm_up[:3] == (1, True, 2) and warm_up[3] not in (off[3], on[3])
    assert off[:3] == (3, False, 2) and on[:3] == (3, True, 2)
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| on ", "| off "))]
    # The table's times are the timed arms' (the second and third runs), not the warm-up's.
    assert rows == [
        "| off | 12.00 | 22.00 | 0.50 | 1 | - | - |",
        "| on | 13.00 | 23.00 | 0.50 | 2.00 | 0.50 | 0.00 |",
    ]


def test_threads_bench_times_a_forward_and_backward_pass_after_an_untimed_one(tmp_path):
    """bench/threads.py's cell (one interpreter per thread setting) times its fwd+bwd pass after one untimed
    pass, as it times generation after an untimed one: the first backward of a process pays one-time costs."""
    patch = f"""
    sys.path.insert(0, os.getcwd())
    from prompt_aug.demo.smoke import build_tiny_model

    model = str(build_tiny_model({str(tmp_path / "model")!r}))
    backwards = []
    backward = torch.Tensor.backward
    def counted(self, *args, **kwargs):
        backwards.append(self.shape)
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = counted
    sys.argv = ["-c", model, "2", "3", "4"]  # 2 rows, 3 new tokens, prompts of 4 tokens
    """
    result = run_patched_bench("threads.py", patch, "exec(bench._CELL)\nprint('BACKWARDS', len(backwards))")
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"fwd_bwd_s"' in result.stdout
    assert result.stdout.split("BACKWARDS ", 1)[1].strip() == "2"  # one untimed, then the timed one
