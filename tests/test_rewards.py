"""What the rewards return for each format: right and wrong, lenient and strict, format scores."""

from __future__ import annotations

import numpy as np
import pytest

from prompt_aug.templates import load_templates
from rewards import REGISTRY, correctness_reward, extract_lenient, format_reward, grade

BOXED = "We add them: 3 + 4 = 7. So the result is \\boxed{7}."

# One well-formed completion per template (prefills are not part of the completion).
WELL_FORMED = {
    "abel": BOXED,
    "simplerl": BOXED,
    "qwen-math": BOXED,
    "formal": "By the definition of addition, 3 + 4 = 7. Hence \\boxed{7}.",
    "lm_eval_prompt1": ". 3 + 4 = 7.\nThe final answer is: \\boxed{7}",
    "lm_eval_prompt4": "3 + 4 = 7.\nThe final answer is: \\boxed{7}",
    "lm_eval_prompt8": ": 3 + 4 = 7, so \\boxed{7}.",
    "open-r1": "<think>\n3 + 4 = 7\n</think>\n<answer>\n\\boxed{7}\n</answer>",
    "open-r1-teacher": "3 + 4 = 7\n</think>\n<answer>\n\\boxed{7}\n</answer>",
    "deepseek-r1": "<think> 3 + 4 = 7 </think> <answer> \\boxed{7} </answer>",
    "deepseek-r1-teacher": " 3 + 4 = 7 </think> <answer> \\boxed{7} </answer>",
    "reflective": (
        "<solution>\n3 + 4 = 7\n</solution>\n<check>\nLet's verify step by step: 7 - 4 = 3.\n</check>\n"
        "\\boxed{7}"
    ),
    "reflective-teacher": (
        "3 + 4 = 7\n</solution>\n<check>\nLet's verify step by step: 7 - 4 = 3.\n</check>\n\\boxed{7}"
    ),
}


def test_every_template_has_a_case():
    assert set(WELL_FORMED) == set(load_templates())


@pytest.mark.parametrize("template", list(WELL_FORMED))
def test_well_formed_right_answer_scores_full_in_both_modes(template):
    for strict in (False, True):
        verdict = grade(WELL_FORMED[template], "7", template, strict=strict)
        assert verdict.correct and verdict.extracted == "7", (template, strict)
        assert verdict.format_score == 1.0


@pytest.mark.parametrize("template", list(WELL_FORMED))
def test_wrong_answer_in_the_right_format(template):
    verdict = grade(WELL_FORMED[template].replace("\\boxed{7}", "\\boxed{8}"), "7", template)
    assert not verdict.correct and verdict.extracted == "8"
    assert verdict.format_score == 1.0


def test_tag_format_partial_credit():
    # Missing the answer block: only the two think markers count (2 of 4).
    assert grade("<think>\nhm\n</think>\n\\boxed{7}", "7", "open-r1").format_score == 0.5
    # A marker that appears twice earns nothing.
    twice = "<think>\na\n</think>\n<think>\nb\n</think>\n<answer>\n\\boxed{7}\n</answer>"
    assert grade(twice, "7", "open-r1").format_score == 0.5
    # Teacher variants do not require the prefilled opening tag (3 markers, 1/3 each).
    assert grade("x\n</think>\nno answer block", "7", "open-r1-teacher").format_score == pytest.approx(1 / 3)


def test_prefilled_think_repeated_by_the_model_is_not_penalised_twice():
    # open-r1-teacher's prefill is "<think>\n"; the model writing another "<think>\n" does not touch its
    # markers.
    completion = "<think>\n3 + 4 = 7\n</think>\n<answer>\n\\boxed{7}\n</answer>"
    verdict = grade(completion, "7", "open-r1-teacher", strict=True)
    assert verdict.correct and verdict.format_score == 1.0


def test_final_answer_line_format():
    assert grade("so 7. The final answer is: \\boxed{7}", "7", "lm_eval_prompt4").format_score == 1.0
    assert grade("so \\boxed{7}", "7", "lm_eval_prompt4").format_score == 0.0
    both = "The final answer is: 6. Wait. The final answer is: \\boxed{7}"
    assert grade(both, "7", "lm_eval_prompt4").format_score == 0.0


