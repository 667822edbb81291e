"""Data loaders and the preview CLI, on small files written here (no Hub, no shared data)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import datasets
import pandas as pd
import pytest

from prompt_aug import data
from prompt_aug.data import DataError, filter_long_prompts, load_math_dataset, to_rows
from prompt_aug.sources import builtin_tokenizer
from prompt_aug.templates import load_templates, select_templates

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
VERL_ROWS = [  # (question, gold, extra_info.index)
    ("What is $1+1$?", "2", "id-a"),
    ("Compute $\\frac{1}{2}+\\frac{1}{3}$.", "\\frac{5}{6}", "id-b"),
    ("Find all $x$ with $x^2=4$.", "-2, 2", "id-c"),
    ("Which choice is right? (A) 0 (B) 1", "", "id-d"),  # empty ground truth, as in 2 rows of the real file
    ("What day comes after Sunday?", "\\text{Monday}", "id-e"),
]


def _verl_frame(rows) -> pd.DataFrame:
    # The columns of the real SimpleRL-Zoo file, its raw `question` beside the chat `prompt` included.
    return pd.DataFrame(
        {
            "question": [q for q, _, _ in rows],
            "data_source": ["test"] * len(rows),
            "prompt": [
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q + " "}]
                for q, _, _ in rows
            ],
            "ability": ["math"] * len(rows),
            "reward_model": [{"ground_truth": gold, "style": "rule"} for _, gold, _ in rows],
            "extra_info": [{"index": index, "original_source": "test"} for _, _, index in rows],
        }
    )


@pytest.fixture
def verl_dir(tmp_path) -> Path:
    """A SimpleRL-style folder: <name>.train.parquet and <name>.test.parquet in verl layout."""
    folder = tmp_path / "simplerl"
    folder.mkdir()
    _verl_frame(VERL_ROWS).to_parquet(folder / "SimpleRL-simplelr_qwen_level3to5.train.parquet")
    _verl_frame(VERL_ROWS[:1]).to_parquet(folder / "SimpleRL-simplelr_qwen_level3to5.test.parquet")
    return folder


def test_verl_layout_uid_question_and_gold(verl_dir):
    rows, report = load_math_dataset(str(verl_dir))
    assert report.read == 5 and report.rows == 4 == len(rows)
    assert report.dropped["empty gold answer"] == 1 and not report.dropped["empty question"]
    assert "dropped 1: empty gold answer" in str(report)
    assert rows["uid"] == ["id-a", "id-b", "id-c", "id-e"]  # extra_info.index
    assert rows["question"][0] == "What is $1+1$?"  # the user turn, stripped; not the system turn
    assert rows["answer"] == ["2", "\\frac{5}{6}", "-2, 2", "\\text{Monday}"]  # reward_model.ground_truth
    test_rows, _ = load_math_dataset(str(verl_dir), split="test")
    assert len(test_rows) == 1


SHARED_SIMPLERL = Path(__file__).resolve().parents[2] / "shared" / "data" / "simplerl_level3to5"


@pytest.mark.skipif(
    not SHARED_SIMPLERL.is_dir(), reason="no copy of SimpleRL-Zoo in ../shared/data beside the repo"
)
def test_the_papers_training_set_loads_as_its_recipes_read_it():
    # The real file, as the paper recipes' dataset_config names it: its columns, not a layout made here.
    rows, report = load_math_dataset(str(SHARED_SIMPLERL), config="simplelr_qwen_level3to5")
    assert (report.read, report.rows) == (8523, 8521)
    assert dict(report.dropped) == {"empty gold answer": 2}
    assert rows.column_names[:3] == ["question", "answer", "uid"]  # the raw question column is not kept twice


def test_verl_layout_in_a_config_subfolder(tmp_path, verl_dir):
    root = tmp_path / "SimpleRL-Zoo-Data"
    root.mkdir()
    verl_dir.rename(root / "simplelr_qwen_level3to5")
    rows, _ = load_math_dataset(str(root), config="simplelr_qwen_level3to5")
    assert len(rows) == 4


def test_verl_layout_without_unique_index_gets_stable_hash_uids(tmp_path):
    frame = _verl_frame([("Q one?", "1", "same"), ("Q two?", "2", "same")])
    frame.to_parquet(tmp_path / "d.train.parquet")
    first, report = load_math_dataset(str(tmp_path))
    again, _ = load_math_dataset(str(tmp_path))
    assert first["uid"] == again["uid"] and len(set(first["uid"])) == 2 and "same" not in first["uid"]
    # The report says the ids were not kept, and why.
    assert "note: 1 value(s) of column 'extra_info.index' repeat (e.g. 'same'), so each row's uid" in str(
        report
    )
    frame = pd.DataFrame({"question": ["a?", "b?", "c?"], "answer": ["1", "2", "3"], "uid": [7, 7, 8]})
    frame.to_json(tmp_path / "u.jsonl", orient="records", lines=True)
    rows, report = load_math_dataset(str(tmp_path / "u.jsonl"))
    assert "7" not in rows["uid"] and "note: 1 value(s) of column 'uid' repeat (e.g. '7')" in str(report)


def test_ids_that_are_not_ids_and_a_verl_reward_model_stored_as_text_are_read(tmp_path):
    # A uid column of lists is no set of ids: the rows get hashes of their questions, and the report says why.
    frame = pd.DataFrame({"question": ["a?", "b?"], "answer": ["1", "2"], "uid": [[1], [2]]})
    frame.to_json(tmp_path / "lists.jsonl", orient="records", lines=True)
    rows, report = load_math_dataset(str(tmp_path / "lists.jsonl"))
    assert len(set(rows["uid"])) == 2 and "[1]" not in rows["uid"]
    assert "note: column 'uid' holds list [1], not an id (text or a number)" in str(report)
    # verl's reward_model and extra_info written as JSON text (a CSV or a JSON-lines export) read as mappings.
    frame = _verl_frame(VERL_ROWS[:2])
    for column in ("reward_model", "extra_info"):
        frame[column] = [json.dumps(value) for value in frame[column]]
    (tmp_path / "text").mkdir()
    frame.to_parquet(tmp_path / "text" / "d.train.parquet")
    rows, _ = load_math_dataset(str(tmp_path / "text"))
    assert rows["answer"] == ["2", "\\frac{5}{6}"] and rows["uid"] == ["id-a", "id-b"]
    # JSON text keeps no type: indices 1 and "1" would be one uid, so neither is kept.
    frame["extra_info"] = [json.dumps({"index": 1}), json.dumps({"index": "1"})]
    frame.to_parquet(tmp_path / "text" / "d.train.parquet")
    rows, report = load_math_dataset(str(tmp_path / "text"))
    assert len(set(rows["uid"])) == 2 and "1" not in rows["uid"]
    assert "note: 1 value(s) of column 'extra_info.index' repeat (e.g. '1')" in str(report)


def test_math_layout_with_level_filter_reads_the_boxed_answer(tmp_path):
    frame = pd.DataFrame(
        {
            "problem": ["Add 2 and 3.", "Halve 1.", "Hard one.", "Easy one."],
            "level": ["Level 3", "Level 5", "Level 4", "Level 1"],
            "type": ["Algebra"] * 4,
            "solution": [
                "We get $2+3=\\boxed{5}$.",
                "So it is $\\boxed{\\frac{1}{2}}$.",
                "Thus \\boxed{(1, 2)}.",
                "Clearly \\boxed{0}.",
            ],
        }
    )
    path = tmp_path / "math.parquet"
    frame.to_parquet(path)
    rows, report = load_math_dataset(str(path), levels=["Level 3", "Level 5"])
    assert rows["question"] == ["Add 2 and 3.", "Halve 1."]
    assert rows["answer"] == ["5", "\\frac{1}{2}"]
    assert report.dropped["level not in ['Level 3', 'Level 5']"] == 2
    all_rows, _ = load_math_dataset(str(path))
    assert all_rows["answer"] == ["5", "\\frac{1}{2}", "(1, 2)", "0"]


def test_level_filter_needs_a_level_column(tmp_path):
    path = tmp_path / "d.jsonl"
    pd.DataFrame({"question": ["q"], "answer": ["1"]}).to_json(path, orient="records", lines=True)
    with pytest.raises(DataError, match="'level'.*columns"):
        load_math_dataset(str(path), levels=["Level 3"])


def test_column_mapping(tmp_path):
    path = tmp_path / "custom.csv"
    pd.DataFrame(
        {"statement": ["What is 6 x 7?", "What is 6 x 7?"], "final": [42, 42], "src": ["a", "b"]}
    ).to_csv(path, index=False)
    rows, report = load_math_dataset(str(path), question_column="statement", answer_column="final")
    assert rows["question"] == ["What is 6 x 7?"] * 2 and rows["answer"] == ["42", "42"]
    assert len(set(rows["uid"])) == 2  # duplicates get distinct, stable uids
    assert report.rows == 2


def test_a_csv_answer_spelt_like_a_missing_value_is_kept_and_only_an_empty_cell_is_missing(tmp_path):
    """pandas reads "None", "NA", "null" and "nan" as missing by default; in a question set, answers."""
    path = tmp_path / "words.csv"
    path.write_text(
        "question,answer\nWhich option holds?,None\nIs it defined?,NA\nWhat does it return?,null\n"
        "What is 0/0?,nan\nWhat is 1 + 1?,\n"
    )
    rows, report = load_math_dataset(str(path))
    assert rows["answer"] == ["None", "NA", "null", "nan"]
    assert (report.read, report.rows) == (5, 4)  # the empty cell alone is dropped


def test_missing_column_names_it_and_lists_the_present_ones(tmp_path):
    path = tmp_path / "custom.csv"
    pd.DataFrame({"statement": ["q"], "final": [1]}).to_csv(path, index=False)
    with pytest.raises(DataError) as err:
        load_math_dataset(str(path), question_column="problem_text", answer_column="final")
    message = str(err.value)
    assert "'problem_text'" in message and "statement" in message and "final" in message
    with pytest.raises(DataError, match=r"question_column.*\['statement', 'final'\]"):
        load_math_dataset(str(path))  # nothing to guess from


def test_long_prompts_are_dropped_and_counted(tokenizer):
    import datasets

    rows = datasets.Dataset.from_dict(
        {
            "question": ["What is $2+2$?", "Compute " + " + ".join(["1"] * 400) + ".", "Evaluate $3^2$."],
            "answer": ["4", "400", "9"],
            "uid": ["a", "b", "c"],
        }
    )
    templates, _ = select_templates(load_templates(tokenizer=tokenizer))
    longest = max(len(tokenizer(t.render(rows["question"][0], tokenizer)).input_ids) for t in templates)
    kept, dropped = filter_long_prompts(rows, templates, tokenizer, max_prompt_length=longest + 20)
    assert dropped == 1 and kept["uid"] == ["a", "c"]
    assert filter_long_prompts(rows, templates, tokenizer, None) == (rows, 0)


def test_to_rows_counts_empty_questions_separately():
    import datasets

    raw = datasets.Dataset.from_dict({"question": ["", "q2", "q3"], "answer": ["1", "", "3"]})
    rows, dropped = to_rows(raw)
    assert rows["question"] == ["q3"]
    assert dropped["empty question"] == 1 and dropped["empty gold answer"] == 1


def test_a_missing_question_is_an_empty_one_and_a_conversation_gives_its_user_turn():
    import datasets

    raw = datasets.Dataset.from_list(
        [{"question": None, "answer": "1"}, {"question": "  q3 ", "answer": "3"}]
    )
    rows, dropped = to_rows(raw)
    assert rows["question"] == ["q3"] and dropped["empty question"] == 1  # not asked as "None"
    floats = datasets.Dataset.from_dict({"question": [float("nan"), 1.5], "answer": ["1", "2"]})
    assert to_rows(floats)[0]["question"] == ["1.5"]
    chats = datasets.Dataset.from_list(
        [
            {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 2+2? "}],
             "answer": "4"},
        ]
    )  # fmt: skip
    assert to_rows(chats, question_column="prompt")[0]["question"] == ["2+2?"]


def test_a_question_whose_user_turn_holds_an_image_is_bad_data_not_asked_without_it():
    import datasets

    def chat(*blocks):
        return [{"role": "user", "content": [*blocks, {"type": "text", "text": "What is the shaded area?"}]}]

    raw = datasets.Dataset.from_list(
        [
            {"prompt": chat({"type": "image"}), "answer": "4"},
            {"prompt": chat(), "answer": "5"},  # text blocks alone: asked
        ]
    )
    rows, dropped = to_rows(raw, question_column="prompt")
    assert rows["question"] == ["What is the shaded area?"] and rows["answer"] == ["5"]
    assert dropped["question with image content (a text prompt cannot carry it)"] == 1
    as_json = datasets.Dataset.from_dict({"prompt": [json.dumps(chat({"type": "image"}))], "answer": ["4"]})
    rows, dropped = to_rows(as_json, question_column="prompt")  # the conversation stored as JSON text
    assert len(rows) == 0 and dropped["question with image content (a text prompt cannot carry it)"] == 1
    with pytest.raises(DataError, match=r"question with image content .* in column 'prompt'"):
        data.rows_of("mine", raw, question_column="prompt", max_bad_row_share=0.05)


def test_a_question_cell_that_is_no_text_and_no_conversation_is_bad_data_not_its_repr():
    import datasets

    # ShareGPT's turns ({from, value}) and a mapping are not {role, content} messages: rather than train on
    # "[{'from': 'human', ...}]", such a row is dropped as bad data in its column, and counted.
    sharegpt = [{"from": "human", "value": "What is 2+2?"}]
    raw = datasets.Dataset.from_list(
        [
            {"conversations": sharegpt, "answer": "4"},
            {"conversations": sharegpt, "answer": "5"},
        ]
    )
    with pytest.raises(
        DataError, match=r"^all 2 rows are unusable \(2 question of type list .*'conversations'"
    ):
        data.rows_of("mine", raw, question_column="conversations", max_bad_row_share=0.05)
    rows, dropped = to_rows(
        datasets_from({"question": [{"text": "1+1?"}, {"text": "2+2?"}], "answer": ["2", "4"]})
    )
    assert len(rows) == 0 and dropped.bad() == 2
    # A verl-layout `prompt` of text (not a conversation) is read as the question, not a traceback.
    raw = datasets.Dataset.from_list([{"prompt": " 1 + 1? ", "reward_model": {"ground_truth": "2"}}])
    assert to_rows(raw)[0]["question"] == ["1 + 1?"]


def test_a_conversation_of_content_blocks_gives_the_text_of_its_user_turn(tmp_path):
    # TRL's typed content: a list of blocks, of which the text ones make the question.
    path = tmp_path / "blocks.jsonl"
    turn = {
        "role": "user",
        "content": [{"type": "text", "text": " What is "}, {"type": "text", "text": "2+2? "}],
    }
    path.write_text(json.dumps({"messages": [turn], "answer": "4"}) + "\n")
    rows, _ = load_math_dataset(str(path), question_column="messages")
    assert rows["question"] == ["What is 2+2?"] and rows["answer"] == ["4"]


def test_a_solution_without_a_box_is_dropped_saying_the_box_is_read():
    raw = datasets_from({"problem": ["q1", "q2"], "solution": ["So $\\boxed{4}$.", "7"]})
    rows, dropped = to_rows(raw, "problem", "solution")
    assert rows["answer"] == ["4"]
    assert (
        dropped["no \\boxed{} in the solution (its last box is the gold; rename a column of plain answers)"]
        == 1
    )


def test_a_solution_column_without_a_box_in_any_row_holds_plain_answers():
    # TRL's datasets keep the final answer in `solution`: nothing to extract, every row kept.
    raw = datasets_from({"prompt": ["q1", "q2"], "solution": ["4", "\\frac{1}{2}"]})
    for column in (None, "solution"):  # guessed or named
        rows, dropped = to_rows(raw, "prompt", column)
        assert rows["answer"] == ["4", "\\frac{1}{2}"] and not dropped.bad()


def test_a_column_trl_reads_as_images_stops_the_load_in_one_line():
    raw = datasets_from({"question": ["q"], "answer": ["1"], "image": [None]})
    with pytest.raises(DataError, match="^column 'image': TRL reads it as the row's images"):
        to_rows(raw)
    with pytest.raises(DataError, match="^column 'images': TRL reads it"):
        to_rows(datasets_from({"question": ["q", "r"], "answer": ["1", "2"], "images": [[], ["x.png"]]}))
    # A column of empty lists TRL ignores: it trains on text, and the rewards get the column.
    rows, _ = to_rows(datasets_from({"question": ["q"], "answer": ["1"], "images": [[]]}))
    assert rows["images"] == [[]]


def test_preview_cli_prints_rows_golds_answer_forms_and_one_prompt_per_template(verl_dir, capsys):
    data.main(["--dataset", str(verl_dir)])
    out = capsys.readouterr().out
    assert "5 rows read, 4 kept" in out
    assert "dropped 1: empty gold answer" in out
    assert "golds: 4 rows with a gold answer, 1 without one (dropped)" in out
    assert "answer forms:" in out
    for form, count in (("integer", 1), ("fraction", 1), ("expression", 1), ("text", 1)):
        assert any(
            line.split()[:-2] == form.split() and line.split()[-2] == str(count)
            for line in out.splitlines()
            if line.startswith("  ")
        ), (form, out)
    names = list(load_templates())
    assert len(names) == 13
    for name in names:
        assert out.count(f"----- template {name} -----") == 1, name
    assert out.count("What is $1+1$?") == 13  # the first question, rendered under every template


def _preview_with_a_long_question(tmp_path, capsys, recipe_text: str) -> str:
    """The preview of the verl rows plus one 600-token question, under the recipe ``recipe_text``."""
    long_question = ("Compute " + " + ".join(["1"] * 300) + ".", "300", "id-long")
    _verl_frame([*VERL_ROWS, long_question]).to_parquet(tmp_path / "d.train.parquet")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe_text)
    data.main(["--dataset", str(tmp_path), "--config", str(recipe)])
    return capsys.readouterr().out


def test_preview_cli_with_a_recipe_uses_its_templates_and_prompt_limit(tmp_path, capsys):
    out = _preview_with_a_long_question(
        tmp_path,
        capsys,
        "model_name_or_path: tiny-random-qwen2\ntemplates: [qwen-math, abel]\nmax_prompt_length: 200\n",
    )
    assert "6 rows read, 4 kept" in out
    assert "dropped 1: prompt longer than 200 tokens (longest template)" in out
    assert out.count("----- template") == 2 and "----- template abel -----" in out


def test_preview_renders_and_limits_prompts_with_the_recipes_chat_template_kwargs(tmp_path, capsys):
    # ChatML with a thinking switch (as Qwen3's template has); without `enable_thinking` it cannot render.
    (tmp_path / "thinking.jinja").write_text(
        "{% if enable_thinking is not defined %}{{ raise_exception('no enable_thinking') }}{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{{ '<|im_start|>assistant\\n' }}"
        "{% if not enable_thinking %}{{ '<think>' + ' thinking is off.' * 40 + '</think>' }}{% endif %}"
    )
    tokenizer = builtin_tokenizer()
    tokenizer.chat_template = (tmp_path / "thinking.jinja").read_text()
    (template,) = select_templates(load_templates(), ["qwen-math"])[0]
    limit = max(
        len(tokenizer(template.render(q, tokenizer, enable_thinking=True)).input_ids) for q, _, _ in VERL_ROWS
    )
    out = _preview_with_a_long_question(
        tmp_path,
        capsys,
        f"model_name_or_path: tiny-random-qwen2\ntemplates: [qwen-math]\nmax_prompt_length: {limit}\n"
        f"chat_template: {tmp_path / 'thinking.jinja'}\nchat_template_kwargs: {{enable_thinking: false}}\n",
    )
    # Every prompt fits the limit without the thinking text, and none with it, as training renders them.
    assert f"dropped 5: prompt longer than {limit} tokens (longest template)" in out
    assert "6 rows read, 0 kept" in out


def test_preview_reads_a_mixture_sources_own_columns_and_levels_as_training_does(
    tmp_path, capsys, monkeypatch
):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt_text": f"q{i}?", "gold": str(i), "level": i % 5 + 1} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(
        "model_name_or_path: tiny-random-qwen2\ndataset_levels: [4, 5]\ndataset_mixture:\n  datasets:\n"
        f"    - {{path: {path}, question_column: prompt_text, answer_column: gold}}\n"
    )
    data.main(["--dataset", str(path), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "10 rows read, 4 kept" in out and "q3?" in out  # levels 4 and 5, as YAML numbers
    # A source's subset and split are its own (TRL's default split "train"), never the top-level keys.
    mixed = {"dataset_split": "test", "dataset_config": "x", "dataset_mixture": {"datasets": [{"path": "p"}]}}
    keys = data._source_keys(mixed, "p")
    assert (keys["dataset_split"], keys["dataset_config"]) == ("train", None)
    # A source in TRL's form (`path: json` with `data_files`) is found by its file.
    recipe.write_text(
        "model_name_or_path: tiny-random-qwen2\ndataset_mixture:\n  datasets:\n"
        f"    - {{path: json, data_files: {{train: [{path}]}}, question_column: prompt_text, "
        "answer_column: gold}\n"
    )
    data.main(["--dataset", str(path), "--config", str(recipe)])
    assert "10 rows read, 10 kept" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # ... and as the same path written another way
    data.main(["--dataset", "./mine.jsonl", "--config", str(recipe)])
    assert "10 rows read, 10 kept" in capsys.readouterr().out
    data.main(["--dataset", "json", "--config", str(recipe)])  # ... and by its builder, with its data files
    assert "10 rows read, 10 kept" in capsys.readouterr().out
    recipe.write_text(recipe.read_text() + f"    - {{path: json, data_files: [{path}]}}\n")
    with pytest.raises(SystemExit, match=r"--dataset json: dataset_mixture.datasets\[0, 1\] all read with"):
        data.main(["--dataset", "json", "--config", str(recipe)])


def test_preview_keeps_only_a_mixture_sources_columns_as_training_does(tmp_path, capsys):
    # A column with a reserved name, left out with the source's `columns` as the error advises: training
    # reads the source, and so does the preview.
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2", "template": "short"}) + "\n")
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(
        "model_name_or_path: tiny-random-qwen2\ndataset_mixture:\n  datasets:\n"
        f"    - {{path: {path}, columns: [question, answer]}}\n"
    )
    data.main(["--dataset", str(path), "--config", str(recipe)])
    assert "1 rows read, 1 kept" in capsys.readouterr().out
    recipe.write_text(recipe.read_text().replace("[question, answer]", "[question, answer, notes]"))
    with pytest.raises(SystemExit, match=r"columns \['notes'\] not found"):
        data.main(["--dataset", str(path), "--config", str(recipe)])


def test_preview_without_the_recipes_tokenizer_skips_the_length_limit_and_says_so(tmp_path, capsys):
    # Offline, the recipe's Hub tokenizer cannot load; the built-in one counts tokens differently, so a
    # limit applied with it would report drops that training would not make.
    out = _preview_with_a_long_question(
        tmp_path,
        capsys,
        "model_name_or_path: Qwen/Qwen2.5-Math-1.5B\ntemplates: [qwen-math]\nmax_prompt_length: 200\n",
    )
    assert "could not load tokenizer 'Qwen/Qwen2.5-Math-1.5B'" in out
    assert "prompt length limit 200 not applied" in out
    assert "6 rows read, 5 kept" in out and "prompt longer than" not in out


def test_the_preview_reads_its_recipe_as_training_does(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    missing, bad, typo = tmp_path / "nonexist.yaml", tmp_path / "bad.yaml", tmp_path / "typo.yaml"
    bad.write_text("templates: [abel,\n")
    typo.write_text("question_colum: problem\n")
    expected = {
        missing: f"--config: no such file {missing}",
        bad: f"{bad}: not valid YAML: ",
        typo: f"{typo}: unknown key 'question_colum'; did you mean 'question_column'?",
    }
    for recipe, says in expected.items():
        with pytest.raises(SystemExit) as done:
            data.main(["--dataset", str(questions), "--config", str(recipe)])
        assert str(done.value.code).startswith(f"prompt-aug-data: error: {says}"), done.value.code
        assert "\n" not in str(done.value.code)


def test_the_preview_reads_the_recipes_values_as_training_parses_them(tmp_path, capsys):
    # A one-value list key is a list of one, and a quoted "false" is false, in training and in the preview.
    path = tmp_path / "q.jsonl"
    rows = [{"question": f"q{i}?", "answer": str(i), "level": f"Level {i}"} for i in (4, 5)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("templates: qwen-math\ndataset_levels: Level 5\n")
    data.main(["--dataset", str(path), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "2 rows read, 1 kept" in out and "dropped 1: level not in ['Level 5']" in out and "q5?" in out
    assert out.count("----- template") == 1 and "----- template qwen-math -----" in out
    recipe.write_text('prompt_augmentation: "false"\neval_template: abel\n')
    data.main(["--dataset", str(path), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert out.count("----- template") == 1 and "----- template abel -----" in out


def test_the_preview_takes_the_columns_on_its_command_line(tmp_path, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"statement": "What is 1 + 1?", "gold": "2"}) + "\n")
    with pytest.raises(SystemExit) as done:
        data.main(["--dataset", str(questions)])
    assert "no question column (tried ['question', 'problem', 'query', 'input']); pass --question_column " \
        "(or set question_column in the recipe)" in str(done.value.code)  # fmt: skip
    data.main(["--dataset", str(questions), "--question_column", "statement", "--answer_column", "gold"])
    out = capsys.readouterr().out
    assert "1 rows read, 1 kept" in out and "What is 1 + 1?" in out
    recipe = tmp_path / "r.yaml"  # the command line's columns over the recipe's
    recipe.write_text("question_column: problem\nanswer_column: solution\n")
    data.main(["--dataset", str(questions), "--config", str(recipe), "--question_column", "statement",
               "--answer_column", "gold"])  # fmt: skip
    assert "1 rows read, 1 kept" in capsys.readouterr().out


def test_a_misspelt_file_name_is_named_in_the_preview(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    with pytest.raises(SystemExit) as done:
        data.main(["--dataset", "mine.jsonnl"])
    assert done.value.code == (
        f"prompt-aug-data: error: dataset 'mine.jsonnl': no such file or folder in {tmp_path}; did you mean "
        "'mine.jsonl'?"
    )
    with pytest.raises(SystemExit) as done:
        data.main(["--dataset", "./mine.json"])
    assert done.value.code == (
        f"prompt-aug-data: error: dataset './mine.json': no such file ({tmp_path / 'mine.json'}); did you "
        "mean './mine.jsonl'?"
    )


@pytest.mark.parametrize("name", ["./no-such-data", "../no/such", "/no/such/data"])
def test_a_missing_local_dataset_fails_at_once_naming_the_path(name):
    with pytest.raises(DataError, match="no such folder"):
        load_math_dataset(name)
    with pytest.raises(
        SystemExit, match=f"prompt-aug-data: error: dataset '{re.escape(name)}': no such folder"
    ):
        data.main(["--dataset", name])


def test_the_preview_reports_an_unreachable_hub_at_once(tmp_path, capsys, unreachable_hub):
    started = time.monotonic()
    with pytest.raises(
        SystemExit,
        match=r"^prompt-aug-data: error: --dataset: cannot reach the Hugging Face Hub \(http://127",
    ):
        data.main(["--dataset", "someone/questions"])
    _jsonl(tmp_path / "train.jsonl", [("q1", "1")])
    data.main(["--dataset", str(tmp_path), "--tokenizer", "someone/model"])  # falls back to ChatML
    out = capsys.readouterr().out
    assert "(could not load tokenizer 'someone/model': --tokenizer: cannot reach the Hugging Face Hub" in out
    # The fallback's hint names what helps once a name has failed: another name, not --config again.
    assert (
        "(rendering with the built-in ChatML tokenizer instead; pass --tokenizer with a local folder or a "
        "fetched model's name)" in out
    )
    assert time.monotonic() - started < 30  # not the clients' retries
    # A local folder holding a tokenizer alone (no model) is read as it is.
    builtin_tokenizer().save_pretrained(tmp_path / "tok")
    data.main(["--dataset", str(tmp_path), "--tokenizer", str(tmp_path / "tok")])
    out = capsys.readouterr().out
    assert "could not load tokenizer" not in out and "built-in ChatML" not in out


def test_the_preview_resolves_a_fetched_models_short_name_as_training_does(tmp_path, capsys, monkeypatch):
    from prompt_aug import sources

    monkeypatch.setenv(sources.HOME_ENV, str(tmp_path / "home"))
    _jsonl(tmp_path / "train.jsonl", [("What is 1 + 1?", "2")])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: smollm2-135m-instruct\nmax_prompt_length: 200\n")
    # Not fetched: the fetch command, not a network error and a fallback.
    with pytest.raises(
        SystemExit,
        match=r"^prompt-aug-data: error: model_name_or_path: 'smollm2-135m-instruct' is not fetched yet .*"
        r"run `python -m prompt_aug.models fetch smollm2-135m-instruct` first",
    ):
        data.main(["--dataset", str(tmp_path / "train.jsonl"), "--config", str(recipe)])
    with pytest.raises(SystemExit, match=r"error: --tokenizer: 'smollm2-135m-instruct' is not fetched"):
        data.main(["--dataset", str(tmp_path / "train.jsonl"), "--tokenizer", "smollm2-135m-instruct"])
    # Fetched: its folder's tokenizer renders, and the length limit applies.
    folder = sources.default_dir("smollm2-135m-instruct")
    builtin_tokenizer().save_pretrained(folder)
    (folder / sources.MARKER_FILE).write_text(sources.marker_text("smollm2-135m-instruct"))
    data.main(["--dataset", str(tmp_path / "train.jsonl"), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "could not load tokenizer" not in out and "built-in ChatML" not in out
    assert "not applied" not in out and "1 rows read, 1 kept" in out


def test_list_valued_answer_column_keeps_every_gold_any_of():
    import datasets

    from rewards import correctness_reward

    raw = datasets.Dataset.from_dict(
        {"question": ["q1", "q2", "q3"], "answer": [["\\frac{1}{2}", "0.5"], ["7"], ["", " "]]}
    )
    rows, dropped = to_rows(raw)
    assert rows["answer"] == [["\\frac{1}{2}", "0.5"], ["7"]]
    assert dropped["empty gold answer"] == 1
    # Training grades any of them, as evaluation does: the second gold of row 1 counts too.
    rewards = correctness_reward(["\\boxed{0.5}", "\\boxed{7}"], answer=rows["answer"])
    assert rewards == [1.0, 1.0]
    assert correctness_reward(["\\boxed{x}"], answer=[["a", "x"]]) == [1.0]


def test_mixed_single_and_list_golds_become_one_list_column():
    rows, _ = to_rows(datasets_from({"question": ["q1", "q2"], "answer": ["3", "4"]}))
    assert rows["answer"] == ["3", "4"]  # a plain column stays plain
    assert data.answer_form(["\\frac{1}{2}", "0.5"]) == "fraction"


def datasets_from(columns):
    import datasets

    return datasets.Dataset.from_dict(columns)


# -- Every column reaches the reward functions ---------------------------------------------------------


def test_other_columns_are_kept_under_their_names_for_the_kept_rows():
    raw = datasets_from(
        {
            "problem": ["q1", "q2", "", "q4"],
            "final_answer": ["1", "", "3", "4"],
            "difficulty": [1, 2, 3, 4],
            "tests": [["a"], ["b"], ["c"], ["d", "e"]],
        }
    )
    rows, dropped = to_rows(raw, "problem", "final_answer")
    # The question and gold columns become question and answer; the rest follow their rows.
    assert rows.column_names == ["question", "answer", "uid", "difficulty", "tests"]
    assert rows["question"] == ["q1", "q4"] and rows["difficulty"] == [1, 4]
    assert rows["tests"] == [["a"], ["d", "e"]]
    assert dropped["empty gold answer"] == 1 and dropped["empty question"] == 1


def test_the_report_names_the_question_and_gold_columns_and_what_else_reaches_the_rewards(tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        json.dumps({"problem": "What is 2 + 3?", "final_answer": "5", "difficulty": 2, "tags": ["add"]})
        + "\n"
        + json.dumps({"problem": "What is 2 + 4?", "final_answer": "6", "difficulty": 1, "tags": []})
        + "\n"
    )
    _, report = load_math_dataset(str(path), question_column="problem", answer_column="final_answer")
    assert str(report).splitlines()[1] == (
        "  columns: question <- 'problem', gold <- 'final_answer'; also to the rewards: difficulty (int64), "
        "tags (list of string)"
    )
    # The preview shows it, and the first question's gold beside its prompts.
    data.main(["--dataset", str(path), "--question_column", "problem", "--answer_column", "final_answer"])
    out = capsys.readouterr().out
    assert "columns: question <- 'problem', gold <- 'final_answer'" in out
    assert "first question (uid " in out and "its gold: '5'\n" in out
    # verl layout: the user turn of prompt, and the gold read from its struct, kept whole.
    frame = pd.DataFrame(
        {"prompt": [[{"role": "user", "content": "1 + 1?"}]], "reward_model": [{"ground_truth": "2"}]}
    )
    frame.to_parquet(tmp_path / "verl.parquet")
    _, report = load_math_dataset(str(tmp_path / "verl.parquet"))
    assert report.columns == (
        "question <- 'prompt' (its user turn), gold <- 'reward_model.ground_truth'; also to the rewards: "
        "reward_model (struct {ground_truth})"
    )


def test_repeated_questions_are_counted_in_a_note(tmp_path):
    from prompt_aug.data import mix_sources

    path = _jsonl(
        tmp_path / "dups.jsonl", [("What is 2+2?", "4"), ("What is 2+2?", "4"), ("What is 3+3?", "6")]
    )
    other = _jsonl(tmp_path / "other.jsonl", [("What is 3+3?", "6"), ("What is 5+5?", "10")])
    _, report = load_math_dataset(str(path))
    assert report.notes() == [
        "note: 1 question appears more than once (2 rows); each is trained as often as it appears"
    ]
    _, report = load_math_dataset(str(other))
    assert report.notes() == []
    # Across a mixture's sources, once.
    _, report = mix_sources(_mixture_read([{"path": str(path)}, {"path": str(other)}]))
    assert report.notes() == [
        (
            "note: 2 questions appear more than once (4 rows); each is trained as often as it appears "
            "(across the sources)"
        )
    ]


def test_the_math_layout_keeps_level_and_type_but_not_the_solution(tmp_path):
    path = tmp_path / "math.jsonl"
    pd.DataFrame(
        {"problem": ["Add 2 and 3."], "solution": ["$\\boxed{5}$"], "level": ["Level 3"], "type": ["Algebra"]}
    ).to_json(path, orient="records", lines=True)
    rows, _ = load_math_dataset(str(path), answer_column="solution")
    assert rows.column_names == ["question", "answer", "uid", "level", "type"]
    assert rows[0]["answer"] == "5" and rows[0]["type"] == "Algebra"


def test_the_verl_layout_keeps_its_other_columns(verl_dir):
    rows, _ = load_math_dataset(str(verl_dir))
    assert rows.column_names == [
        "question", "answer", "uid", "data_source", "ability", "reward_model", "extra_info"
    ]  # fmt: skip
    assert rows[0]["extra_info"] == {"index": "id-a", "original_source": "test"}
    # reward_model stays whole, as verl's own rewards read it.
    assert rows[0]["reward_model"] == {"ground_truth": "2", "style": "rule"}


def test_a_verl_layout_uid_column_gives_the_ids(tmp_path):
    frame = pd.DataFrame(
        {
            "prompt": [[{"role": "user", "content": f"{i} + 1?"}] for i in range(3)],
            "reward_model": [{"ground_truth": str(i + 1)} for i in range(3)],
            "uid": ["q0", "q1", "q2"],
        }
    )
    frame.to_parquet(tmp_path / "verl.parquet")
    rows, report = load_math_dataset(str(tmp_path / "verl.parquet"))
    assert rows["uid"] == ["q0", "q1", "q2"] and rows["answer"] == ["1", "2", "3"]
    assert rows.column_names == ["question", "answer", "uid", "reward_model"]
    frame.assign(uid=["q0", "q0", "q2"]).to_parquet(tmp_path / "verl.parquet")
    rows, report = load_math_dataset(str(tmp_path / "verl.parquet"))
    assert "q0" not in rows["uid"] and "value(s) of column 'uid' repeat (e.g. 'q0')" in str(report)


def test_a_struct_answer_column_keeps_the_struct_whole_for_the_rewards():
    raw = datasets_from(
        {"problem": ["p?", "q?"], "meta": [{"answer": "3", "level": 1}, {"answer": "4", "level": 2}]}
    )
    rows, dropped = to_rows(raw, "problem", "meta.answer")
    assert rows["answer"] == ["3", "4"] and rows.column_names == ["question", "answer", "uid", "meta"]
    assert rows["meta"] == [{"answer": "3", "level": 1}, {"answer": "4", "level": 2}]
    assert not dropped.notes
    # A struct whose name the rewards already receive is read, not kept, and the report says so.
    raw = datasets_from({"problem": ["p?"], "prompt": [{"gold": "3"}]})
    rows, dropped = to_rows(raw, "problem", "prompt.gold")
    assert rows["answer"] == ["3"] and rows.column_names == ["question", "answer", "uid"]
    assert dropped.notes == [
        (
            "column 'prompt' (the gold's 'prompt.gold') does not reach the rewards: its name is one they "
            "already receive; rename the column to keep it"
        )
    ]


def test_a_struct_answer_field_in_no_row_is_named_with_the_fields_there_are():
    raw = datasets_from({"problem": ["p?", "q?"], "meta": [{"origin": "a", "n": 1}, {"origin": "b", "n": 2}]})
    with pytest.raises(
        DataError,
        match=r"^answer column 'meta.ans': field 'ans' is in no row of column 'meta' "
        r"\(its fields: origin, n\); fix answer_column$",
    ):
        to_rows(raw, "problem", "meta.ans")
    # Mappings stored as JSON text: the keys the rows hold.
    raw = datasets_from({"problem": ["p?", "q?"], "meta": ['{"final": 5}', '{"final": 6, "src": "x"}']})
    with pytest.raises(
        DataError, match=r"field 'ans' is in no row of column 'meta' \(its fields: final, src\)"
    ):
        to_rows(raw, "problem", "meta.ans")


@pytest.mark.parametrize(
    "column, shadows",
    [
        ("question", "the question \\(read from 'problem'\\)"),
        ("prompt", "TRL's prompt"),
        ("template", "the format rules"),
        ("completions", "an argument TRL passes"),
        ("trainer_state", "an argument TRL passes"),
    ],
)
def test_a_column_that_would_shadow_a_reward_argument_stops_in_one_line(column, shadows):
    raw = datasets_from({"problem": ["q"], "answer": ["1"], column: ["x"]})
    with pytest.raises(DataError, match=f"^column '{column}': reward functions already receive {shadows}"):
        to_rows(raw, "problem")


def test_the_error_names_the_dataset_and_says_what_to_do(tmp_path):
    path = tmp_path / "d.jsonl"
    pd.DataFrame({"question": ["q"], "answer": ["1"], "uid": ["u"], "log_metric": [1]}).to_json(
        path, orient="records", lines=True
    )
    with pytest.raises(DataError) as err:
        load_math_dataset(str(path))
    assert "'log_metric'" in str(err.value) and "rename the column" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_recipes_sources_are_read_as_stored_and_each_failure_names_its_key(verl_dir):
    """`read_training_data`: a built-in set comes back as its rows; a folder as its split, columns untouched;
    a split with no file is a `SourceError` that starts with the recipe key and lists the files there; an
    uncached Hub id offline is named once."""
    from types import SimpleNamespace

    from prompt_aug.sources import SourceError, read_training_data

    def recipe(name: str, split: str = "train") -> SimpleNamespace:
        return SimpleNamespace(
            dataset_mixture=None, dataset_name=name, dataset_config=None, dataset_split=split, num_synthetic=7
        )

    (built,) = read_training_data(recipe("synthetic"), seed=0)
    assert built.builtin and len(built.data) == 7 and set(built.data[0]) >= {"question", "answer", "uid"}
    (stored,) = read_training_data(recipe(str(verl_dir)), seed=0)
    assert not stored.builtin and "reward_model" in stored.data.column_names  # not yet mapped to rows
    with pytest.raises(SourceError, match=rf"^dataset_name: no 'dev' file in {re.escape(str(verl_dir))}"):
        read_training_data(recipe(str(verl_dir), split="dev"), seed=0)
    with pytest.raises(SourceError) as err:  # offline (conftest): the Hub id is named once
        read_training_data(recipe("nobody/no-such-set"), seed=0)
    assert str(err.value).startswith(
        "dataset_name: Hub dataset 'nobody/no-such-set': not in the Hugging Face"
    )
    assert str(err.value).count("no-such-set") == 1


# -- Local files and folders: what is read, and a clear line when it cannot be -------------------------


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f'{{"question": "{q}", "answer": "{a}"}}\n' for q, a in rows))
    return path


def test_a_file_that_does_not_parse_is_named_with_the_parsers_complaint(tmp_path):
    _jsonl(tmp_path / "d" / "train-0.jsonl", [("q1", "1")])
    (tmp_path / "d" / "train-1.jsonl").write_text('{"question": "q2", "answer": "2"\n')  # no closing brace
    with pytest.raises(DataError) as err:
        load_math_dataset(str(tmp_path / "d"))
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'd' / 'train-1.jsonl'}: cannot be read: ") and "\n" not in message
    assert "JSON parse error" in message
    with pytest.raises(SystemExit, match=r"^prompt-aug-data: error: .*train-1.jsonl: cannot be read"):
        data.main(["--dataset", str(tmp_path / "d")])


def test_a_folder_with_files_of_two_types_for_a_split_is_refused_naming_them(tmp_path):
    _jsonl(tmp_path / "train.jsonl", [("q1", "1")])
    pd.DataFrame({"question": ["q2"], "answer": ["2"]}).to_parquet(tmp_path / "train.parquet")
    with pytest.raises(
        DataError, match=r"files of more than one type for one split \(train.jsonl, train.parquet\)"
    ):
        load_math_dataset(str(tmp_path))


def test_an_empty_data_file_is_one_line_naming_it(tmp_path):
    """An empty JSON Lines file (datasets raises a bare StopIteration for it) stops in one line."""
    empty = tmp_path / "questions.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=rf"^{re.escape(str(empty))}: holds no rows"):
        load_math_dataset(str(empty))


def test_a_truncated_save_to_disk_copy_is_one_line_naming_it(tmp_path):
    """A ``save_to_disk`` folder whose arrow file was cut short: one line naming the dataset and what
    datasets found, not pyarrow's traceback."""
    import datasets

    folder = tmp_path / "saved"
    datasets.Dataset.from_list([{"problem": "1 + 1?", "answer": "2"}]).save_to_disk(str(folder))
    for arrow in folder.glob("*.arrow"):
        arrow.write_bytes(b"cut")
    with pytest.raises(DataError, match=rf"^dataset '{re.escape(str(folder))}': not a readable save_to_disk "
                       r"folder \(ArrowInvalid: "):  # fmt: skip
        load_math_dataset(str(folder))


