"""Several nodes on one machine: the multi-node rendezvous for real, and the Slurm launcher's commands.

* Two `accelerate launch` processes started separately, as two nodes would start them (``--num_machines 2
  --machine_rank 0/1 --main_process_ip 127.0.0.1``, one process each, gloo on CPU), train the smoke recipe
  into one output folder, as nodes sharing a file system do. Then ``accelerate_configs/slurm/train.slurm``
  restarts that run as a requeued job would, through a stand-in ``srun`` that starts one task per "node"
  on this machine: it must add ``--resume_from_checkpoint true`` and train on from the checkpoint.
* The launcher's commands under a fake Slurm environment: ``--print-command`` for both layouts, the flags
  that continue a run, and the signal path with a stand-in ``accelerate`` (SIGUSR1 reaches the training
  processes, the job is requeued unless the run finished).
* The per-node command's ``PET_SIGNALS_TO_HANDLE`` on a real `accelerate launch` of two worker processes:
  the workers get SIGUSR1 whether it is sent to every process or to the launcher alone (without the
  variable, the control, the launcher dies of it and the workers never hear of it).

Times on 2 shared cores: the two-node run about 40 s, the launcher's resumed run about 65 s (it also runs
the batch-arithmetic check, about 20 s), the USR1 three about 10 s (all marked slow); the rest about
20 s.

The stand-ins (``srun``, ``scontrol``, ``accelerate``, ``trl``) are written into a temporary ``bin/``. The
stand-in ``srun`` passes a signal to every process of its tasks, as Slurm's process tracking does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fault_harness import tiny_checkpoint as tiny_files
from launch import free_port

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "accelerate_configs/slurm/train.slurm"
SMOKE = "recipes/smoke/tiny_cpu.yaml"
PAPER = "recipes/qwen2.5-math-1.5b/prompt_aug.yaml"
VENV_BIN = Path(sys.executable).parent
# How the launcher starts `accelerate launch` on each node (the real USR1 test below runs it).
NODE_PREFIX = "export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1; exec "

# ---------------------------------------------------------------------------------------------
# Stand-ins for Slurm and the launchers.

SCONTROL = r"""#!/bin/bash
# show hostnames LIST: "pre[a-b]" or a comma list, one name a line; requeue JOB: recorded
case $1 in
    show)
        if [[ $3 =~ ^(.*)\[([0-9]+)-([0-9]+)\]$ ]]; then
            p=${BASH_REMATCH[1]} a=${BASH_REMATCH[2]} b=${BASH_REMATCH[3]}
            for ((i = 10#$a; i <= 10#$b; i++)); do printf "%s%0${#a}d\n" "$p" "$i"; done
        else
            tr , '\n' <<<"$3"
        fi ;;
    requeue) echo "requeue $2" >>"$FAKE_OUT/slurm.log" ;;
esac
"""

SRUN = """#!{python}
import json, os, signal, subprocess, sys, time

args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
hosts = opts.get("nodelist", "").split(",")
out = os.environ["FAKE_OUT"]
with open(os.path.join(out, "slurm.log"), "a") as log:
    log.write("srun " + json.dumps({{"opts": opts, "cmd": args}}) + "\\n")
tasks = []
for rank in range(int(opts.get("ntasks", "1"))):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NODEID=str(rank), SLURMD_NODENAME=hosts[rank])
    tasks.append(subprocess.Popen(args, env=env))


def tree(pid):
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{{entry}}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return [pid] + [p for c in children for p in tree(c)]


def forward(sig, _frame):  # Slurm signals every process of the step, not only the task's first
    for task in tasks:
        for pid in tree(task.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


signal.signal(signal.SIGUSR1, forward)
signal.signal(signal.SIGTERM, forward)
while any(t.poll() is None for t in tasks):
    if any(t.poll() not in (None, 0) for t in tasks):  # --kill-on-bad-exit
        forward(signal.SIGTERM, None)
    time.sleep(0.1)
codes = [t.returncode if t.returncode >= 0 else 128 - t.returncode for t in tasks]
sys.exit(max(codes))
"""

ACCELERATE = """#!{python}
import json, os, signal, sys, time

record = {{"argv": sys.argv[1:], "procid": os.environ["SLURM_PROCID"], "node": os.environ["SLURMD_NODENAME"]}}
with open("/proc/self/status") as f:
    ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
record["usr1_ignored"] = bool(ignored >> (signal.SIGUSR1 - 1) & 1)
record["no_proxy"] = os.environ.get("no_proxy")
record["env"] = {{k: os.environ.get(k) for k in ("PYTHONUNBUFFERED", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                                                   "WANDB_RUN_ID", "WANDB_RESUME", "PET_SIGNALS_TO_HANDLE")}}
mode = os.environ.get("FAKE_MODE", "exit0")
got = []
if mode in ("save_on_usr1", "finish_on_usr1", "finish_launcher_1"):  # a handler of their own, as training has
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
elif mode == "ignore":  # a run that does not act on the warning (save_on_preemption: false elsewhere)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
path = os.path.join(os.environ["FAKE_OUT"], "accelerate-" + record["procid"] + ".json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if mode != "exit0":
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
with open(path + ".done", "w") as f:
    f.write("usr1" if got else "end")
if got:  # the ranks' last collective: none exits before every rank has acted on the signal (an exit first
    # would have srun's --kill-on-bad-exit end the others before they had)
    ranks = int(sys.argv[sys.argv.index("--num_machines") + 1])
    others = [os.path.join(os.environ["FAKE_OUT"], f"accelerate-{{r}}.json.done") for r in range(ranks)]
    deadline = time.monotonic() + 30
    while not all(os.path.exists(p) for p in others) and time.monotonic() < deadline:
        time.sleep(0.05)
if mode == "finish_launcher_1" and record["procid"] == "0":  # trained to the end after the warning
    argv = sys.argv[1:]
    run_dir = argv[argv.index("--output_dir") + 1]
    os.makedirs(run_dir, exist_ok=True)
    open(os.path.join(run_dir, "train_results.json"), "w").close()
elif mode == "finish_launcher_1":  # ranks end together (their last collectives): after rank 0 saved
    argv = sys.argv[1:]
    first = os.path.join(argv[argv.index("--output_dir") + 1], "train_results.json")
    deadline = time.monotonic() + 30
    while not os.path.exists(first) and time.monotonic() < deadline:
        time.sleep(0.05)
# accelerate exits 1 when a process exits non-zero, and torch's launcher after a signal it handled
sys.exit(1 if mode in ("save_on_usr1", "finish_launcher_1") and got else 0)
"""

TRL = """#!{python}
import http.server, json, os, signal, sys

argv = sys.argv[1:]
with open(os.path.join(os.environ["FAKE_OUT"], "trl.json"), "w") as f:
    json.dump(argv, f)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path.rstrip("/") == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def stop(sig, frame):
    open(os.path.join(os.environ["FAKE_OUT"], "trl.stopped"), "w").close()
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
server = http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health)
if os.environ.get("FAKE_SERVER_DIES_AFTER"):  # a server lost while training runs: it exits 1 then
    signal.signal(signal.SIGALRM, lambda sig, frame: os._exit(1))
    signal.alarm(int(os.environ["FAKE_SERVER_DIES_AFTER"]))
server.serve_forever()
"""

# The launcher's batch-arithmetic check runs the real parser (about 20 s); the command tests skip it.
PYTHON_NO_DRY_RUN = """#!/bin/bash
if [[ $1 == -m && $2 == prompt_aug.train ]]; then echo "$*" >"$FAKE_OUT/dry_run"; exit 0; fi
exec {python} "$@"
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_slurm(tmp_path):
    """A temporary bin/ of stand-ins and the environment the launcher runs with; ``out`` gets their
    records."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    _write(bin_dir / "scontrol", SCONTROL)
    _write(bin_dir / "srun", SRUN.format(python=sys.executable))
    python = _write(tmp_path / "python", PYTHON_NO_DRY_RUN.format(python=sys.executable))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PATH=os.pathsep.join([str(bin_dir), str(VENV_BIN), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHON=str(python),
        VENV="",
        FAKE_OUT=str(out),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu[07-08]",
        SLURM_NNODES="2",
        SLURM_SUBMIT_DIR=str(REPO),
        SLURM_GPUS_ON_NODE="8",
    )
    return {"bin": bin_dir, "out": out, "env": env, "tmp": tmp_path}


def _launcher(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _plan(env: dict, *args: str) -> dict:
    """``--print-command``'s lines by their first words: ``train on gpu07`` -> the command, etc."""
    result = _launcher(env, "--print-command", *args)
    assert result.returncode == 0, result.stderr
    return dict(line.split(": ", 1) for line in result.stdout.splitlines())


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc), children before their parent's siblings."""
    children = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            pass
    return [pid] + [p for c in children for p in _tree(c)]