def test_two_boxed_answers_the_last_one_counts():
    assert grade("first \\boxed{7} then \\boxed{9}", "9", "qwen-math").correct
    assert not grade("first \\boxed{7} then \\boxed{9}", "7", "qwen-math").correct
    assert not grade("first \\boxed{7} then \\boxed{9}", "7", "qwen-math", strict=True).correct


def test_answer_outside_the_tags():
    completion = "<think>\nso \\boxed{7}\n</think>\n<answer>\nseven\n</answer>"
    assert not grade(completion, "7", "open-r1", strict=True).correct  # strict: must be boxed inside <answer>
    assert grade(completion, "7", "open-r1").correct  # lenient: the last box before </answer>
    after = "<think>\nhm\n</think>\n<answer>\n8\n</answer> \\boxed{7}"
    assert not grade(after, "7", "open-r1").correct  # lenient cuts at </answer>
    assert not grade(after, "7", "open-r1", strict=True).correct


def test_lenient_fallbacks_that_strict_rejects():
    cases = [
        ("Therefore, the final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
        ("Adding up, the answer is 12 apples.", "12"),  # text after "the answer is", unit dropped
        ("We get 5, then 6, and finally 42", "42"),  # last number
    ]
    for completion, gold in cases:
        assert grade(completion, gold, "qwen-math").correct, completion
        assert not grade(completion, gold, "qwen-math", strict=True).correct, completion


def test_lenient_normalisation():
    assert grade("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}").correct
    assert grade("\\boxed{12\\text{ cm}}", "12").correct
    assert grade("\\boxed{x = 5}", "5").correct
    assert grade("\\boxed{0.5}", "\\frac{1}{2}").correct
    assert not grade("\\boxed{0.51}", "\\frac{1}{2}").correct


def test_stop_strings_cut_the_completion():
    assert not grade("\\boxed{3}<|im_end|> junk \\boxed{4}", "4").correct
    assert grade("\\boxed{3}<|im_end|> junk \\boxed{4}", "3").correct


def test_list_golds_any_match():
    assert grade("\\boxed{9.6}", ["9.6", "9.60"]).correct
    assert not grade("\\boxed{9}", ["9.6", "9.60"]).correct


def test_registry_functions_read_answer_and_template_columns():
    completions = [
        WELL_FORMED["open-r1"],
        "no tags, \\boxed{7}",
        "<think>\nx\n</think>\n<answer>\n\\boxed{5}\n</answer>",
    ]
    templates = ["open-r1", "open-r1", "open-r1"]
    assert REGISTRY["correctness"](completions, answer=["7"] * 3, template=templates) == [1.0, 1.0, 0.0]
    assert REGISTRY["strict_correctness"](completions, answer=["7"] * 3, template=templates) == [
        1.0,
        0.0,
        0.0,
    ]
    assert format_reward(completions, template=templates) == [1.0, 0.0, 1.0]
    # Chat-style completions, as TRL passes them for conversational prompts.
    chat = [[{"role": "assistant", "content": BOXED}]]
    assert correctness_reward(chat, answer=["7"], template=["qwen-math"]) == [1.0]


def test_a_missing_completion_is_empty_text():
    missing = [None, [], [{"role": "assistant", "content": None}], [{"role": "assistant"}]]
    assert format_reward(missing, template=["open-r1"] * 4) == [0.0, 0.0, 0.0, 0.0]
    assert format_reward(missing) == [1.0, 1.0, 1.0, 1.0]  # free-form: as for any text
    assert correctness_reward(missing, answer=["5"] * 4) == [0.0, 0.0, 0.0, 0.0]


def test_format_rule_columns_given_in_part_or_as_arrays_keep_their_markers():
    line = "The final answer is: 5"
    # A row's markers as an array (a parquet column) count as the list they hold.
    assert format_reward([line], format_markers=[np.array(["The final answer is:"])]) == [1.0]
    # Only answer_rule given: the built-in template's markers still count (none of open-r1's are here).
    assert format_reward(["\\boxed{5}"], template=["open-r1"], answer_rule=["tag"]) == [0.0]
    assert format_reward(["\\boxed{5}"], template=["qwen-math"], answer_rule=["boxed"]) == [1.0]
    # One string instead of a list of markers would be counted letter by letter: refused, naming the row.
    with pytest.raises(TypeError, match="format_markers: row 1 holds the text 'The final answer is:'"):
        format_reward([line, line], format_markers=[["The final answer is:"], "The final answer is:"])


def test_unparseable_gold_gives_none_and_is_counted():
    logged = {}
    rewards = correctness_reward(
        ["\\boxed{7}", "\\boxed{7}"], answer=["", "7"], template=["qwen-math"] * 2,
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )  # fmt: skip
    assert rewards == [None, 1.0]
    assert logged["rewards/unparseable_gold"] == 1.0
    verdict = grade("\\boxed{7}", "")
    assert verdict.gold_ok is False and verdict.correct is False


def test_a_recipe_can_name_a_reward_function_by_import_path():
    from rewards.controls import shuffled_correctness_reward
    from rewards.registry import get_reward_funcs

    funcs = get_reward_funcs(["correctness", "rewards.controls:shuffled_correctness_reward"])
    assert funcs == [correctness_reward, shuffled_correctness_reward]
    with pytest.raises(ValueError, match="rewards.controls:no_such_reward"):
        get_reward_funcs(["rewards.controls:no_such_reward"])
    with pytest.raises(ValueError, match="no_such_package.rewards:f"):
        get_reward_funcs(["no_such_package.rewards:f"])
    with pytest.raises(ValueError, match="correctnes"):
        get_reward_funcs(["correctnes"])


def test_shuffled_control_keeps_the_round_values_but_not_their_owners():
    from rewards.controls import shuffled_correctness_reward, shuffled_format_reward

    completions = [f"so \\boxed{{{i % 3}}}" for i in range(64)]
    answers = ["0"] * 64
    true = correctness_reward(completions, answer=answers)
    control = shuffled_correctness_reward(completions, answer=answers)
    assert sorted(control) == sorted(true)  # same values, so the logged mean is the true mean
    assert control != true
    assert control == shuffled_correctness_reward(completions, answer=answers)  # deterministic
    tagged = ["<think>\nx\n</think>\n<answer>\n\\boxed{1}\n</answer>"] * 8 + ["\\boxed{1}"] * 24
    fmt = shuffled_format_reward(tagged, template=["open-r1"] * 32)
    assert sorted(fmt) == sorted(format_reward(tagged, template=["open-r1"] * 32)) and fmt[:8] != [1.0] * 8


def test_lenient_minerva_form_reads_one_sentence():
    completion = "The final answer is $3$, wait no. The final answer is $5$. I hope it is correct."
    assert extract_lenient(completion) == "5"
    assert grade(completion, "5").correct
    assert extract_lenient("The final answer is $\\$18.90$. I hope it is correct.") == "18.90"


def test_lenient_answer_is_reads_to_the_end_of_its_sentence():
    assert extract_lenient("The final answer is 5. I hope it is correct.") == "5"
    assert extract_lenient("So the answer is **7**.") == "7"
    assert extract_lenient("So the answer is 3.25. Done") == "3.25"
    assert grade("The final answer is 5. I hope it is correct.", "5").correct
    assert grade("So the answer is **7**.", "7").correct
    # a full stop after an abbreviation does not end the sentence
    assert extract_lenient("The answer is St. Louis") == "St. Louis"
    assert extract_lenient("The answer is Mt. Everest. I hope it is correct.") == "Mt. Everest"


def test_lenient_last_number_keeps_a_unicode_minus():
    assert extract_lenient("so we get \u22125") == "-5"
    assert grade("so we get \u22125", "-5").correct
    assert not grade("so we get \u22125", "5").correct


@pytest.mark.parametrize(
    ("body", "failure"),
    [
        (
            "import no_such_dependency_here\n",
            "ModuleNotFoundError: No module named 'no_such_dependency_here'",
        ),
        ("def f(:\n", "SyntaxError: "),
        ("import os\nKEY = os.environ['NO_SUCH_KEY_HERE']\n", "KeyError: 'NO_SUCH_KEY_HERE'"),
        ("SCALE = float('')\n", "ValueError: could not convert string to float: ''"),
    ],
)
def test_a_reward_module_that_fails_as_it_imports_is_named_with_why(tmp_path, monkeypatch, body, failure):
    """The name is right and the module is there: what it raised, not how to write a name."""
    from rewards import get_reward_funcs

    name = f"my_failing_rewards_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as err:
        get_reward_funcs([f"{name}.f"])
    message = str(err.value)
    assert message.startswith(f"reward_funcs: '{name}.f': importing {name} failed ({failure}")
    assert "package.module" not in message and "\n" not in message


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TIME_LIMIT_S", "0", "grader time limit must be above 0 s, got 0.0 (PROMPT_AUG_GRADER_TIME_LIMIT_S"),
        ("TIME_LIMIT_S", "nan", "grader time limit must be above 0 s, got nan"),
        ("TIME_LIMIT_S", "2s", "PROMPT_AUG_GRADER_TIME_LIMIT_S='2s': give a number"),
        ("MEMORY_MB", "-1", "grader memory cap must be above 0 MiB, got -1 (PROMPT_AUG_GRADER_MEMORY_MB"),
        ("WORKERS", "two", "PROMPT_AUG_GRADER_WORKERS='two': give a whole number"),
    ],
)
def test_grader_limits_that_would_fail_every_answer_are_refused_naming_the_variable(
    name, value, message, monkeypatch
):
    # A time limit of 0 would have every pooled grade time out, and so score 0, without a word.
    from rewards.grading.pool import PoolConfig

    monkeypatch.setenv("PROMPT_AUG_GRADER_" + name, value)
    with pytest.raises(ValueError) as refused:
        PoolConfig.from_env()
    assert message in str(refused.value)


