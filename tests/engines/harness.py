"""TEST HARNESS of the engine tier, not part of the package: runs our entry point `prompt_aug.train.main`
exactly as ``python -m prompt_aug.train`` / ``accelerate launch -m prompt_aug.train`` would, with the same
command-line arguments, plus test-side additions switched on by environment variables:

* ``ENGINE_PROBE_DIR``: every rank writes ``rank<N>.json`` there, saying which engine held the model
  during training (read off the live objects: the wrapped model, DeepSpeed's ZeRO stage, DTensor
  parameters), and, with vLLM, every prompt vLLM received (``vllm_prompts_rank<N>.jsonl``).
* FSDP on CPU (``ACCELERATE_USE_FSDP=true``, which ``accelerate launch`` sets from an FSDP config):
  accelerate 1.15 turns FSDP on only for accelerator devices; on CPU it silently trains with plain
  DDP. The harness switches the distributed type to FSDP when accelerate made it ``MULTI_CPU``, so
  the FSDP config really runs FSDP2.
* ``ENGINE_VLLM_CPU_SYNC=1``: replaces TRL's ``VLLMGeneration.sync_weights`` (and nothing else) by a
  sync that vLLM's CPU backend accepts (see `cpu_sync_weights`). At the end of training, the probe
  measures the log-prob gap between vLLM and the trained model before and after one more sync.
* ``ENGINE_THREADS_AT_EXIT``: every rank writes the names of the native threads it still has when Python
  begins to exit (after `prompt_aug.train.main` has closed the process group) to ``threads_rank<N>.txt``
  there (tests/engines/test_launch.py: no gloo thread may outlive the group).
* ``ENGINE_VLLM_DTYPE=float32``: the colocated vLLM is built with that dtype (see `vllm_options`). Unset,
  it is TRL's choice: no dtype, so vLLM's ``auto``, which runs a float32 checkpoint in bfloat16.
* ``ENGINE_VLLM_EAGER=1``: the colocated vLLM is built with ``enforce_eager=True`` (see `vllm_options`):
  no torch.compile of the model, which on 2 cores takes 10-40 s for the tiny model and about 190 s for
  SmolLM2-135M at each engine start. Unset, it is TRL's choice (vLLM's default, compiled).

Run as a script (its folder goes on ``sys.path``, so ``engine_rewards:char_length`` imports):
``accelerate launch ... tests/engines/harness.py --config recipes/smoke/tiny_cpu.yaml ...``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PROBE_DIR = os.environ.get("ENGINE_PROBE_DIR")


def switch_fsdp_on_cpu() -> None:
    """Make accelerate use the FSDP plugin it was given on a CPU run (it falls back to DDP there)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def __init__(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # Every AcceleratorState() call copies PartialState's MULTI_CPU back in, so switch on each call.
        plugin = fsdp_plugin or getattr(self, "fsdp_plugin", None)
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin
            # As accelerate does on GPUs: PartialState().distributed_type says FSDP too (the package reads it
            # where it has no accelerator: the refusal of evaluation during training under FSDP).
            PartialState._shared_state["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = __init__


def cpu_sync_weights(self: Any) -> None:
    """TEST-SIDE stand-in for TRL's ``VLLMGeneration.sync_weights`` on vLLM's CPU backend (colocate mode).

    TRL calls ``model.load_weights`` on vLLM's model, which fails on the CPU backend: it has repacked
    the linear weights for its GEMM kernels (``'Parameter' object has no attribute 'weight_loader'``).
    vLLM's own ``reload_weights`` takes checkpoint-format weights and repacks them; the tied
    ``lm_head`` (which shares the embedding) keeps its old packed copy, so it is repacked too.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
    weights = [(name, param.detach().clone()) for name, param in self._iter_named_params()]
    runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    model = runner.get_model()
    if getattr(model.config, "tie_word_embeddings", False):
        dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)
    self.llm.reset_prefix_cache()


def vllm_options(**options: Any) -> None:
    """TEST-SIDE: build TRL's colocated ``vllm.LLM`` with ``options`` on top of TRL's own arguments.

    ``dtype``: TRL 1.16 passes none, so vLLM resolves ``auto``, and ``auto`` downcasts a float32 checkpoint
    to the platform's first dtype (bfloat16 on CPU and GPU). The trainer then computes in float32 and vLLM
    in bfloat16, and their log-probs differ by the precision alone (about 0.03 nats a token on
    SmolLM2-135M), which hides whether a sync carried the weights. With float32 on both sides only
    summation order is left.

    ``enforce_eager``: the same model, run without vLLM's compile step; what the tests check (prompts,
    log-probs, weight sync) does not go through it, and it is most of an engine start on CPU.
    """
    import trl.generation.vllm_generation as module

    original = module.LLM

    def build(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, **options})

    module.LLM = build


def describe_engine(trainer: Any) -> dict[str, Any]:
    """What holds the model on this rank: wrapper class, DeepSpeed ZeRO stage, FSDP2 DTensors, DDP."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    accelerator, wrapped = trainer.accelerator, trainer.model_wrapped
    params = list(trainer.model.parameters())
    info: dict[str, Any] = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "device": str(accelerator.device),
        "wrapped_class": f"{type(wrapped).__module__}.{type(wrapped).__name__}",
        "ddp": isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
        "dtensor_params": sum(isinstance(p, DTensor) for p in params),
        "params": len(params),
    }
    if getattr(trainer, "use_vllm", False) and trainer.vllm_mode == "colocate":
        llm = trainer.vllm_generation.llm
        info["vllm"] = {
            "class": f"{type(llm).__module__}.{type(llm).__name__}",
            "device_type": llm.llm_engine.vllm_config.device_config.device_type,
            "max_model_len": llm.llm_engine.model_config.max_model_len,
            "dtype": str(llm.llm_engine.model_config.dtype),
            "enforce_eager": llm.llm_engine.model_config.enforce_eager,
        }
    if hasattr(wrapped, "zero_optimization_stage"):  # a DeepSpeedEngine
        info["zero_stage"] = wrapped.zero_optimization_stage()
        info["optimizer_class"] = type(wrapped.optimizer).__name__
        # ZeRO-3 partitions each parameter: ds_tensor holds this rank's shard, ds_numel the full size.
        shards = [p for p in params if hasattr(p, "ds_tensor")]
        info["zero3_params"] = len(shards)
        info["zero3_shard_numel"] = sum(p.ds_tensor.numel() for p in shards)
        info["zero3_full_numel"] = sum(p.ds_numel for p in shards)
        info["zero3_status"] = sorted({str(p.ds_status) for p in shards})
    if info["dtensor_params"]:
        info["dtensor_placements"] = sorted({str(p.placements) for p in params if isinstance(p, DTensor)})
        info["fsdp_version"] = accelerator.state.fsdp_plugin.fsdp_version
    return info