def _stop(proc: subprocess.Popen) -> None:
    """Kill a process started with ``start_new_session``, its group and its descendants (torch starts its
    workers in sessions of their own), whether or not it has exited."""
    for pid in _tree(proc.pid) if proc.poll() is None else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---------------------------------------------------------------------------------------------
# The script itself.


def test_the_launcher_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing():
    result = subprocess.run(["shellcheck", str(SCRIPT)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_the_sbatch_header_asks_for_requeue_and_the_warning_signal():
    header = [line for line in SCRIPT.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in header
    assert "#SBATCH --signal=B:USR1@90" in header  # B: the batch shell, which passes it on
    assert "#SBATCH --ntasks-per-node=1" in header  # one launcher per node


# ---------------------------------------------------------------------------------------------
# The commands, for a fake allocation.


def test_colocate_every_node_trains_with_its_rank(fake_slurm):
    plan = _plan(
        fake_slurm["env"], "--recipe", PAPER, "--accelerate", "zero2", "--per_device_train_batch_size", "4"
    )
    launch = (
        "accelerate launch --config_file accelerate_configs/zero2.yaml --num_machines 2 --num_processes 16 "
        "--main_process_ip gpu07 --main_process_port 24242"
    )
    train = f"-m prompt_aug.train --config {PAPER} --per_device_train_batch_size 4"
    assert plan["train on gpu07"] == f"{launch} --machine_rank 0 {train}"
    assert plan["train on gpu08"] == f"{launch} --machine_rank 1 {train}"
    assert "vllm-serve on gpu08" not in plan
    assert plan["output_dir"] == "outputs/qwen2.5-math-1.5b/prompt_aug"  # read from the recipe


def test_server_layout_serves_on_the_last_node_and_trains_on_the_others(fake_slurm):
    env = dict(fake_slurm["env"], SLURM_JOB_NODELIST="gpu[07-09]", MAIN_PROCESS_PORT="29555")
    plan = _plan(
        env, "--layout", "server", "--recipe", PAPER, "--accelerate", "zero3", "--", "--run_name", "a b"
    )
    assert plan["vllm-serve on gpu09"] == (
        "trl vllm-serve --model Qwen/Qwen2.5-Math-1.5B --host 0.0.0.0 --port 8000 --max_model_len 4096"
    )
    for rank, host in enumerate(["gpu07", "gpu08"]):
        assert plan[f"train on {host}"] == (
            "accelerate launch --config_file accelerate_configs/zero3.yaml --num_machines 2 "
            f"--num_processes 16 --main_process_ip gpu07 --main_process_port 29555 --machine_rank {rank} "
            f"-m prompt_aug.train --config {PAPER} --run_name a\\ b "
            "--use_vllm true --vllm_mode server --vllm_server_host gpu09 --vllm_server_port 8000"
        )
    assert "train on gpu09" not in plan


def test_overrides_reach_the_server_and_the_process_count(fake_slurm):
    env = dict(fake_slurm["env"], VLLM_SERVER_PORT="8111", VLLM_SERVE_ARGS="--tensor_parallel_size 2")
    plan = _plan(
        env, "--layout", "server", "--recipe", PAPER, "--gpus-per-node", "4",
        "--model_name_or_path=models/local", "--output_dir", "/tmp/elsewhere",
    )  # fmt: skip
    assert plan["vllm-serve on gpu08"] == (
        "trl vllm-serve --model models/local --host 0.0.0.0 --port 8111 --max_model_len 4096 "
        "--tensor_parallel_size 2"
    )
    assert "--num_machines 1 --num_processes 4 " in plan["train on gpu07"]
    assert plan["output_dir"] == "/tmp/elsewhere"


def test_bad_options_fail_in_one_line(fake_slurm):
    env = fake_slurm["env"]
    for args, message in [
        (["--accelerate", "zero2"], "--recipe is required"),
        (["--recipe", PAPER, "--layout", "ray"], "--layout is colocate or server"),
        (["--recipe", PAPER, "--accelerate", "zero9"], "no accelerate config accelerate_configs/zero9.yaml"),
        (["--recipe", "nope.yaml"], "no recipe nope.yaml"),
    ]:
        result = _launcher(env, "--print-command", *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    one_node = dict(env, SLURM_JOB_NODELIST="gpu07")
    result = _launcher(one_node, "--print-command", "--recipe", PAPER, "--layout", "server")
    assert result.returncode == 2 and "needs 2 nodes" in result.stderr


def test_the_rendezvous_port_lies_below_the_kernels_ephemeral_range(fake_slurm):
    """The main process's port comes from the job id, the same at every start of the job; it lies in
    20000-32767, below Linux's default ephemeral range (32768-60999), from which the node hands out ports to
    outgoing connections and to the sockets NCCL and vLLM open, which could hold it."""
    ports = {"4242": 24242, "12767": 32767, "12768": 20000, "13000": 20232, "987654321": 31217}
    for job, port in ports.items():
        plan = _plan(dict(fake_slurm["env"], SLURM_JOB_ID=job), "--recipe", SMOKE)
        assert f"--main_process_port {port} " in plan["train on gpu07"], (job, plan["train on gpu07"])


def _train_line(env: dict, out_dir: Path, *extra: str) -> str:
    return _plan(env, "--recipe", SMOKE, "--output_dir", str(out_dir), *extra)["train on gpu07"]


def test_a_requeue_resumes_a_recipe_that_sets_overwrite_output_dir(fake_slurm):
    # The recipe's overwrite_output_dir: true and a resume exclude each other (the trainer refuses both): a
    # requeued start that resumes turns it off, on the command line, which the recipe's value yields to.
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    recipe = fake_slurm["tmp"] / "overwriting.yaml"
    recipe.write_text(Path(SMOKE).read_text() + "\noverwrite_output_dir: true\n")
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    line = _plan(requeued, "--recipe", str(recipe), "--output_dir", str(out_dir))["train on gpu07"]
    assert line.endswith("--overwrite_output_dir false --resume_from_checkpoint true"), line
    line = _plan(requeued, "--recipe", SMOKE, "--output_dir", str(out_dir))["train on gpu07"]
    assert "--overwrite_output_dir" not in line  # a recipe without it: nothing to turn off


def test_a_checkpoint_in_output_dir_makes_a_requeued_start_resume(fake_slurm):
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    requeued = dict(env, SLURM_RESTART_COUNT="3")
    assert "--resume_from_checkpoint" not in _train_line(env, out_dir)  # no folder yet
    (out_dir / "completions").mkdir(parents=True)
    (out_dir / "logs.jsonl").write_text("{}\n")
    # First start, a used folder: left to the trainer, which refuses it with one line.
    line = _train_line(env, out_dir)
    assert "--resume_from_checkpoint" not in line and "--overwrite_output_dir" not in line
    # A requeued start that had not saved yet: replace what the interrupted start wrote, also when its
    # first save was cut short (a checkpoint folder that cannot be resumed from).
    assert _train_line(dict(env, SLURM_RESTART_COUNT="1"), out_dir).endswith("--overwrite_output_dir true")
    (out_dir / "checkpoint-4").mkdir()
    assert _train_line(dict(env, SLURM_RESTART_COUNT="1"), out_dir).endswith("--overwrite_output_dir true")
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    assert _train_line(requeued, out_dir).endswith("--resume_from_checkpoint true")
    # --output-dir is --output_dir: the run's folder, whose checkpoint it resumes from.
    line = _train_line(requeued, fake_slurm["tmp"] / "elsewhere", "--output-dir", str(out_dir))
    assert line.endswith("--resume_from_checkpoint true")
    # What the command line says wins on the job's first start.
    line = _train_line(env, out_dir, "--overwrite_output_dir", "true")
    assert "--resume_from_checkpoint" not in line
    line = _train_line(env, out_dir, "--resume_from_checkpoint", f"{out_dir}/checkpoint-2")
    assert line.count("--resume_from_checkpoint") == 1


def test_recipe_keys_after_the_double_dash_are_read_as_before_it(fake_slurm):
    """``--`` ends the script's options, not its reading of the recipe keys: a dashed ``--output-dir`` after
    it names the run's folder, whose checkpoint a requeued start resumes, and a first start's
    ``--overwrite-output-dir true`` is dropped there rather than wiping the run at every requeue."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    for flags in (["--output-dir", str(out_dir)], [f"--output-dir={out_dir}"]):
        plan = _plan(requeued, "--recipe", SMOKE, "--", *flags, "--overwrite-output-dir", "true")
        assert plan["output_dir"] == str(out_dir)
        line = plan["train on gpu07"]
        assert line.endswith("--resume_from_checkpoint true") and "overwrite" not in line, line


def test_a_new_job_into_a_folder_that_holds_a_run_does_not_resume_it(fake_slurm):
    """A job's first start adds nothing, even where output_dir holds a finished run's checkpoints: the trainer
    then refuses the folder, and continuing the run is the user's choice (--resume_from_checkpoint true)."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    tiny_checkpoint(out_dir / "checkpoint-4", 4)
    (out_dir / "train_results.json").write_text("{}\n")
    for first in (env, dict(env, SLURM_RESTART_COUNT="0")):
        line = _train_line(first, out_dir, "--max_steps", "4")
        assert line.endswith("--output_dir " + str(out_dir) + " --max_steps 4"), line
    line = _train_line(env, out_dir, "--resume_from_checkpoint", "true")
    assert line.endswith("--resume_from_checkpoint true") and line.count("--resume_from_checkpoint") == 1


@pytest.mark.parametrize(
    "first_start",
    [
        ["--overwrite_output_dir", "true"],
        ["--overwrite_output_dir=true"],
        ["--overwrite_output_dir"],  # a bare boolean, followed by another key
        ["--resume_from_checkpoint", "CHECKPOINT"],
        ["--resume_from_checkpoint=CHECKPOINT"],
        ["--overwrite-output-dir", "true"],  # prompt-aug-train takes dashes too
        ["--resume-from-checkpoint=CHECKPOINT"],
    ],
)
def test_a_requeued_start_resumes_instead_of_repeating_the_first_starts_flags(fake_slurm, first_start):
    """Kept on every requeue, --overwrite_output_dir would wipe the run and --resume_from_checkpoint PATH roll
    it back to PATH each time: a requeued start drops both and resumes from the last complete checkpoint."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    tiny_checkpoint(out_dir / "checkpoint-6", 6)
    flags = [f.replace("CHECKPOINT", str(out_dir / "checkpoint-2")) for f in first_start]
    result = _launcher(
        dict(env, SLURM_RESTART_COUNT="2"), "--print-command", "--recipe", SMOKE, "--output_dir",
        str(out_dir), *flags, "--max_steps", "9",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = dict(row.split(": ", 1) for row in result.stdout.splitlines())["train on gpu07"]
    assert (
        "output_dir true" not in line
        and "output-dir" not in line
        and str(out_dir / "checkpoint-2") not in line
    )
    assert line.endswith("--max_steps 9 --resume_from_checkpoint true")
    assert "applied to the first start only" in result.stderr


def test_a_requeued_warm_start_that_had_not_saved_starts_from_the_same_checkpoint_again(fake_slurm):
    """A first start from another run's checkpoint, requeued before its own first save: the dropped PATH is
    given again, with --overwrite_output_dir true for what the interrupted start wrote (the trainer refuses
    a warm start into a used folder)."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    other = tiny_checkpoint(fake_slurm["tmp"] / "other" / "checkpoint-100", 100)
    out_dir.mkdir()
    for flags in (["--resume_from_checkpoint", str(other)], [f"--resume_from_checkpoint={other}"]):
        line = _train_line(dict(env, SLURM_RESTART_COUNT="1"), out_dir, *flags)
        assert line.endswith(f"--resume_from_checkpoint {other}"), line  # nothing written yet
    (out_dir / "logs.jsonl").write_text("{}\n")  # what the interrupted start wrote
    line = _train_line(dict(env, SLURM_RESTART_COUNT="1"), out_dir, "--resume_from_checkpoint", str(other))
    assert line.endswith(f"--resume_from_checkpoint {other} --overwrite_output_dir true"), line
    # A checkpoint of the run's own folder (the collapse guard's) continues that run: nothing replaced.
    own = tiny_checkpoint(out_dir / "_collapse-entropy-round3", 6)
    line = _train_line(dict(env, SLURM_RESTART_COUNT="1"), out_dir, "--resume_from_checkpoint", str(own))
    assert line.endswith(f"--resume_from_checkpoint {own}"), line
    tiny_checkpoint(out_dir / "checkpoint-104", 104)  # once it has saved, it resumes its own
    line = _train_line(dict(env, SLURM_RESTART_COUNT="2"), out_dir, "--resume_from_checkpoint", str(other))
    assert line.endswith("--resume_from_checkpoint true") and str(other) not in line


def test_a_requeued_start_with_no_checkpoint_keeps_the_collapse_guards_checkpoints(fake_slurm):
    """The collapse guard moves the checkpoint it saves when a signal fires to _collapse-*, the evidence of
    the collapse: a requeued start that finds no complete checkpoint-N beside it (also a warm start from
    another run) stops in one line naming it and the ways on, rather than replacing the run, which would
    delete it. With a complete checkpoint-N it resumes, which deletes nothing."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    own = tiny_checkpoint(out_dir / "_collapse-entropy-round3", 6)
    (out_dir / "logs.jsonl").write_text("{}\n")
    (out_dir / "checkpoint-8").mkdir()  # a save cut short
    other = tiny_checkpoint(fake_slurm["tmp"] / "other" / "checkpoint-100", 100)
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    for first in ([], ["--resume_from_checkpoint", str(other)]):
        result = _launcher(
            requeued, "--print-command", "--recipe", SMOKE, "--output_dir", str(out_dir), *first
        )
        assert result.returncode == 2, (result.stdout, result.stderr)
        said = result.stderr.splitlines()[-1]  # one line, the last
        assert not result.stdout and "error: " in said and "_collapse-entropy-round3" in said, result.stderr
        assert (
            f"--resume_from_checkpoint {own} " in said and "--overwrite_output_dir true to start over" in said
        )
    tiny_checkpoint(out_dir / "checkpoint-4", 4)
    assert _train_line(requeued, out_dir).endswith("--resume_from_checkpoint true")


@pytest.mark.parametrize(
    "only_model",
    [
        ["--save_only_model", "true"],
        ["--save_only_model", "on"],
        ["--save_only_model"],
        ["--save-only-model=True"],
        "recipe",
    ],
)
def test_a_requeued_run_that_saves_only_the_model_is_neither_resumed_nor_replaced(fake_slurm, only_model):
    """save_only_model checkpoints hold no optimizer, scheduler or RNG state: a resume from one would not
    continue the run as it was, so a requeued start does not resume it on its own; nor does it replace the
    run. It stops before anything starts, in one line naming the checkpoint and the ways on."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    (tiny_checkpoint(out_dir / "checkpoint-2", 2) / "optimizer.pt").unlink()
    recipe = SMOKE
    if only_model == "recipe":
        recipe = fake_slurm["tmp"] / "only_model.yaml"
        recipe.write_text((REPO / SMOKE).read_text() + "\nsave_only_model: true\n")
        only_model = []
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    result = _launcher(
        requeued, "--print-command", "--recipe", str(recipe), "--output_dir", str(out_dir), *only_model,
        "--max_steps", "9",
    )  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "save_only_model" in result.stderr and str(out_dir / "checkpoint-2") in result.stderr
    assert "--model_name_or_path" in result.stderr and not result.stdout
    assert (out_dir / "checkpoint-2" / "model.safetensors").is_file()
    line = _plan(requeued, "--recipe", SMOKE, "--output_dir", str(out_dir))["train on gpu07"]
    assert line.endswith("--overwrite_output_dir true")  # a run that saves its optimizer: incomplete
    # Before its first save, a requeued start of such a run starts over: nothing inexact about it.
    shutil.rmtree(out_dir / "checkpoint-2")
    (out_dir / "logs.jsonl").write_text("{}\n")  # what the interrupted start wrote
    plan = _plan(requeued, "--recipe", str(recipe), "--output_dir", str(out_dir), *only_model)
    assert plan["train on gpu07"].endswith("--overwrite_output_dir true")


def tiny_checkpoint(folder: Path, step: int, processes: int = 16) -> Path:
    """`fault_harness.tiny_checkpoint` with the RNG state of each of ``processes`` processes (by default
    this file's launches, 2 nodes x 8), which a requeued start checks as the trainer does."""
    import torch

    tiny_files(folder, step)
    for rank in range(processes):
        torch.save({"rank": rank}, folder / f"rng_state_{rank}.pth")
    return folder


def _saved_by(folder: Path, processes: int) -> Path:
    """A complete checkpoint that ``processes`` processes saved: its launch.json and one RNG state each."""
    tiny_checkpoint(folder, 2, processes)
    (folder / "launch.json").write_text(json.dumps({"processes": processes}))
    return folder


def test_a_requeued_start_on_another_node_count_stops_before_anything_starts(fake_slurm):
    """A job requeued onto fewer nodes (a --nodes range, or a changed request) has another process count,
    hence another round: its start stops in one line before srun or a server starts, rather than launching
    every node into the trainer's refusal. On the node count that saved the checkpoint, it resumes."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    _saved_by(out_dir / "checkpoint-2", 16)
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    assert _train_line(requeued, out_dir).endswith("--resume_from_checkpoint true")  # 2 nodes x 8: as saved
    result = _launcher(
        dict(requeued, SLURM_JOB_NODELIST="gpu07"), "--print-command", "--recipe", SMOKE, "--output_dir",
        str(out_dir),
    )  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "16 process(es)" in result.stderr and "1 training node(s) x 8" in result.stderr, result.stderr
    assert not result.stdout
    # The same check on a real start: nothing runs (no srun step, no dry run).
    _write(fake_slurm["bin"] / "accelerate", ACCELERATE.format(python=sys.executable))
    result = _launcher(
        dict(requeued, SLURM_JOB_NODELIST="gpu07"), "--recipe", SMOKE, "--output_dir", str(out_dir)
    )
    assert result.returncode == 2, result.stderr
    assert not _slurm_log(fake_slurm["out"]) and not (fake_slurm["out"] / "dry_run").exists()


def test_a_checkpoint_check_that_fails_stops_the_requeued_start_rather_than_replacing_the_run(fake_slurm):
    """The check of output_dir's checkpoints runs Python; if it fails (a broken environment, a bad flag), the
    start stops. Read as "no complete checkpoint", it would add --overwrite_output_dir true and delete the
    run."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    broken = _write(
        fake_slurm["tmp"] / "broken-python",
        "#!/bin/bash\nif [[ $1 == -c && $2 == *prompt_aug.faults* ]]; then\n"
        '    echo "ModuleNotFoundError: No module named prompt_aug" >&2; exit 1\nfi\n'
        f'exec {fake_slurm["env"]["PYTHON"]} "$@"\n',
    )
    requeued = dict(env, SLURM_RESTART_COUNT="1", PYTHON=str(broken))
    result = _launcher(requeued, "--print-command", "--recipe", SMOKE, "--output_dir", str(out_dir))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--overwrite_output_dir" not in result.stdout and "could not check" in result.stderr
    # A value the recipe parser would refuse makes the check fail too: refused, not read as "no checkpoint".
    result = _launcher(
        dict(env, SLURM_RESTART_COUNT="1"), "--print-command", "--recipe", SMOKE,
        "--output_dir", str(out_dir), "--save_only_model", "maybe",
    )  # fmt: skip
    assert result.returncode == 2 and "--overwrite_output_dir" not in result.stdout, result.stdout


def test_a_requeued_adaptive_entropy_run_resumes_from_the_checkpoint_before_one_with_its_state_cut_short(
    fake_slurm,
):
    """The requeue judges a checkpoint as the trainer will: a cut-short entropy_ctrl_state.json makes the
    newest folder incomplete for a use_adaptive_entropy run; with an older complete one, it resumes."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    (tiny_checkpoint(out_dir / "checkpoint-2", 2) / "entropy_ctrl_state.json").write_text('{"entropy_co')
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    run = ["--recipe", SMOKE, "--output_dir", str(out_dir)]
    assert _plan(requeued, *run)["train on gpu07"].endswith("--resume_from_checkpoint true")
    line = _plan(requeued, *run, "--use_adaptive_entropy", "true")["train on gpu07"]
    assert line.endswith("--overwrite_output_dir true")  # its only checkpoint cannot be resumed


def test_a_requeued_start_judges_each_processs_rng_state_as_the_trainer_does(fake_slurm):
    """A checkpoint that records no process count (TRL's own) and lacks one process's RNG state, with this
    launch's 16 processes, is one the trainer will not resume (a process was killed while saving): the
    requeued start takes the complete one before it, and with none replaces the interrupted start rather
    than handing the trainer a resume it refuses."""
    env, out_dir = fake_slurm["env"], fake_slurm["tmp"] / "run"
    tiny_checkpoint(out_dir / "checkpoint-4", 4, processes=15)  # rng_state_15.pth never written
    requeued = dict(env, SLURM_RESTART_COUNT="1")
    run = ["--recipe", SMOKE, "--output_dir", str(out_dir)]
    assert _plan(requeued, *run)["train on gpu07"].endswith("--overwrite_output_dir true")
    tiny_checkpoint(out_dir / "checkpoint-2", 2)
    assert _plan(requeued, *run)["train on gpu07"].endswith("--resume_from_checkpoint true")


# ---------------------------------------------------------------------------------------------
# Running it: srun, the server, signals and requeue (stand-in accelerate).


def _start(fake: dict, *args: str, **env: str) -> subprocess.Popen:
    """The launcher with the stand-in accelerate and trl, its output in ``out/launcher.log`` (a file: the
    stand-in run may outlive the launcher and hold a pipe open)."""
    _write(fake["bin"] / "accelerate", ACCELERATE.format(python=sys.executable))
    _write(fake["bin"] / "trl", TRL.format(python=sys.executable))
    with (fake["out"] / "launcher.log").open("w") as sink:
        return subprocess.Popen(
            ["bash", str(SCRIPT), "--recipe", SMOKE, "--output_dir", str(fake["tmp"] / "run"), *args],
            env=dict(fake["env"], **env),
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _finish(fake: dict, proc: subprocess.Popen, timeout: float) -> str:
    """Wait for the launcher, kill what is left of it and its run, and return its output."""
    try:
        proc.wait(timeout=timeout)
    finally:
        _stop(proc)
    return (fake["out"] / "launcher.log").read_text(errors="replace")


def _records(out: Path, ranks: int = 2, timeout: float = 30) -> list[dict]:
    """What each rank's stand-in accelerate recorded at its start (waits for all of them)."""
    paths = [out / f"accelerate-{rank}.json" for rank in range(ranks)]
    deadline = time.monotonic() + timeout
    while not all(p.is_file() and p.stat().st_size for p in paths):
        assert time.monotonic() < deadline, "the stand-in accelerate did not start on every node"
        time.sleep(0.1)
    return [json.loads(p.read_text()) for p in paths]


def _slurm_log(out: Path) -> list[str]:
    path = out / "slurm.log"
    return path.read_text().splitlines() if path.is_file() else []


def test_each_node_runs_its_launcher_under_srun(fake_slurm):
    proc = _start(fake_slurm)
    output = _finish(fake_slurm, proc, timeout=60)
    assert proc.returncode == 0, output
    out = fake_slurm["out"]
    records = _records(out)
    for rank, record in enumerate(records):
        argv = record["argv"]
        assert record["node"] == f"gpu0{7 + rank}" and record["procid"] == str(rank)
        assert argv[argv.index("--machine_rank") + 1] == str(rank)
        assert argv[argv.index("--num_machines") + 1] == "2"
        assert argv[argv.index("--num_processes") + 1] == "16"
        assert argv[argv.index("--main_process_ip") + 1] == "gpu07"
        assert not record["usr1_ignored"]  # the launcher handles it: it passes it on to the workers
        assert record["env"] == {
            "PYTHONUNBUFFERED": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "300",
            "WANDB_RUN_ID": "prompt-aug-4242", "WANDB_RESUME": "allow",
            "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        }  # fmt: skip
    assert (
        records[0]["argv"][records[0]["argv"].index("-m") :]
        == records[1]["argv"][records[1]["argv"].index("-m") :]
    )
    (srun,) = [json.loads(line[5:]) for line in _slurm_log(out) if line.startswith("srun ")]
    assert srun["cmd"][:2] == ["bash", "-c"] and srun["cmd"][2].startswith(NODE_PREFIX + "accelerate launch ")
    assert srun["opts"]["ntasks"] == "2" and srun["opts"]["nodelist"] == "gpu07,gpu08"
    assert srun["opts"]["ntasks-per-node"] == "1" and srun["opts"]["kill-on-bad-exit"] == "1"
    assert (out / "dry_run").read_text().split()[-3:] == ["--dry_run", "--num_processes", "16"]
    assert not any(line.startswith("requeue") for line in _slurm_log(out))


def test_the_wandb_run_of_a_job_is_named_with_its_cluster(fake_slurm):
    proc = _start(fake_slurm, SLURM_CLUSTER_NAME="alps")  # job 4242 of another cluster is another run
    output = _finish(fake_slurm, proc, timeout=60)
    assert proc.returncode == 0, output
    assert {r["env"]["WANDB_RUN_ID"] for r in _records(fake_slurm["out"])} == {"prompt-aug-alps-4242"}


@pytest.mark.skipif(shutil.which("curl") is None, reason="the server layout's health check uses curl")
def test_server_layout_waits_for_the_server_and_stops_it_at_the_end(fake_slurm):
    port = str(free_port())
    proc = _start(
        fake_slurm, "--layout", "server", SLURM_JOB_NODELIST="127.0.0.1,localhost", VLLM_SERVER_PORT=port,
        http_proxy="http://127.0.0.1:9", VLLM_SERVER_WAIT="30",  # a site's proxy, which cannot reach the node
    )  # fmt: skip
    output = _finish(fake_slurm, proc, timeout=90)
    assert proc.returncode == 0, output
    out = fake_slurm["out"]
    (record,) = _records(out, ranks=1)
    argv = record["argv"]
    assert record["node"] == "127.0.0.1"
    assert argv[argv.index("--vllm_server_host") + 1] == "localhost"
    assert argv[argv.index("--vllm_server_port") + 1] == port
    assert record["no_proxy"].split(",")[0] == "localhost"  # training reaches the server past the proxy too
    assert json.loads((out / "trl.json").read_text())[:3] == ["vllm-serve", "--model", "tiny-random-qwen2"]
    assert "vLLM server up after" in output
    # The launcher exits only once the server has stopped (its SIGTERM handler has run).
    assert (out / "trl.stopped").exists(), "the launcher exited before the server had stopped"
    assert "stopping the vLLM server" in output and "did not stop" not in output


def test_a_server_lost_while_training_runs_stops_training_rather_than_leaving_it_waiting(fake_slurm):
    """A request to a vLLM server whose node is gone waits without end: the launcher stops the training step
    once the server exits, says how to resume, and does not requeue (a crash would repeat)."""
    port = str(free_port())
    started = time.monotonic()
    proc = _start(
        fake_slurm, "--layout", "server", SLURM_JOB_NODELIST="127.0.0.1,localhost", VLLM_SERVER_PORT=port,
        VLLM_SERVER_WAIT="30", FAKE_SERVER_DIES_AFTER="4", FAKE_MODE="ignore",  # training runs 60 s
    )  # fmt: skip
    output = _finish(fake_slurm, proc, timeout=60)
    assert proc.returncode == 1, output
    assert time.monotonic() - started < 45, output  # not the stand-in run's 60 s
    assert "the vLLM server on localhost exited (status 1) while training ran: stopping training" in output
    assert "--resume_from_checkpoint true" in output
    assert not (fake_slurm["out"] / "accelerate-0.json.done").exists()  # stopped, not run to its end
    assert "requeue" not in " ".join(_slurm_log(fake_slurm["out"])), output


@pytest.mark.parametrize(
    ("mode", "requeued", "code"),
    [
        ("save_on_usr1", True, 1),  # saved and stopped early (non-zero): requeue
        ("finish_on_usr1", False, 0),  # finished anyway: done, nothing to requeue
        ("finish_launcher_1", False, 1),  # finished, though the launcher exits 1 for the signal: done too
    ],
)
def test_the_time_limit_warning_reaches_training_and_requeues(fake_slurm, mode, requeued, code):
    proc = _start(fake_slurm, FAKE_MODE=mode)
    try:
        _records(fake_slurm["out"])
    finally:
        proc.send_signal(signal.SIGUSR1)  # what Slurm sends the batch shell 90 s before the limit
        output = _finish(fake_slurm, proc, timeout=60)
    out = fake_slurm["out"]
    assert [(out / f"accelerate-{r}.json.done").read_text() for r in (0, 1)] == ["usr1", "usr1"]
    # Saved and stopped: each rank exits 1, unless the other's exit reached srun first, whose
    # --kill-on-bad-exit then ends it with SIGTERM (143), as Slurm's own does on a loaded machine.
    assert proc.returncode in ({1, 143} if code else {0}), output
    assert ("requeue 4242" in _slurm_log(out)) == requeued, output


def test_a_run_that_ignores_the_warning_is_requeued_after_the_grace(fake_slurm):
    proc = _start(fake_slurm, FAKE_MODE="ignore", REQUEUE_GRACE="2")
    try:
        _records(fake_slurm["out"])
    finally:
        started = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        # The stand-in run is still going when the launcher exits (scontrol requeue would end it): _finish
        # kills it.
        output = _finish(fake_slurm, proc, timeout=30)
        waited = time.monotonic() - started
    assert proc.returncode == 124, output
    assert "requeue 4242" in _slurm_log(fake_slurm["out"])
    assert 2 <= waited < 15, waited


def test_a_run_that_saves_only_the_model_is_not_requeued_at_the_time_limit(fake_slurm):
    """Its checkpoint would resume on a new optimizer, schedule and RNG (or not at all under DeepSpeed or
    FSDP): the job is not requeued to do that on its own; the log says how to go on."""
    proc = _start(fake_slurm, "--save_only_model", "true", FAKE_MODE="save_on_usr1")
    try:
        _records(fake_slurm["out"])
    finally:
        proc.send_signal(signal.SIGUSR1)
        output = _finish(fake_slurm, proc, timeout=60)
    assert proc.returncode != 0, output
    assert "requeue 4242" not in _slurm_log(fake_slurm["out"]), output
    assert "not requeued" in output and "save_only_model" in output


# ---------------------------------------------------------------------------------------------
# The rendezvous for real: two nodes on this machine, gloo on CPU.


def _real_env(**extra: str) -> dict:
    """The environment of a real launch; tests/ is on its path, for the test reward `SPREAD` names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PATH=os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
        HF_HUB_OFFLINE="1",
        WANDB_MODE="disabled",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    env.update(extra)
    return env


# A reward whose groups have spread whatever the tiny model writes (the smoke recipe's give it none), so
# that the two-node run's weights move.
SPREAD = ("--reward_funcs", "fault_harness:text_hash_reward")


def _run_all(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    """Wait for every process up to ``timeout`` seconds in all; kill what is left (and its children)."""
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc in procs:
            _stop(proc)
    return codes


def _tail(path: Path, chars: int = 3000) -> str:
    return f"--- {path.name}:\n{path.read_text(errors='replace')[-chars:]}"


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    """Two separately started `accelerate launch` processes, node ranks 0 and 1, one output folder."""
    tmp = tmp_path_factory.mktemp("multinode")
    out_dir, port = tmp / "run", free_port()
    logs, procs = [tmp / f"node{rank}.log" for rank in (0, 1)], []
    started = time.monotonic()
    for rank in (0, 1):
        cmd = [
            str(VENV_BIN / "accelerate"), "launch", "--config_file", "accelerate_configs/ddp.yaml",
            "--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
            "--main_process_port", str(port), "--num_processes", "2", "--mixed_precision", "no",
            "-m", "prompt_aug.train", "--config", SMOKE, "--max_steps", "2", "--save_steps", "2",
            "--output_dir", str(out_dir), *SPREAD,
        ]  # fmt: skip
        with logs[rank].open("w") as sink:
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    env=_real_env(),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    codes = _run_all(procs, timeout=420)
    print(f"two nodes, 2 steps: {time.monotonic() - started:.0f} s")
    assert codes == [0, 0], "\n".join([f"exit codes {codes}", *map(_tail, logs)])
    return {"tmp": tmp, "out_dir": out_dir}


WORKER = """import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))  # as the trainer's checkpoint-and-stop handler
open(os.path.join(sys.argv[1], "ready-" + os.environ["RANK"]), "w").close()
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
open(os.path.join(sys.argv[1], ("got-" if got else "timeout-") + os.environ["RANK"]), "w").close()
# exit only once both workers have recorded: the launcher stops the others when the first one exits
recorded = [os.path.join(sys.argv[1], f"got-{r}") for r in (0, 1)]
while not all(map(os.path.exists, recorded)) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)  # a distinct code of the worker's; accelerate reports a failed worker as 1
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "prefix, delivery, reached",
    [
        (NODE_PREFIX, "every process", True),  # proctrack/cgroup: Slurm signals the whole step
        (NODE_PREFIX, "launcher only", True),  # proctrack/pgid: the task's process group, not the workers'
        ("exec ", "launcher only", False),  # control: without the variable the launcher dies of it
    ],
    ids=["cgroup", "pgid", "control"],
)
def test_usr1_reaches_the_workers_however_slurm_delivers_it(tmp_path, prefix, delivery, reached):
    """The per-node command on a real `accelerate launch` of 2 processes: with ``PET_SIGNALS_TO_HANDLE``
    listing SIGUSR1 the launcher passes the signal on to the workers, which start sessions of their own, so
    they get it whether Slurm signals every process of the step or only the launcher. Without it (control)
    the launcher dies of a signal sent to it alone and the workers never hear of it."""
    (tmp_path / "worker.py").write_text(WORKER)
    launch = [
        str(VENV_BIN / "accelerate"), "launch", "--config_file", str(REPO / "accelerate_configs/ddp.yaml"),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
        str(tmp_path / "worker.py"), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(
        ["bash", "-c", prefix + " ".join(launch)], env=_real_env(), cwd=tmp_path, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and proc.poll() is None, "the workers did not start"
            time.sleep(0.1)
        for pid in _tree(proc.pid) if delivery == "every process" else [proc.pid]:
            os.kill(pid, signal.SIGUSR1)
        code = proc.wait(timeout=90)
    finally:
        _stop(proc)
    if not reached:
        assert code == -signal.SIGUSR1
        assert not any((tmp_path / f"got-{r}").exists() for r in (0, 1))
        return
    deadline = time.monotonic() + 10
    while not all((tmp_path / f"got-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline, sorted(p.name for p in tmp_path.iterdir())
        time.sleep(0.1)
    assert code == 1  # torch elastic shut the workers down on the signal it handled and reports a failure


def _steps(out_dir: Path) -> list[int]:
    state = json.loads((out_dir / "trainer_state.json").read_text())
    return [h["step"] for h in state["log_history"] if "loss" in h]


@pytest.mark.slow
def test_two_nodes_meet_and_train(two_node_run):
    import pandas as pd
    import torch
    from safetensors.torch import load_file

    out_dir = two_node_run["out_dir"]
    state = json.loads((out_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and _steps(out_dir) == [1, 2]
    assert (out_dir / "checkpoint-2").is_dir() and (out_dir / "model.safetensors").is_file()
    records = pd.concat(pd.read_parquet(p) for p in sorted((out_dir / "completions").glob("*.parquet")))
    assert set(records["round"]) == {1}  # one round of 8 questions x 4 completions, logged at steps 1 and 2
    first = records[records["step"] == 1]
    assert len(first) == 32 and first["uid"].nunique() == 8
    assert first.groupby("process").size().to_dict() == {0: 16, 1: 16}  # one world of 2 processes
    assert (first.groupby("uid")["template"].nunique() == 1).all()  # a group's template, on both nodes
    # The world trained: real gradients, and every weight moved from the model the run built.
    assert all(h["grad_norm"] > 0 for h in state["log_history"] if "loss" in h), state["log_history"]
    initial = load_file(str(out_dir / "tiny-random-qwen2" / "model.safetensors"))
    trained = load_file(str(out_dir / "checkpoint-2" / "model.safetensors"))
    assert initial.keys() == trained.keys()
    still = [name for name in initial if torch.equal(initial[name], trained[name])]
    assert not still, f"tensors two steps left unchanged: {still}"


@pytest.mark.slow
def test_the_slurm_launcher_resumes_the_two_node_run(two_node_run):
    """The launcher, as a requeued job's next start: srun (stand-in) starts one real launcher per node."""
    tmp, out_dir = two_node_run["tmp"], two_node_run["out_dir"]
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    _write(bin_dir / "scontrol", SCONTROL)
    _write(bin_dir / "srun", SRUN.format(python=sys.executable))
    env = _real_env(
        PATH=os.pathsep.join([str(bin_dir), str(VENV_BIN), os.environ.get("PATH", "")]),
        PYTHON=sys.executable, VENV="", FAKE_OUT=str(tmp), SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1",
        SLURM_JOB_NODELIST="node[1-2]", SLURM_SUBMIT_DIR=str(REPO), MAIN_PROCESS_IP="127.0.0.1",
        MAIN_PROCESS_PORT=str(free_port()), ACCELERATE_ARGS="--mixed_precision no",
    )  # fmt: skip
    log = tmp / "launcher.log"
    started = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", str(SCRIPT), "--recipe", SMOKE, "--accelerate", "ddp", "--gpus-per-node", "1",
             "--output_dir", str(out_dir), "--max_steps", "4", "--save_steps", "2", *SPREAD],
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    codes = _run_all([proc], timeout=480)
    print(f"the launcher, 2 more steps on two nodes: {time.monotonic() - started:.0f} s")
    text = log.read_text(errors="replace")
    assert codes == [0], _tail(log)
    assert "--resume_from_checkpoint true" in text  # the launcher saw checkpoint-2 and added it
    assert "resuming from" in text and "checkpoint-2" in text
    assert _steps(out_dir) == [1, 2, 3, 4] and (out_dir / "checkpoint-4").is_dir()
    assert not any(line.startswith("requeue") for line in _slurm_log(tmp))


# ---------------------------------------------------------------------------------------------
# docs/multinode.md: the recipe column of the verl table is what the paper recipe parses to.

ITEM = re.compile(r"`([A-Za-z_]\w*): ([^`]*)`")
DRY_RUN = re.compile(r"^dry run: ([a-z ]+?) (\d+)\b")  # a line of the dry run's table, no recipe key


def _verl_rows() -> list[dict[str, str]]:
    section = (REPO / "docs/multinode.md").read_text().split("## Beyond this script", 1)[1]
    rows, header = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            if header:
                break
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def test_the_verl_table_names_the_recipes_values():
    from prompt_aug import train
    from prompt_aug.batches import batch_arithmetic

    rows = _verl_rows()
    settings = {row["setting"] for row in rows}
    needed = {"learning rate", "questions per round", "rollouts per question", "optimizer step", "clip", "KL",
              "completion length", "prompt length", "sampling", "entropy bonus"}  # fmt: skip
    assert needed <= settings, needed - settings
    expected = {k: yaml.safe_load(v) for row in rows for k, v in ITEM.findall(row["recipe"])}
    assert len(expected) >= 30
    script_args, args, model_args, _ = train.parse_args(
        ["--config", PAPER, "--dry_run", "--num_processes", "8"]
    )
    got = {**vars(model_args), **vars(args), **vars(script_args)}
    assert not [k for k in expected if k not in got], "docs/multinode.md names keys the recipe does not have"
    wrong = {k: (v, got[k]) for k, v in expected.items() if got[k] != v}
    assert not wrong, f"docs/multinode.md's verl table differs from {PAPER} (table, recipe): {wrong}"
    # The dry run's lines are its table's, under its own names, which are no recipe keys.
    printed = dict(line.rsplit(None, 1) for line in batch_arithmetic(args, script_args).table().splitlines())
    dry_run = dict(m.groups() for row in rows if (m := DRY_RUN.match(row["recipe"])))
    assert dry_run == {"questions per round": "128", "completions per optimizer step": "256"}
    assert {name: printed[name] for name in dry_run} == dry_run
    assert not set(expected) & {name.replace(" ", "_") for name in printed}