# Format scores of the authors' own function (verl/utils/reward_score/format_reward.py in
# wenquanlu/prompt-augmentation-GRPO, run on each text; their reflective_prompt names are our reflective).
AUTHORS_FORMAT_SCORES = [
    ("abel", "no box, no markers", 1.0),
    ("simplerl", "", 1.0),
    ("formal", "x", 1.0),
    ("lm_eval_prompt8", "x", 1.0),
    ("lm_eval_prompt1", "so \\boxed{7}", 0.0),
    ("lm_eval_prompt1", "The final answer is: \\boxed{7}", 1.0),
    ("deepseek-r1", "<think> a </think> \\boxed{7}", 0.5),
    ("deepseek-r1", "<think> a </think> <answer> 7 </answer> <answer>", 0.75),
    ("deepseek-r1-teacher", "a </think> <answer> 7", 2 / 3),
    ("deepseek-r1-teacher", "<think> a </think> <answer> 7 </answer>", 1.0),
    ("reflective", "<solution>\nx\n</solution>\n<check>\nok\n</check>", 0.75),
    ("reflective-teacher", "x\n</solution>\n\\boxed{7}", 1 / 3),
]


@pytest.mark.parametrize(("template", "completion", "authors"), AUTHORS_FORMAT_SCORES)
def test_each_templates_format_score_is_the_authors(template, completion, authors):
    assert grade(completion, "7", template).format_score == pytest.approx(authors)