@pytest.mark.parametrize("name", ["my_questons.jsonl", "q.csv", "data/q.parquet"])
def test_a_data_file_name_is_a_local_path_even_when_it_is_missing(name, tmp_path, monkeypatch):
    from prompt_aug.sources import SourceError, check_source

    monkeypatch.chdir(tmp_path)  # offline (conftest): without the fix the Hub client would be asked
    with pytest.raises(SourceError, match=f"^dataset_name: no such file '{re.escape(name)}'"):
        check_source("dataset_name", name)
    with pytest.raises(DataError, match=f"^dataset '{re.escape(name)}': no such file"):
        load_math_dataset(name)


def test_offline_a_hub_dataset_not_in_the_cache_is_one_line():
    with pytest.raises(DataError) as err:
        load_math_dataset("nobody-here/no-such-questions")
    assert "not in the Hugging Face cache" in str(err.value) and "give a local path" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_lone_file_named_for_another_split_is_not_read_for_this_one(tmp_path):
    _jsonl(tmp_path / "named" / "train.jsonl", [("q1", "1")])
    with pytest.raises(DataError, match=r"no 'test' file .*train.jsonl is named for the 'train' split"):
        load_math_dataset(str(tmp_path / "named"), split="test")
    _jsonl(tmp_path / "plain" / "questions.jsonl", [("q1", "1")])  # named for no split: any split reads it
    assert len(load_math_dataset(str(tmp_path / "plain"), split="test")[0]) == 1


