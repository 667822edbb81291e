"""The synced reference model (``sync_ref_model``) across a resume: each checkpoint holds it, a resume
restores it, and a resume that cannot says so.

One run in code (tiny random model, CPU, 1 process): ``beta`` 0.01, reference synced every 2 steps with
``ref_model_mixup_alpha`` 1 (a hard copy), a checkpoint every step, 3 steps. Its reference at checkpoint-3
is the policy of step 2, as checkpoint-2's model weights hold it. Resumes go into copies of its checkpoints
in other folders; a callback added last reads the reference when training begins, then ends the call.

Last, ProRL's optimizer reset at each sync (`zero_optimizer_state`) must leave an optimizer that trains on
as a new one would.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from safetensors.torch import load_model
from transformers import AutoModelForCausalLM, TrainerCallback

from prompt_aug import faults
from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.extensions.stabilisers import zero_optimizer_state
from prompt_aug.trainer import PromptAugGRPOTrainer

pytestmark = pytest.mark.slow

QUESTIONS = [f"What is {a} + {a}?" for a in range(1, 9)]


def _length_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Spread within a group (the completion's length / 100), so that the weights move."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 100 for c in completions]


def _trainer(model_dir: Path, out: Path, max_steps: int, **overrides: Any) -> PromptAugGRPOTrainer:
    settings: dict[str, Any] = {
        "output_dir": str(out), "report_to": "none", "use_cpu": True, "bf16": False, "seed": 7,
        "per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 4,
        "learning_rate": 1e-3, "max_steps": max_steps, "save_steps": 1, "logging_steps": 1, "beta": 0.01,
        "sync_ref_model": True, "ref_model_sync_steps": 2, "ref_model_mixup_alpha": 1.0,
        "gradient_checkpointing": False,
    }  # fmt: skip
    settings.update(overrides)
    dataset = datasets.Dataset.from_dict({"question": QUESTIONS, "answer": [str(2 * a) for a in range(1, 9)]})
    return PromptAugGRPOTrainer(
        model=str(model_dir), reward_funcs=_length_reward, args=PromptAugGRPOConfig(**settings),
        train_dataset=dataset,
    )  # fmt: skip


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _saved_policy(checkpoint: Path) -> dict[str, torch.Tensor]:
    return _weights(AutoModelForCausalLM.from_pretrained(checkpoint))


def _saved_reference(checkpoint: Path, model_dir: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    load_model(model, str(checkpoint / faults.REF_MODEL_FILE))
    return _weights(model)


class _Begun(Exception):
    """Ends a resumed train() call once the reference has been read."""


class _ReadReference(TrainerCallback):
    """Reads the trainer's reference model as training begins (after every other callback), then ends it."""

    def __init__(self, trainer: PromptAugGRPOTrainer) -> None:
        self.trainer, self.weights = trainer, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.weights = _weights(self.trainer.accelerator.unwrap_model(self.trainer.ref_model))
        raise _Begun


def _reference_at_resume(model_dir: Path, checkpoint: Path, out: Path) -> dict[str, torch.Tensor]:
    """The reference model a resume from a copy of ``checkpoint`` in the new folder ``out`` trains against."""
    shutil.copytree(checkpoint, out / checkpoint.name)
    trainer = _trainer(model_dir, out, max_steps=4)
    reader = _ReadReference(trainer)
    trainer.add_callback(reader)
    with pytest.raises(_Begun):
        trainer.train(resume_from_checkpoint=str(out / checkpoint.name))
    return reader.weights


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref_sync") / "run"
    _trainer(tiny_model_dir, out, max_steps=3).train()
    return out


def test_each_checkpoint_holds_the_reference_and_a_resume_off_a_sync_step_restores_it(
    run, tiny_model_dir, tmp_path
):
    base, synced = _saved_policy(tiny_model_dir), _saved_policy(run / "checkpoint-2")
    assert not _same(base, synced)  # the policy moved: a reference left at the base model would show
    # and moved again at step 3: a reference taken from the policy in place of the synced one would show
    assert not _same(_saved_policy(run / "checkpoint-3"), synced)
    assert _same(_saved_reference(run / "checkpoint-1", tiny_model_dir), base)  # before the first sync
    assert _same(_saved_reference(run / "checkpoint-2", tiny_model_dir), synced)
    assert _same(_saved_reference(run / "checkpoint-3", tiny_model_dir), synced)
    assert all(faults.checkpoint_problem(run / f"checkpoint-{s}") is None for s in (1, 2, 3))
    for step in (1, 2, 3):  # beside the model, before the trainer state marks the checkpoint complete (and
        folder = run / f"checkpoint-{step}"  # before a Hub push of it)
        written = {
            name: (folder / name).stat().st_mtime_ns for name in (faults.REF_MODEL_FILE, "trainer_state.json")
        }
        assert written[faults.REF_MODEL_FILE] <= written["trainer_state.json"], written
        # vLLM, given the checkpoint, loads each *.safetensors at its top: the policy's alone
        assert [p.name for p in folder.glob("*.safetensors")] == ["model.safetensors"]
    assert _same(_reference_at_resume(tiny_model_dir, run / "checkpoint-3", tmp_path / "resumed"), synced)