def test_a_trl_reward_scores_no_row_whose_gold_is_missing():
    from rewards.registry import TRLConvention

    def lenient(completions, solution, **kwargs):  # scores every row it is given
        return [1.0] * len(completions)

    # As in the package's own rewards, a missing gold (None, an empty list, a list of None) is no score.
    rows = {"answer": [None, "4", [], [None], ["4", None]]}
    assert TRLConvention(lenient)(["4"] * 5, **rows) == [None, 1.0, None, None, 1.0]
    assert correctness_reward(["\\boxed{4}"] * 2, answer=[None, "4"]) == [None, 1.0]


@pytest.mark.parametrize("name", ["open-r1", "open-r1-teacher", "deepseek-r1", "deepseek-r1-teacher"])
def test_the_layout_a_tag_template_asks_for_scores_full_format(name):
    # The layout spelled out in the template's own system prompt, as the model would write it after the
    # prefill: its markers are the ones the prompt asks for.
    template = load_templates()[name]
    layout = template.system.split("Use this layout: " if "open-r1" in name else "i.e. ")[-1].rstrip(".")
    assert layout.startswith(template.prefill)
    completion = (
        layout[len(template.prefill) :].replace("answer here", "\\boxed{7}").replace("...", "\\boxed{7}")
    )
    assert format_reward([completion], template=[name]) == [1.0]
    assert grade(completion, "7", name, strict=True).correct
    # Each marker's tag left out (its newlines kept: they belong to the next marker too), or the marker
    # written twice, costs its share.
    share = 1 - 1 / len(template.markers)
    for marker in template.markers:
        left_out, twice = completion.replace(marker.strip(), "", 1), completion + marker
        assert format_reward([left_out, twice], template=[name] * 2) == [pytest.approx(share)] * 2, marker