def test_a_subset_that_is_no_sub_folder_fails_listing_the_sub_folders(tmp_path):
    _jsonl(tmp_path / "hard" / "train.jsonl", [("hard one", "2")])
    _jsonl(tmp_path / "easy" / "train.jsonl", [("easy one", "3")])
    with pytest.raises(DataError, match=r"no sub-folder 'hadr' in .*; its sub-folders: \['easy', 'hard'\]"):
        load_math_dataset(str(tmp_path), config="hadr")
    assert load_math_dataset(str(tmp_path), config="hard")[0]["question"] == ["hard one"]
    # A folder with the split's own file is read as the subset, other sub-folders or not: the paper recipes
    # name SimpleRL-Zoo's subset, and a local copy of its files is such a folder.
    _jsonl(tmp_path / "train.jsonl", [("top", "1")])
    assert load_math_dataset(str(tmp_path), config="simplelr_qwen_level3to5")[0]["question"] == ["top"]


def test_a_hub_snapshot_folder_is_read_from_its_data_folder(tmp_path):
    (tmp_path / "data").mkdir()
    pd.DataFrame({"question": ["q1", "q2"], "answer": ["1", "2"]}).to_parquet(
        tmp_path / "data" / "train-00000-of-00001.parquet"
    )
    rows, _ = load_math_dataset(str(tmp_path))
    assert rows["question"] == ["q1", "q2"]