def test_without_the_file_a_sync_step_resume_copies_the_policy_and_another_warns_naming_both_steps(
    run, tiny_model_dir, tmp_path, caplog
):
    base, synced = _saved_policy(tiny_model_dir), _saved_policy(run / "checkpoint-2")
    older = tmp_path / "older"  # checkpoints as a run that wrote no reference left them
    for step in (2, 3):
        shutil.copytree(run / f"checkpoint-{step}", older / f"checkpoint-{step}")
        (older / f"checkpoint-{step}" / faults.REF_MODEL_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="prompt_aug"):
        # checkpoint-2 is a sync step with a hard copy: the restored policy is the reference
        assert _same(_reference_at_resume(tiny_model_dir, older / "checkpoint-2", tmp_path / "a"), synced)
        assert not [r for r in caplog.records if "reference" in r.getMessage()]
        got = _reference_at_resume(tiny_model_dir, older / "checkpoint-3", tmp_path / "b")
    assert _same(got, base)  # what the warning says
    warned = [r.getMessage() for r in caplog.records if "reference" in r.getMessage()]
    assert len(warned) == 1 and "resume at step 3" in warned[0] and "next sync at step 4" in warned[0]


def test_a_reference_file_cut_short_makes_the_checkpoint_incomplete(run, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    for step in (2, 3):
        shutil.copytree(run / f"checkpoint-{step}", out / f"checkpoint-{step}")
    cut = out / "checkpoint-3" / faults.REF_MODEL_FILE  # a file cut short on the disk
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    assert (
        faults.checkpoint_problem(out / "checkpoint-3")
        == f"{faults.REF_MODEL_FILE} is cut short (half-written?)"
    )
    assert faults.resolve_resume("true", str(out), log=False) == str(out / "checkpoint-2")
    # Only a synced reference is saved: a run with a reference (beta > 0) that does not sync adds no file.
    _trainer(tiny_model_dir, tmp_path / "unsynced", max_steps=1, sync_ref_model=False).train()
    saved = tmp_path / "unsynced" / "checkpoint-1"
    assert (saved / "model.safetensors").is_file() and not (saved / faults.REF_MODEL_FILE).exists()


class _GroupStepAdam(torch.optim.Optimizer):
    """Adam that keeps its step count in the parameter group (``group["step"]``), as apex's fused Adam and
    optimi's StableAdamW do, and reads it for the bias correction."""

    def __init__(self, params: Any, lr: float = 1e-2) -> None:
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            (beta1, beta2), t = group["betas"], group["step"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(param), torch.zeros_like(param)
                state["exp_avg"].mul_(beta1).add_(param.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt().add_(group["eps"])
                param.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1**t))


def test_an_optimizer_zeroed_at_a_reference_sync_trains_on_as_a_fresh_one_when_its_step_is_per_group():
    """ProRL's reset must leave the optimizer as a new one would be, also where the step count is kept per
    parameter group: kept there, the zeroed moments would be used without bias correction (the first
    update after the reset about 3x a fresh one's)."""

    def weights_after(reset: str) -> torch.Tensor:
        torch.manual_seed(0)
        layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
        opt = _GroupStepAdam(layer.parameters())
        for step in range(8):
            if step == 4:
                if reset == "zeroed":

                    class Wrapper:  # accelerate and DeepSpeed expose the wrapped optimizer as `.optimizer`
                        optimizer = opt

                    zero_optimizer_state(Wrapper())
                else:
                    opt = _GroupStepAdam(layer.parameters())
            opt.zero_grad()
            (layer(x) - 1).pow(2).mean().backward()
            opt.step()
        return layer.weight.detach().clone()

    torch.testing.assert_close(weights_after("zeroed"), weights_after("new"), rtol=0, atol=0)