def test_a_completion_of_content_blocks_is_read_as_its_text():
    blocks = [{"type": "text", "text": "so "}, {"type": "image"}, {"type": "text", "text": "\\boxed{7}"}]
    completion = [{"role": "assistant", "content": blocks}]
    assert correctness_reward([completion], answer=["7"]) == [1.0]
    tagged = [{"role": "assistant", "content": [{"type": "text", "text": WELL_FORMED["open-r1"]}]}]
    assert format_reward([tagged], template=["open-r1"]) == [1.0]


def _loop_reference(seq, max_period=64, min_repeats=3, min_span=16):
    """`trailing_loop` by its definition: for each period, shortest first, the longest tail in which every
    item equals the one a period before it; a loop where it spans min_repeats periods and min_span items."""
    for period in range(1, min(max_period, len(seq)) + 1):
        tail = period
        while tail < len(seq) and seq[-1 - tail] == seq[-1 - tail + period]:
            tail += 1
        if tail >= max(min_repeats * period, min_span):
            return period
    return 0


def test_a_trailing_loop_is_found_at_its_edges_and_as_its_definition_reads():
    import random

    from rewards.repetition import MIN_SPAN, ends_in_loop, trailing_loop

    assert trailing_loop([]) == 0 and trailing_loop("") == 0  # empty
    assert trailing_loop([7] * (MIN_SPAN - 1)) == 0 and trailing_loop([7] * MIN_SPAN) == 1  # the span's edge
    assert trailing_loop([1, 2, 3] * 5) == 0 and trailing_loop([1, 2, 3] * 5 + [1]) == 3  # 15 items, then 16
    assert trailing_loop([9] + [1, 2, 3, 4, 5, 6] * 3) == 6  # three copies exactly, 18 items
    assert trailing_loop([1, 2, 3, 4, 5, 6] * 2 + [1, 2, 3, 4, 5]) == 0  # two copies and a part: too few
    assert trailing_loop([1, 2] * 8 + [0]) == 0 and not ends_in_loop([1, 2] * 8 + [0])  # it ended
    rng = random.Random(0)
    for _ in range(3000):
        unit = [rng.randrange(3) for _ in range(rng.randint(1, 10))]
        head = [rng.randrange(3) for _ in range(rng.randint(0, 8))]
        seq = head + unit * rng.randint(0, 7) + unit[: rng.randint(0, len(unit))]
        options = {"max_period": rng.choice([2, 8, 64]), "min_repeats": rng.choice([2, 3]), "min_span": 8}
        assert trailing_loop(seq, **options) == _loop_reference(seq, **options), (seq, options)