def test_number_golds_are_written_without_an_exponent_and_graded_as_numbers(tmp_path):
    # Python writes 0.00005 as 5e-05, which math-verify reads with Euler's e: golds are written in positional
    # digits, so 0.00005 is graded right and "e-5" wrong; numbers from a JSON file, a float32 parquet column
    # and exponent text alike.
    from prompt_aug.evaluation.benchmarks import normalize_gold
    from rewards.registry import correctness_reward

    path = tmp_path / "numbers.jsonl"
    path.write_text(
        '{"question": "a?", "answer": 0.00005}\n{"question": "b?", "answer": 1e16}\n'
        '{"question": "c?", "answer": "2.5e-7"}\n{"question": "d?", "answer": 142.0}\n'
    )
    golds = load_math_dataset(str(path))[0]["answer"]
    assert golds == ["0.00005", "10000000000000000", "0.00000025", "142"]
    pd.DataFrame({"question": ["e?"], "answer": pd.Series([0.1], dtype="float32")}).to_parquet(
        tmp_path / "f32.parquet"
    )
    assert load_math_dataset(str(tmp_path / "f32.parquet"))[0]["answer"] == ["0.1"]
    assert normalize_gold([5e-05, "1e-7"]) == ["0.00005", "0.0000001"]
    answers = ["\\boxed{0.00005}", "\\boxed{e-5}", "\\boxed{0.0000001}", "\\boxed{e-7}"]
    golds = ["5e-05", "5e-05", 1e-07, 1e-07]  # the gold as text in exponent form, and as a number
    assert correctness_reward(answers, answer=golds) == [1.0, 0.0, 1.0, 0.0]
    # An answer in exponent form is written in positional digits too: it still matches a gold written so.
    exponent = ["\\boxed{5e-05}", "\\boxed{6.02e23}", "\\boxed{5e-5}"]
    assert correctness_reward(exponent, answer=["5e-05", "6.02e23", 5e-05]) == [1.0, 1.0, 1.0]
    assert normalize_gold([10**400]) == [str(10**400)]  # an integer too large for a float stays whole