def logprob_gap(trainer: Any) -> float:
    """Mean |log p| difference between vLLM and the trained model over a fixed token sequence."""
    import torch
    from vllm import SamplingParams

    tokenizer = trainer.processing_class
    ids = tokenizer("<|im_start|>user\nCompute $12 + 345$.<|im_end|>\n<|im_start|>assistant\n12 + 345 = 357")[
        "input_ids"
    ]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    out = trainer.vllm_generation.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    served = [next(iter(lp.values())).logprob for lp in out.prompt_logprobs[1:]]
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    own = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    return float((own - torch.tensor(served)).abs().mean())


def install_probe() -> None:
    """Subclass our trainer (test-side) so that it records the engine, vLLM's prompts and the sync gap."""
    from transformers import TrainerCallback

    import prompt_aug.train as entry

    out = Path(PROBE_DIR)
    out.mkdir(parents=True, exist_ok=True)

    class EngineProbe(TrainerCallback):
        def __init__(self, trainer: Any) -> None:
            self.trainer, self.info = trainer, None

        def _write(self) -> None:
            rank = self.trainer.accelerator.process_index
            (out / f"rank{rank}.json").write_text(json.dumps(self.info, indent=2))

        def on_train_begin(self, args, state, control, **kwargs):
            self.start_step = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            if self.info is None:
                self.info = {**describe_engine(self.trainer), "start_step": self.start_step}
                self._write()

        def on_train_end(self, args, state, control, **kwargs):
            trainer = self.trainer
            if getattr(trainer, "use_vllm", False) and trainer.vllm_mode == "colocate":
                self.info["logprob_gap_before_sync"] = logprob_gap(trainer)
                trainer.vllm_generation.sync_weights()
                self.info["logprob_gap_after_sync"] = logprob_gap(trainer)
            self.info["end_step"] = state.global_step
            self._write()

    class ProbedTrainer(entry.PromptAugGRPOTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.add_callback(EngineProbe(self))
            if getattr(self, "use_vllm", False):
                generation, rank = self.vllm_generation, self.accelerator.process_index
                original = generation.generate

                def generate(prompts: list[list[int]], *args: Any, **kwargs: Any) -> Any:
                    with (out / f"vllm_prompts_rank{rank}.jsonl").open("a") as sink:
                        for ids in prompts:
                            sink.write(json.dumps(self.processing_class.decode(ids)) + "\n")
                    return original(prompts, *args, **kwargs)

                generation.generate = generate

    entry.PromptAugGRPOTrainer = ProbedTrainer


def record_threads_at_exit(folder: Path) -> None:
    """At exit, write this rank's native thread names (gloo names its own ``pt_gloo_runloop``, ...)."""
    import atexit

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for native_threads
    from native_threads import thread_names

    def write() -> None:
        names = thread_names()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"threads_rank{os.environ.get('RANK', '0')}.txt").write_text("\n".join(names) + "\n")

    atexit.register(write)


def main() -> None:
    if os.environ.get("ENGINE_THREADS_AT_EXIT"):
        record_threads_at_exit(Path(os.environ["ENGINE_THREADS_AT_EXIT"]))
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        switch_fsdp_on_cpu()
    if os.environ.get("ENGINE_VLLM_CPU_SYNC") == "1":
        from trl.generation.vllm_generation import VLLMGeneration

        VLLMGeneration.sync_weights = cpu_sync_weights
    options: dict[str, Any] = {}
    if os.environ.get("ENGINE_VLLM_DTYPE"):
        options["dtype"] = os.environ["ENGINE_VLLM_DTYPE"]
    if os.environ.get("ENGINE_VLLM_EAGER") == "1":
        options["enforce_eager"] = True
    if options:
        vllm_options(**options)
    if PROBE_DIR:
        install_probe()
    from prompt_aug.train import main as train_main

    train_main(sys.argv[1:])


if __name__ == "__main__":
    main()
