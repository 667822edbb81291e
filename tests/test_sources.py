"""Reading a dataset as stored (`prompt_aug.sources`), on small files and folders written here (no Hub)."""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pandas as pd
import pytest

from prompt_aug.data import load_math_dataset
from prompt_aug.sources import SourceError, _load_dataset, read_dataset


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _parquet(path: Path, questions: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"question": questions, "answer": ["1"] * len(questions)}).to_parquet(path)


# -- Hub datasets --------------------------------------------------------------------------------------------


def test_a_dataset_of_several_configs_with_none_named_lists_them(tmp_path):
    # A folder whose README names its configs is read as a Hub repository of several configs is.
    for config in ("main", "socratic"):
        _jsonl(tmp_path / config / "train.jsonl", [{"question": "q", "answer": "1"}])
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n"
        "- config_name: socratic\n  data_files:\n  - split: train\n    path: socratic/train.jsonl\n---\n"
    )
    with pytest.raises(SourceError) as err:
        _load_dataset("Hub dataset 'openai/gsm8k'", str(tmp_path), None, split="train")
    assert str(err.value) == (
        "Hub dataset 'openai/gsm8k': has several configs and none is named; set dataset_config (or a mixture "
        "source's name) to one of: ['main', 'socratic']"
    )


class _NotFound(http.server.BaseHTTPRequestHandler):
    """A Hub endpoint that knows no repository, as the Hub answers for one missing (or not yours)."""

    def _answer(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def empty_hub(monkeypatch, tmp_path):
    """The Hub clients online, at a local endpoint that has no repository."""
    import datasets
    from huggingface_hub import constants

    server = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", url)
    for module, name, value in [
        (constants, "HF_HUB_OFFLINE", False),
        (constants, "ENDPOINT", url),
        (constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"),
        (constants, "HF_HUB_CACHE", str(tmp_path / "hub")),
        (datasets.config, "HF_HUB_OFFLINE", False),
        (datasets.config, "HF_ENDPOINT", url),
        (datasets.config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}"),
    ]:
        monkeypatch.setattr(module, name, value)
    yield
    server.shutdown()


def test_a_hub_dataset_that_is_not_there_says_to_check_the_id_or_log_in(empty_hub):
    with pytest.raises(SourceError) as err:
        read_dataset("nobody-here/no-such-data")
    assert str(err.value) == (
        "Hub dataset 'nobody-here/no-such-data': Dataset 'nobody-here/no-such-data' doesn't exist on the Hub "
        "or cannot be accessed. Check the id (owner/name); if it is private or gated, log in (hf auth login) "
        "and ask for access on its page; or give a local path"
    )


# -- Folders of files --------------------------------------------------------------------------------------


def test_shards_with_other_columns_name_the_odd_file_and_its_columns(tmp_path):
    extra = tmp_path / "extra"
    _jsonl(extra / "train-0.jsonl", [{"question": "a", "answer": "1"}])
    _jsonl(extra / "train-1.jsonl", [{"question": "b", "answer": "2", "level": "Level 3"}])
    with pytest.raises(SourceError) as err:
        read_dataset(str(extra))
    assert str(err.value) == (
        f"{extra / 'train-1.jsonl'}: other columns than train-0.jsonl (extra columns ['level']); give every "
        "file of a split the same columns and types, or leave train-1.jsonl out"
    )
    # The odd one out of three, whichever comes first: the columns the others agree on are the reference.
    missing = tmp_path / "missing"
    (missing / "train-0.csv").parent.mkdir()
    (missing / "train-0.csv").write_text("question\na\n")
    (missing / "train-1.csv").write_text("question,answer\nb,2\n")
    (missing / "train-2.csv").write_text("question,answer\nc,3\n")
    with pytest.raises(SourceError, match=r"^\S*train-0\.csv: other columns than train-1\.csv \(missing "
                       r"columns \['answer'\]\); .* or leave train-0\.csv out$"):  # fmt: skip
        read_dataset(str(missing))


def test_a_folder_of_unnamed_shards_is_read_as_its_one_split(tmp_path):
    _parquet(tmp_path / "part-0.parquet", ["q1"])
    _parquet(tmp_path / "part-1.parquet", ["q2"])
    assert read_dataset(str(tmp_path))["question"] == ["q1", "q2"]
    assert read_dataset(str(tmp_path), split="train[1:]")["question"] == ["q2"]


def test_split_named_sub_folders_are_the_splits(tmp_path):
    for split in ("train", "test"):
        _parquet(tmp_path / split / "part-0.parquet", [f"{split} 1"])
        _parquet(tmp_path / split / "part-1.parquet", [f"{split} 2"])
    assert read_dataset(str(tmp_path))["question"] == ["train 1", "train 2"]
    assert read_dataset(str(tmp_path), split="test[:1]")["question"] == ["test 1"]
    assert read_dataset(str(tmp_path), name="train")["question"] == ["train 1", "train 2"]
    with pytest.raises(SourceError) as err:
        read_dataset(str(tmp_path), split="dev")
    assert str(err.value) == (
        f"no 'dev' file in {tmp_path}; files: []; its sub-folders: ['test', 'train']. Ask for one of those "
        "splits"
    )


def test_a_save_to_disk_folder_of_one_split_read_for_another_says_so(tmp_path, caplog):
    # Read as asked, with a warning: the label datasets keeps can be stale (train_test_split's parts).
    import datasets

    saved = tmp_path / "saved"
    rows = {"question": ["a", "b"], "answer": ["1", "2"]}
    datasets.Dataset.from_dict(rows, split="train").save_to_disk(str(saved))
    for split, questions in (("test", ["a", "b"]), ("test[:1]", ["a"])):
        caplog.clear()
        with caplog.at_level("WARNING", logger="prompt_aug"):
            assert read_dataset(str(saved), split=split)["question"] == questions
        assert (
            f"dataset {str(saved)!r}: a save_to_disk folder of one split, labelled 'train', read as the "
            in (caplog.text)
        )
    assert read_dataset(str(saved), split="train[:1]")["question"] == ["a"]
    unnamed = tmp_path / "unnamed"  # saved with no split: read for any
    datasets.Dataset.from_dict(rows).save_to_disk(str(unnamed))
    assert read_dataset(str(unnamed), split="test")["question"] == ["a", "b"]


def test_a_save_to_disk_folder_of_splits_without_the_one_asked_for_lists_them_and_the_key(tmp_path):
    import datasets

    saved = tmp_path / "suite"
    one = datasets.Dataset.from_dict({"problem": ["a"], "answer": ["1"]})
    datasets.DatasetDict({"aime": one, "math": one}).save_to_disk(str(saved))
    with pytest.raises(SourceError) as err:
        read_dataset(str(saved))
    assert str(err.value) == (
        f"split 'train' not in {saved}; its splits: ['aime', 'math']. Ask for one of them (dataset_split, "
        "a mixture source's split, or the preview's --split)"
    )
    assert read_dataset(str(saved), split="math[:1]")["problem"] == ["a"]


# -- CSV cells ------------------------------------------------------------------------------------


def test_an_empty_csv_cell_is_a_row_with_no_gold_and_the_question_and_gold_columns_are_text(tmp_path):
    # pandas alone reads this answer column as floats: 7.0, and 123456789012345680 for the 17-digit gold.
    # Other columns keep pandas' types, as a JSON source's keep theirs.
    path = tmp_path / "q.csv"
    path.write_text("question,answer,level\nq0,7,3\nq1,,3\n,8,3\nq3,123456789012345678,3\nq4,007,4\n")
    assert read_dataset(str(path)).to_list() == [
        {"question": "q0", "answer": "7", "level": 3},
        {"question": "q1", "answer": None, "level": 3},
        {"question": None, "answer": "8", "level": 3},
        {"question": "q3", "answer": "123456789012345678", "level": 3},
        {"question": "q4", "answer": "007", "level": 4},
    ]
    assert load_math_dataset(str(path), levels=["4"])[0]["answer"] == ["007"]
    rows, report = load_math_dataset(str(path))
    assert rows["answer"] == ["7", "123456789012345678", "007"]
    assert "dropped 1: empty gold answer (rows 1, counted from 0)" in str(report)
    assert "dropped 1: empty question (rows 2, counted from 0)" in str(report)
    # A column a recipe names is text too.
    named = tmp_path / "named.csv"
    named.write_text("statement,final\nq0,123456789012345678\nq1,\n")
    assert load_math_dataset(str(named), question_column="statement", answer_column="final")[0]["answer"] == [
        "123456789012345678"
    ]


def test_csv_data_files_in_a_folder_are_read_as_written(tmp_path):
    (tmp_path / "q.csv").write_text("question,answer\nWhich option?,None\nq2,NA\nq3,007\n")
    assert read_dataset(str(tmp_path), data_files="q.csv")["answer"] == ["None", "NA", "007"]
    assert read_dataset(str(tmp_path), data_files=["*.csv"])["answer"] == ["None", "NA", "007"]
    assert read_dataset("csv", data_files=str(tmp_path / "q.csv"))["answer"] == ["None", "NA", "007"]


def test_a_csv_file_of_a_header_alone_still_holds_no_rows(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text("question,answer\n")
    with pytest.raises(SourceError, match=rf"^{re.escape(str(path))}: holds no rows"):
        read_dataset(str(path))


def test_a_folder_with_no_data_file_says_what_is_read_and_what_it_holds(tmp_path):
    folder = tmp_path / "notdata"
    folder.mkdir()
    (folder / "readme.txt").write_text("questions to come\n")
    (folder / "notes.md").write_text("\n")
    with pytest.raises(
        SourceError,
        match=r"^no data file in .*notdata \(it holds: notes\.md, readme\.txt\); the package reads \.jsonl, "
        r"\.json, \.csv and \.parquet files, or a folder written by save_to_disk: put the data there, or "
        r"give its path$",
    ):
        read_dataset(str(folder))
    (folder / "readme.txt").unlink()
    (folder / "notes.md").unlink()
    with pytest.raises(SourceError, match=r"notdata \(it holds: nothing\)"):
        read_dataset(str(folder))


# -- A JSON file of one object ---------------------------------------------------------------------------


def test_a_json_file_that_wraps_its_rows_under_a_key_is_read_from_that_key(tmp_path, caplog):
    rows = [{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": "What is 2 + 3?", "answer": "5"}]
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": "1.0", "data": rows}, indent=2))
    with caplog.at_level("WARNING", logger="prompt_aug"):
        assert read_dataset(str(wrapped)).to_list() == rows
    assert f"{wrapped}: the rows under key 'data' are read; keys ['version'] are left out" in caplog.text
    kept, report = load_math_dataset(str(wrapped))
    assert kept["question"] == ["What is 1 + 1?", "What is 2 + 3?"] and report.rows == 2
    # ... also after a byte-order mark, and as a mapping of columns under the key
    wrapped.write_text(json.dumps({"data": {"problem": ["p?"], "answer": ["1"]}}), encoding="utf-8-sig")
    assert read_dataset(str(wrapped)).to_list() == [{"problem": "p?", "answer": "1"}]
    # Rows under split names: the split asked for (or a part of it) is read from its key.
    splits = tmp_path / "splits.json"
    splits.write_text(json.dumps({"train": rows, "test": rows[1:]}))
    assert read_dataset(str(splits)).to_list() == rows
    assert read_dataset(str(splits), split="test").to_list() == rows[1:]
    assert read_dataset(str(splits), split="train[1:]").to_list() == rows[1:]
    # ... and as a mixture source in TRL's form (the json builder with data_files)
    assert read_dataset("json", data_files=[str(splits)], split="train").to_list() == rows
    # A list of metadata records beside the rows is no second set of rows: only the rows hold a question.
    described = tmp_path / "described.json"
    described.write_text(json.dumps({"authors": [{"name": "A. Author"}], "data": rows}))
    assert read_dataset(str(described)).to_list() == rows


def test_a_split_that_files_given_as_a_list_do_not_form_is_named_with_the_way_to_form_it(tmp_path):
    """Files given to a builder as a list form one split, train: asking for test names the splits there and
    how to give the files as that split, not "cannot be read" as if the data were broken."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    with pytest.raises(SourceError) as err:
        read_dataset("json", data_files=[str(rows)], split="test")
    message = str(err.value)
    assert "has no split 'test', only ['train']" in message and "{test: [...]}" in message, message
    assert "cannot be read" not in message and "\n" not in message
    assert read_dataset("json", data_files={"test": [str(rows)]}, split="test")["answer"] == ["2"]


def test_a_json_object_that_is_no_list_of_rows_says_how_to_write_it(tmp_path):
    splits = tmp_path / "splits.json"
    splits.write_text(json.dumps({"easy": [{"question": "q?", "answer": "1"}], "hard": [{"question": "r?"}]}))
    with pytest.raises(SourceError) as err:
        read_dataset(str(splits))
    assert str(err.value) == (
        f"{splits}: one JSON object whose keys ['easy', 'hard'] each hold rows, and none is the split "
        "'train'; ask for one of them as the split (dataset_split, a mixture source's split, or the "
        "preview's --split)"
    )
    assert read_dataset(str(splits), split="hard").to_list() == [{"question": "r?"}]
    # Columns rather than rows: datasets reads the object as one row of lists.
    frame = pd.DataFrame({"question": ["a?", "b?"], "answer": ["1", "2"]})
    advice = (
        r"that datasets reads as one row, not a list of rows; write one row per line \(JSON Lines\), e\.g\. "
        r"pandas' df\.to_json\(path, orient='records', lines=True\)$"
    )
    for orient in ("columns", "index", None):
        path = tmp_path / f"frame-{orient}.json"
        if orient is None:
            path.write_text(json.dumps(frame.to_dict(orient="list")))
        else:
            frame.to_json(path, orient=orient)
        with pytest.raises(
            SourceError, match=rf"^{re.escape(str(path))}: one JSON object \(keys .*\) {advice}"
        ):
            read_dataset(str(path))
    frame.to_json(tmp_path / "records.json", orient="records")  # a list of rows, as it was
    assert read_dataset(str(tmp_path / "records.json")).to_list() == frame.to_dict(orient="records")


def test_a_json_file_of_one_row_is_still_that_row(tmp_path):
    # One object that is a row: a question beside list golds, or a conversation in verl layout.
    path = tmp_path / "one.json"
    row = {"question": "Roots of x^2 = 4?", "answer": ["2", "-2"]}
    path.write_text(json.dumps(row))
    assert read_dataset(str(path)).to_list() == [row]
    verl = {"prompt": [{"role": "user", "content": "1 + 1?"}], "reward_model": {"ground_truth": "2"}}
    path.write_text(json.dumps(verl))
    assert read_dataset(str(path)).to_list() == [verl]
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "1 + 1?"}], "label": "2"}))
    assert len(read_dataset(str(path), text_columns=("messages", "label"))) == 1