def test_when_no_row_is_usable_no_share_is_offered_and_the_columns_are_named(tmp_path):
    # Allowing 100% bad rows would leave nothing to train on: the columns are what to check.
    path = tmp_path / "numbers.jsonl"
    path.write_text('{"question": "a?", "answer": [1, {"x": 2}]}\n{"question": "b?", "answer": {"y": 1}}\n')
    with pytest.raises(
        DataError, match="^all 2 rows are unusable .*: check question_column and answer_column"
    ):
        load_math_dataset(str(path), max_bad_row_share=0.01)


def test_a_hub_snapshot_reads_its_rows_not_its_metadata_and_lists_its_subsets(tmp_path):
    # Older Hub repositories keep dataset_infos.json at the top and the rows under data/.
    snapshot = tmp_path / "snapshot"
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "dataset_infos.json").write_text(json.dumps({"default": {"features": {}}}))
    pd.DataFrame({"question": ["1+1?"], "answer": ["2"]}).to_parquet(snapshot / "data" / "train.parquet")
    rows, _ = load_math_dataset(str(snapshot))
    assert rows["question"] == ["1+1?"]
    # One folder per subset and none named: the error lists them and names the key.
    subsets = tmp_path / "subsets"
    for name in ("main", "socratic"):
        (subsets / name).mkdir(parents=True)
        pd.DataFrame({"question": ["q"], "answer": ["1"]}).to_parquet(subsets / name / "train.parquet")
    with pytest.raises(
        DataError, match=r"its sub-folders: \['main', 'socratic'\]\. Name one with dataset_config"
    ):
        load_math_dataset(str(subsets))
    assert load_math_dataset(str(subsets), config="main")[0]["answer"] == ["1"]


# -- Parts of a split, levels, empty files, previews and mixtures, as training reads them ------------------


def _mixture_read(sources: list[dict]):
    """A recipe's ``dataset_mixture`` of ``sources``, read as training reads it."""
    from types import SimpleNamespace

    from prompt_aug.mixture import dataset_mixture
    from prompt_aug.sources import read_training_data

    return read_training_data(SimpleNamespace(dataset_mixture=dataset_mixture({"datasets": sources})), seed=0)


def test_a_csv_source_mixes_with_a_json_source_whose_other_columns_have_the_same_types(tmp_path):
    # A CSV's question and gold columns are text (as written), its other columns keep pandas' types: an
    # integer column beside a JSON Lines source's integers is one column of the mixture, named gold by the
    # source's own answer_column included.
    from prompt_aug.data import mix_sources

    (tmp_path / "a.csv").write_text("problem,final,difficulty\nq1?,0012,3\nq2?,2,4\n")
    rows = [{"question": f"r{i}?", "answer": str(i), "difficulty": i} for i in range(3)]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = _mixture_read([{"path": str(tmp_path / "a.csv"), "answer_column": "final"},
                          {"path": str(tmp_path / "b.jsonl")}])  # fmt: skip
    mixed, _ = mix_sources(read)
    assert mixed.features["difficulty"].dtype == "int64"
    assert sorted(zip(mixed["answer"], mixed["difficulty"]))[:2] == [("0", 0), ("0012", 3)]


def test_a_part_of_a_split_is_read_from_a_file_and_a_folder_as_datasets_reads_it(tmp_path):
    from types import SimpleNamespace

    import datasets

    from prompt_aug.sources import SourceError, read_training_data

    rows = [(f"q{i}", str(i)) for i in range(10)]
    file = _jsonl(tmp_path / "q.jsonl", rows)
    assert load_math_dataset(str(file), split="train[:2]")[0]["question"] == ["q0", "q1"]
    _jsonl(tmp_path / "d" / "train.jsonl", rows)
    _jsonl(tmp_path / "d" / "test.jsonl", rows[:3])
    assert load_math_dataset(str(tmp_path / "d"), split="train[10%:]")[1].read == 9
    assert load_math_dataset(str(tmp_path / "d"), split="test[-1:]")[0]["question"] == ["q2"]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(
        [{"question": q, "answer": a} for q, a in rows]
    )}).save_to_disk(str(saved))  # fmt: skip
    assert load_math_dataset(str(saved), split="train[:30%]")[1].read == 3
    # A part datasets cannot read is one line naming the recipe key and the value.
    with pytest.raises(DataError, match=r"^split 'train\[:x\]': not a split datasets reads"):
        load_math_dataset(str(file), split="train[:x]")
    recipe = SimpleNamespace(
        dataset_mixture=None,
        dataset_name=str(file),
        dataset_config=None,
        dataset_split="train[:1",
        num_synthetic=0,
    )
    with pytest.raises(SourceError, match=r"^dataset_split 'train\[:1': not a split datasets reads"):
        read_training_data(recipe, seed=0)
    with pytest.raises(SourceError, match=r"^dataset_mixture.datasets\[0\].split 'train\[200%:\]': not a"):
        _mixture_read([{"path": str(file), "split": "train[200%:]"}])
    # Files hold one split each: joining two is refused in one line, not left to a parser's complaint.
    with pytest.raises(DataError, match=r"^split 'train\+test': splits are joined in a Hub dataset or a"):
        load_math_dataset(str(tmp_path / "d"), split="train+test")
    assert load_math_dataset(str(saved), split="train[:1]+train[-1:]")[1].read == 2  # datasets joins these


def test_levels_match_however_they_are_written_and_none_kept_lists_the_datas_levels(tmp_path):
    path = tmp_path / "math.jsonl"
    pd.DataFrame(
        {
            "problem": ["a?", "b?", "c?"],
            "solution": ["$\\boxed{1}$", "$\\boxed{2}$", "$\\boxed{3}$"],
            "level": ["Level 3", "Level 4", "Level 5"],
        }
    ).to_json(path, orient="records", lines=True)
    assert load_math_dataset(str(path), levels=["4", "5"])[0]["question"] == ["b?", "c?"]  # YAML's [4, 5]
    numbered = tmp_path / "numbered.jsonl"
    pd.DataFrame({"question": ["a?", "b?"], "answer": ["1", "2"], "level": [4, 5]}).to_json(
        numbered, orient="records", lines=True
    )
    assert load_math_dataset(str(numbered), levels=["Level 4"])[0]["question"] == ["a?"]
    rows, report = load_math_dataset(str(path), levels=["9"])
    assert len(rows) == 0
    assert "column 'level' holds 'Level 3', 'Level 4', 'Level 5' (fix dataset_levels)" in str(report)


def test_a_verl_source_in_a_mixture_is_read_as_verl_beside_top_level_columns_it_lacks(tmp_path, verl_dir):
    from prompt_aug.data import mix_sources

    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"problem": "What is 2 + 2?", "final_answer": "4"}) + "\n")
    read = _mixture_read([{"path": str(mine)}, {"path": str(verl_dir)}])
    rows, _ = mix_sources(read, "problem", "final_answer")
    assert rows["question"][:2] == ["What is 2 + 2?", "What is $1+1$?"] and len(rows) == 1 + 4
    assert rows["answer"][1] == "2"  # reward_model.ground_truth


def test_the_preview_reads_a_verl_mixture_source_beside_top_level_columns_it_lacks(
    tmp_path, verl_dir, capsys
):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"problem": "What is 2 + 2?", "final_answer": "4"}) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "question_column: problem\nanswer_column: final_answer\n"
        f"dataset_mixture:\n  datasets:\n    - path: {mine}\n    - path: {verl_dir}\n"
    )
    data.main(["--dataset", str(verl_dir), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "5 rows read, 4 kept" in out and "What is $1+1$?" in out
    data.main(["--dataset", str(mine), "--config", str(recipe)])
    assert "1 rows read, 1 kept" in capsys.readouterr().out
    # Columns named on the command line are read as named.
    with pytest.raises(SystemExit, match="question column 'problem' not found"):
        data.main(["--dataset", str(verl_dir), "--config", str(recipe), "--question_column", "problem"])


@pytest.mark.parametrize("name", ["empty.parquet", "empty.csv"])
def test_an_empty_parquet_file_or_a_csv_header_alone_holds_no_rows(tmp_path, name):
    path = tmp_path / name
    empty = pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)})
    empty.to_parquet(path) if name.endswith(".parquet") else path.write_text("question,answer\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: holds no rows \(an empty file\?\)"):
        load_math_dataset(str(path))
    # The same through a mixture source's data_files, read by datasets' builder.
    builder = "parquet" if name.endswith(".parquet") else "csv"
    with pytest.raises(Exception, match=r"^dataset_mixture.datasets\[0\].*: holds no rows \(an empty file"):
        _mixture_read([{"path": builder, "data_files": str(path)}])


def test_a_mixture_pattern_that_matches_no_file_is_named(tmp_path):
    from prompt_aug.mixture import dataset_mixture
    from prompt_aug.sources import SourceError, check_mixture

    pattern = str(tmp_path / "nothing" / "*.parquet")
    mixture = dataset_mixture({"datasets": [{"path": "parquet", "data_files": [pattern]}]})
    with pytest.raises(
        SourceError,
        match=rf"^dataset_mixture.datasets\[0\].data_files: pattern '{re.escape(pattern)}' matches no",
    ):
        check_mixture(mixture)
    _jsonl(tmp_path / "some" / "train.jsonl", [("q", "1")])
    check_mixture(
        dataset_mixture({"datasets": [{"path": "json", "data_files": str(tmp_path / "some" / "*")}]})
    )
    # A Hub id, with or without its owner, reads its files and patterns in its repository: not looked for.
    for hub_id in ("gsm8k", "openai/gsm8k"):
        for files in ("main/train-*.parquet", "main/train-00000-of-00001.parquet"):
            check_mixture(dataset_mixture({"datasets": [{"path": hub_id, "data_files": files}]}))
    # A local folder's are read in it, as datasets reads them.
    folder = str(tmp_path / "some")
    check_mixture(dataset_mixture({"datasets": [{"path": folder, "data_files": "train.jsonl"}]}))
    with pytest.raises(SourceError, match=rf"no such file 'test.jsonl' \(in {re.escape(folder)}\); fix"):
        check_mixture(dataset_mixture({"datasets": [{"path": folder, "data_files": "test.jsonl"}]}))


def test_the_preview_without_augmentation_asks_under_the_eval_template_alone(tmp_path, capsys):
    # Questions that fit the limit under qwen-math, the template training asks them under, but not under
    # the longest template of the bank.
    _verl_frame(VERL_ROWS).to_parquet(tmp_path / "d.train.parquet")
    tokenizer = builtin_tokenizer()
    (qwen_math,) = select_templates(load_templates(), ["qwen-math"])[0]
    limit = max(len(tokenizer(qwen_math.render(q, tokenizer)).input_ids) for q, _, _ in VERL_ROWS)
    assert filter_long_prompts(
        load_math_dataset(str(tmp_path))[0], list(load_templates().values()), tokenizer, limit
    )[1]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model_name_or_path: tiny-random-qwen2\nprompt_augmentation: false\neval_template: qwen-math\n"
        f"max_prompt_length: {limit}\n"
    )
    data.main(["--dataset", str(tmp_path), "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "5 rows read, 4 kept" in out and "prompt longer than" not in out
    assert out.count("----- template") == 1 and "----- template qwen-math -----" in out


@pytest.mark.parametrize(
    "rows, reason",
    [
        (
            [{"problem": "a?", "solution": "$\\boxed{1}$"}, {"problem": "b?", "solution": "1.\n2."}],
            "no \\boxed{}",
        ),
        ([{"question": "a?", "answer": 1.5}, {"question": "b?", "answer": float("nan")}], "NaN gold answer"),
    ],
)
def test_the_previews_golds_count_every_row_dropped_for_its_gold(tmp_path, capsys, rows, reason):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))  # a NaN as Python writes it
    data.main(["--dataset", str(path)])
    out = capsys.readouterr().out
    assert f"dropped 1: {reason}" in out
    assert "golds: 1 rows with a gold answer, 1 without one (dropped)" in out


def test_the_preview_says_when_training_would_stop_for_bad_rows(tmp_path, capsys):
    path = _jsonl(tmp_path / "q.jsonl", [("a?", "1"), ("b?", "2"), ("c?", "3"), ("d?", "")])
    data.main(["--dataset", str(path)])  # training's default max_bad_row_share, 0.05
    out = capsys.readouterr().out
    assert "4 rows read, 3 kept" in out and "answer forms:" in out  # the rest of the preview follows
    assert (
        "training would stop here: 25.0% of the 4 rows are unusable (1 empty gold answer in column 'answer' "
        "(rows 3); rows counted from 0), more than max_bad_row_share 0.05: fix the data, or allow them with "
        "--max_bad_row_share 0.25"
    ) in out
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_bad_row_share: 0.25\n")
    data.main(["--dataset", str(path), "--config", str(recipe)])
    assert "training would stop" not in capsys.readouterr().out
    data.main(["--dataset", str(path), "--max_bad_row_share", "0.25"])  # the flag the line above names
    assert "training would stop" not in capsys.readouterr().out


def test_mixture_sources_of_one_builder_or_one_file_are_reported_apart(tmp_path):
    from prompt_aug.data import mix_sources

    a = _jsonl(tmp_path / "a.jsonl", [("a1?", "1"), ("a2?", "2")])
    b = _jsonl(tmp_path / "b.jsonl", [("b1?", "1"), ("b2?", "")])
    read = _mixture_read([{"path": "json", "data_files": [str(a)]}, {"path": "json", "data_files": [str(b)]}])
    text = str(mix_sources(read, max_bad_row_share=0.5)[1])
    assert f"mixture of {a} (2 rows), {b} (1 rows)" in text
    assert f"dropped 1: {b}: empty gold answer" in text
    read = _mixture_read([{"path": str(b)}, {"path": str(b)}])  # the same file twice: by its recipe key
    text = str(mix_sources(read, max_bad_row_share=0.5)[1])
    for i in (0, 1):
        assert f"dropped 1: dataset_mixture.datasets[{i}] ({b}): empty gold answer" in text


# -- Golds as other layouts keep them ------------------------------------------------------------------


def test_a_gsm8k_answer_gives_its_final_answer_and_a_worked_one_without_any_is_dropped(tmp_path):
    from rewards import correctness_reward

    # openai/gsm8k's `answer`: the worked solution, then `#### <final answer>`.
    path = tmp_path / "gsm.jsonl"
    rows = [
        {"question": "How many clips?", "answer": "She sold 48/2 = <<48/2=24>>24.\n48+24 = 72\n#### 72"},
        {"question": "What is x?", "answer": "x = 3"},
        {"question": "Area?", "answer": "2 * 3 = 6.\nSo the area is $\\boxed{6}$."},
        {"question": "Sum?", "answer": "First add 3 and 4, as the question asks for their sum.\nThat makes "
         "seven, which is the number of apples in the basket now."},
        # A short answer over several lines (LaTeX's cases, a matrix) is a gold as it is.
        {"question": "Solve.", "answer": "\\begin{cases} x = 1 \\\\\n y = 2 \\end{cases}"},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    kept, report = load_math_dataset(str(path))
    assert kept["answer"] == ["72", "x = 3", "6", "\\begin{cases} x = 1 \\\\\n y = 2 \\end{cases}"]
    assert correctness_reward(["\\boxed{72}"], answer=kept["answer"][:1]) == [1.0]
    text = str(report)
    assert "note: 2 gold(s) of column 'answer' are worked solutions" in text
    assert "dropped 1: worked solution with no final answer (no `####` line, no \\boxed{})" in text
    assert "(rows 3, counted from 0)" in text


def test_a_class_label_answer_column_gives_its_label_names():
    import datasets

    labels = datasets.ClassLabel(names=["A", "B"])
    raw = datasets.Dataset.from_dict(
        {"question": ["1+1? A) 2 B) 3", "2+2? A) 3 B) 4", "3+3? A) 6 B) 7"], "answer": [0, 1, -1]},
        features=datasets.Features({"question": datasets.Value("string"), "answer": labels}),
    )
    rows, dropped = to_rows(raw)
    assert rows["answer"] == ["A", "B"] and dropped["empty gold answer"] == 1  # -1: no label
    several = datasets.Dataset.from_dict(
        {"question": ["1+1? A) 2 B) 2.0"], "answer": [[0, 1]]},
        features=datasets.Features({"question": datasets.Value("string"), "answer": datasets.List(labels)}),
    )
    assert to_rows(several)[0]["answer"] == [["A", "B"]]


def test_decimal_and_bool_golds_are_read_as_text(tmp_path):
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    golds = [decimal.Decimal("1.50"), decimal.Decimal("142.00"), decimal.Decimal("-0.05")]
    table = pa.table({"question": ["a?", "b?", "c?"], "answer": pa.array(golds, pa.decimal128(5, 2))})
    pq.write_table(table, tmp_path / "dec.parquet")
    rows, report = load_math_dataset(str(tmp_path / "dec.parquet"))
    assert rows["answer"] == ["1.5", "142", "-0.05"] and report.rows == 3  # as a float's would be
    path = tmp_path / "bool.jsonl"
    path.write_text(
        '{"question": "Is 7 prime?", "answer": true}\n{"question": "Is 8 prime?", "answer": false}\n'
    )
    rows, report = load_math_dataset(str(path))
    assert rows["answer"] == ["True", "False"] and report.rows == 2


def test_a_verl_gold_is_read_when_only_the_question_column_is_named_or_by_its_dotted_name(tmp_path):
    _verl_frame(VERL_ROWS[:2]).to_parquet(tmp_path / "d.train.parquet")
    for answer_column in (None, "reward_model.ground_truth"):
        rows, _ = load_math_dataset(str(tmp_path), question_column="prompt", answer_column=answer_column)
        assert rows["question"] == ["What is $1+1$?", "Compute $\\frac{1}{2}+\\frac{1}{3}$."]
        assert rows["answer"] == ["2", "\\frac{5}{6}"] and rows["uid"] == ["id-a", "id-b"]
    # A field of any column of mappings, stored as it is or as JSON text; the column itself is kept.
    raw = datasets_from(
        {"problem": ["p?", "q?"], "meta": [{"final": "3", "src": "x"}, {"final": "4", "src": "y"}]}
    )
    rows, _ = to_rows(raw, "problem", "meta.final")
    assert rows["answer"] == ["3", "4"] and rows.column_names == ["question", "answer", "uid", "meta"]
    raw = datasets_from({"problem": ["p?"], "meta": ['{"final": 5}']})
    assert to_rows(raw, "problem", "meta.final")[0]["answer"] == ["5"]
    with pytest.raises(DataError, match=r"^answer column 'info.final' not found; the dataset has columns"):
        to_rows(raw, "problem", "info.final")


def test_a_struct_column_whose_fields_differ_between_sources_has_each_field_none_where_a_source_lacks_it(
    tmp_path,
):
    # Two sources with other column names, and a `meta` column of mappings with other fields in each: one
    # column of every field, None in the rows of the source without it (as a column only some sources have).
    from prompt_aug.data import mix_sources

    first = [{"problem": "p?", "final_answer": "1", "meta": {"difficulty": 2, "topic": "algebra"}}]
    second = [{"q": "q?", "gold": "2", "meta": {"source": "olympiad", "difficulty": 5}}]
    for name, rows in (("a.jsonl", first), ("b.jsonl", second)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = _mixture_read(
        [
            {
                "path": str(tmp_path / "a.jsonl"),
                "question_column": "problem",
                "answer_column": "final_answer",
            },
            {"path": str(tmp_path / "b.jsonl"), "question_column": "q", "answer_column": "gold"},
        ]
    )
    mixed, _ = mix_sources(read)
    assert [(row["question"], row["answer"], row["meta"]) for row in mixed] == [
        ("p?", "1", {"difficulty": 2, "topic": "algebra", "source": None}),
        ("q?", "2", {"difficulty": 5, "topic": None, "source": "olympiad"}),
    ]
    # verl sources whose reward_model has its fields in another order, or fewer: kept, not left out.
    for name, models in (
        ("v1.parquet", [{"ground_truth": "3", "style": "rule"}]),
        ("v2.parquet", [{"style": "rule", "ground_truth": "4"}]),
        ("v3.parquet", [{"ground_truth": "5"}]),
    ):
        prompt = [[{"role": "user", "content": f"{name}?"}]]
        pd.DataFrame({"prompt": prompt, "reward_model": models}).to_parquet(tmp_path / name)
    read = _mixture_read([{"path": str(tmp_path / f"v{i}.parquet")} for i in (1, 2, 3)])
    mixed, report = mix_sources(read)
    assert mixed["answer"] == ["3", "4", "5"] and "left out" not in str(report)
    assert mixed["reward_model"] == [
        {"ground_truth": "3", "style": "rule"},
        {"ground_truth": "4", "style": "rule"},
        {"ground_truth": "5", "style": None},
    ]
    # A field of one name and two types still stops the load, naming the column.
    (tmp_path / "c.jsonl").write_text(json.dumps({"q": "r?", "gold": "3", "meta": {"difficulty": "hard"}}))
    read = _mixture_read(
        [
            {
                "path": str(tmp_path / "a.jsonl"),
                "question_column": "problem",
                "answer_column": "final_answer",
            },
            {"path": str(tmp_path / "c.jsonl"), "question_column": "q", "answer_column": "gold"},
        ]
    )
    with pytest.raises(
        DataError, match=r"^dataset_mixture: column 'meta' is \{'difficulty': Value\('int64'\)"
    ):
        mix_sources(read)


def test_a_json_column_of_mappings_mixes_with_a_struct_column_each_row_keeping_its_own_fields(tmp_path):
    # datasets reads a JSON Lines file whose mappings have other fields row to row as its Json type.
    from prompt_aug.data import mix_sources

    varying = [
        {"question": "a?", "answer": "1", "meta": {"x": 1}},
        {"question": "b?", "answer": "2", "meta": {"y": "z"}},
    ]
    (tmp_path / "varying.jsonl").write_text("".join(json.dumps(r) + "\n" for r in varying))
    (tmp_path / "fixed.jsonl").write_text(
        json.dumps({"question": "c?", "answer": "3", "meta": {"x": 4}}) + "\n"
    )
    for order in (["varying", "fixed"], ["fixed", "varying"]):
        mixed, _ = mix_sources(_mixture_read([{"path": str(tmp_path / f"{name}.jsonl")} for name in order]))
        assert sorted((row["question"], row["meta"]) for row in mixed) == [
            ("a?", {"x": 1}), ("b?", {"y": "z"}), ("c?", {"x": 4})
        ]  # fmt: skip


def test_naming_only_the_question_column_on_verl_data_reads_the_gold_and_drops_verls_prompt(verl_dir):
    # SimpleRL-Zoo's files hold the raw question beside verl's chat `prompt`: naming that column asks it
    # as written, the gold still from reward_model, and `prompt` (which the run writes) does not stop it.
    rows, report = load_math_dataset(str(verl_dir), question_column="question")
    assert rows["question"][:2] == ["What is $1+1$?", "Compute $\\frac{1}{2}+\\frac{1}{3}$."]
    assert rows["answer"] == ["2", "\\frac{5}{6}", "-2, 2", "\\text{Monday}"]
    assert "prompt" not in rows.column_names and "reward_model" in rows.column_names
    assert "question <- 'question', gold <- 'reward_model.ground_truth'" in str(report)
    rows, _ = load_math_dataset(
        str(verl_dir), question_column="question", answer_column="reward_model.ground_truth"
    )
    assert len(rows) == 4


def test_a_conversation_stored_as_json_text_gives_its_user_turn(tmp_path):
    # A CSV file keeps verl's chat `prompt` (like its reward_model) as JSON text: the question is its user
    # turn, not the text of the whole conversation, system turn and all.
    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 1+1? "}]
    frame = pd.DataFrame({"prompt": [json.dumps(turns)], "reward_model": [json.dumps({"ground_truth": "2"})]})
    frame.to_csv(tmp_path / "verl.csv", index=False)
    rows, _ = load_math_dataset(str(tmp_path / "verl.csv"))
    assert rows["question"] == ["What is 1+1?"] and rows["answer"] == ["2"]
    # A question that merely starts with a bracket is asked as written.
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "[1, 2] + [3] = ?", "answer": "3"}) + "\n")
    assert load_math_dataset(str(tmp_path / "q.jsonl"))[0]["question"] == ["[1, 2] + [3] = ?"]


def test_verl_data_written_to_csv_by_pandas_reads_its_questions_and_golds(tmp_path):
    # pandas and datasets write a list column of mappings as numpy's Python text, one mapping a line, and a
    # mapping column as Python text (single quotes): the rows read as the parquet's do.
    turns = [{"content": SYSTEM, "role": "system"}, {"content": "What is 1+1? ", "role": "user"}]
    rows = {"prompt": [turns], "reward_model": [{"ground_truth": "2", "style": "rule"}]}
    datasets.Dataset.from_dict(rows).to_csv(str(tmp_path / "verl.csv"))
    assert "}\n {" in (tmp_path / "verl.csv").read_text()  # numpy's layout, as the test means
    read, _ = load_math_dataset(str(tmp_path / "verl.csv"))
    assert read["question"] == ["What is 1+1?"] and read["answer"] == ["2"]
