"""The template bank: 13 formats stored as data, rendered through the tokenizer's chat template."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prompt_aug.templates import TemplateError, check_renders, load_templates, select_templates

EXPECTED = {
    # name: (prefill, markers) as specified for the paper's bank
    "abel": ("Let's think step by step.\n", ()),
    "simplerl": ("", ()),
    "qwen-math": ("", ()),
    "open-r1": ("", ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")),
    "open-r1-teacher": ("<think>\n", ("\n</think>\n", "\n<answer>\n", "\n</answer>")),
    "deepseek-r1": ("", ("<think>", "</think>", "<answer>", "</answer>")),
    "deepseek-r1-teacher": ("<think>", ("</think>", "<answer>", "</answer>")),
    "formal": ("", ()),
    "lm_eval_prompt1": ("Let's think step by step", ("The final answer is:",)),
    "lm_eval_prompt4": ("", ("The final answer is:",)),
    "lm_eval_prompt8": ("Let's think step by step", ()),
    "reflective": (
        "",
        ("<solution>\n", "\n</solution>\n", "\n<check>\nLet's verify step by step", "\n</check>"),
    ),
    "reflective-teacher": (
        "<solution>\n",
        ("\n</solution>\n", "\n<check>\nLet's verify step by step", "\n</check>"),
    ),
}


def test_bank_has_the_13_formats_with_their_prefills_and_markers():
    bank = load_templates()
    assert list(bank) == list(EXPECTED)
    for name, (prefill, markers) in EXPECTED.items():
        assert bank[name].prefill == prefill, name
        assert bank[name].markers == markers, name
    tag_templates = {n for n in bank if n.startswith(("open-r1", "deepseek-r1"))}
    assert {n for n, t in bank.items() if t.answer == "tag"} == tag_templates


def test_qwen_math_keeps_the_official_system_prompt():
    qwen = load_templates()["qwen-math"]
    assert qwen.system == "Please reason step by step, and put your final answer within \\boxed{}."
    assert qwen.user == "{question}"


def test_every_template_renders_and_the_prefill_ends_the_prompt(tokenizer):
    bank = load_templates(tokenizer=tokenizer)
    question = "What is $\\frac{1}{2} + \\frac{1}{3}$? {not a slot}"
    for template in bank.values():
        text = template.render(question, tokenizer)
        assert question in text, template.name
        assert text.endswith("<|im_start|>assistant\n" + template.prefill), template.name
        if template.system:
            assert template.system in text


def _write(tmp_path, body: str):
    path = tmp_path / "bank.yaml"
    path.write_text(body)
    return path


def _chat_templated(tokenizer, chat_template: str):
    """A fresh copy of the tiny model's tokenizer with ``chat_template`` as its chat template."""
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = chat_template
    return copy


@pytest.mark.parametrize(
    "body, message",
    [
        ("- {name: a, user: 'no slot'}\n", "'a'"),
        ("- {name: b, user: '{question} and {question}'}\n", "'b'"),
        ("- {name: c, user: '{question}'}\n- {name: c, user: 'Q: {question}'}\n", "'c'"),
        ("- {name: d, user: '{question}', answer: xml}\n", "'d'"),
        ("- {name: e, user: '{question}', colour: red}\n", "'e'"),
        # Unquoted, YAML reads {question} as a mapping: the message says to quote it.
        ("- name: f\n  user: {question}\n", "'f'.*`user` must be text, got dict.*quote it"),
        ("- {name: g, user: '{question}', system: [one, two]}\n", "'g'.*`system` must be text, got list"),
        # A marker the prefill already holds would pay only a completion that repeats the prefill.
        (
            "- {name: h, user: '{question}', prefill: 'Key question:', markers: ['Key question:']}\n",
            r"'h'.*\['Key question:'\] are in the prefill",
        ),
        # ... and so would one that opens with the prefill and runs on past it.
        (
            "- {name: h2, user: '{question}', prefill: '<think>', markers: [\"<think>\\n\", '</think>']}\n",
            r"'h2'.*\['<think>\\n'\] are in the prefill",
        ),
        ("- {name: i, user: '{question}', markers: [Plan, Plan]}\n", r"'i'.*lists \['Plan'\] more than once"),
        ("- {name: k, user: '{question}', markers: '<think>'}\n", r"'k'.*got '<think>'; write it as a list"),
        ("- {name: j, user: '{question}', system: 'About {question}'}\n", r"'j'.*remove it from `system`"),
        # The name keys the template's metrics: null, empty, a list or a '/' would give odd keys.
        ("- {name: null, user: '{question}'}\n", "entry #0 has `name` None"),
        ("- {name: '', user: '{question}'}\n", "entry #0 has `name` ''"),
        (
            "- {name: a, user: '{question}'}\n- {name: [x], user: '{question}'}\n",
            r"entry #1 has `name` \['x'\]",
        ),
        ("- {name: a/b, user: '{question}'}\n", "entry #0 has `name` 'a/b'.*without '/'"),
        # `user:` with nothing after it is YAML's null: the template has no user turn.
        ("- name: e\n  user:\n", r"'e'.*missing `user`"),
    ],
)
def test_broken_templates_fail_naming_the_template(tmp_path, body, message):
    with pytest.raises(TemplateError, match=message):
        load_templates(_write(tmp_path, body))


def test_a_missing_templates_file_is_a_template_error_naming_the_key_and_where_it_looked(
    tmp_path, monkeypatch
):
    with pytest.raises(TemplateError, match=f"^templates_file: no such file {tmp_path / 'nope.yaml'} "):
        load_templates(tmp_path / "nope.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TemplateError) as err:
        load_templates("recipes/bank.yaml")
    resolved = tmp_path.resolve() / "recipes/bank.yaml"
    assert str(err.value) == (
        f"templates_file: no such file recipes/bank.yaml (resolved to {resolved}: "
        "a relative path is read from the folder the run is launched in); fix the path"
    )


def test_a_folder_as_templates_file_is_named_a_folder(tmp_path):
    with pytest.raises(TemplateError) as err:
        load_templates(tmp_path)
    assert str(err.value) == f"templates_file: {tmp_path} is a folder; give a YAML file of templates"


def test_a_template_the_tokenizer_cannot_render_is_named(tmp_path, tokenizer):
    strict = _chat_templated(
        tokenizer,
        (
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ raise_exception('no system turns') }}{% endif %}"
            "{{ m['content'] }}{% endfor %}"
        ),
    )
    path = _write(
        tmp_path, "- {name: plain, user: '{question}'}\n- {name: chatty, system: hi, user: '{question}'}\n"
    )
    with pytest.raises(TemplateError, match="'chatty'"):
        load_templates(path, tokenizer=strict)


def test_templates_are_checked_with_the_chat_template_kwargs_training_renders_with(tokenizer):
    switched = _chat_templated(
        tokenizer,
        (
            "{% if enable_thinking is not defined %}{{ raise_exception('no enable_thinking') }}{% endif %}"
            "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        ),
    )
    bank = load_templates()
    check_renders(bank.values(), switched, {"enable_thinking": False})
    with pytest.raises(TemplateError, match="no enable_thinking"):
        check_renders(bank.values(), switched)


def test_custom_bank_file_and_subset_with_weights(tmp_path, tokenizer):
    path = _write(
        tmp_path, "- {name: mine, user: 'Solve: {question}', prefill: 'Answer:', markers: ['Therefore']}\n"
    )
    bank = load_templates(path, tokenizer=tokenizer)
    assert (
        bank["mine"].render("2+2", tokenizer).endswith("Solve: 2+2<|im_end|>\n<|im_start|>assistant\nAnswer:")
    )
    chosen, weights = select_templates(load_templates(), ["qwen-math", "open-r1"], [1, 3])
    assert [t.name for t in chosen] == ["qwen-math", "open-r1"] and weights == [0.25, 0.75]
    with pytest.raises(TemplateError, match="nope"):
        select_templates(load_templates(), ["qwen-math", "nope"])
    with pytest.raises(TemplateError, match="2 templates"):
        select_templates(load_templates(), ["qwen-math", "abel"], [1.0])


def test_an_empty_templates_list_is_refused_not_read_as_the_whole_bank():
    """``templates: []`` (every entry commented out) is no choice of templates; leaving the key out draws
    from the whole bank."""
    with pytest.raises(TemplateError, match=r"^templates: the list is empty; name at least one template"):
        select_templates(load_templates(), [])
    assert len(select_templates(load_templates())[0]) == len(load_templates())


@pytest.mark.parametrize("weights", [[float("nan"), 1.0], [float("inf"), 1.0], [-1.0, 2.0], [0.0, 0.0]])
def test_template_weights_that_are_no_sampling_weights_are_refused_naming_the_key(weights):
    with pytest.raises(TemplateError, match=r"^template_weights must be finite non-negative"):
        select_templates(load_templates(), ["qwen-math", "abel"], weights)


@pytest.mark.parametrize("value", ["missing.jinja", "templates/chat", "~/no-such-folder/chat.jinja"])
def test_a_chat_template_path_that_is_not_there_is_named_as_a_missing_file(value):
    from prompt_aug.templates import chat_template_text

    resolved = Path(value).expanduser().resolve()
    with pytest.raises(TemplateError) as err:
        chat_template_text(value)
    assert str(err.value) == (
        f"chat_template: no such file {value!r} (resolved to {resolved}); give the path of a .jinja file, a "
        "named template (chatml) or the Jinja text"
    )


def test_a_chat_template_that_names_a_folder_says_so(tmp_path):
    from prompt_aug.templates import chat_template_text

    with pytest.raises(TemplateError, match=f"^chat_template: a folder '{re.escape(str(tmp_path))}'"):
        chat_template_text(str(tmp_path))


APPENDED_WITHOUT_DASH = (
    "- name: a\n  user: '{question}'\n  prefill: 'Let me see.'\n  markers: ['Plan:']\n\n"
    "  name: b\n  user: 'Q: {question}'\n"
)


@pytest.mark.parametrize(
    "body, message",
    [
        # A second template appended without its `- `: YAML reads one mapping whose keys repeat; the first
        # template would vanish and the second would inherit its prefill and markers.
        (
            APPENDED_WITHOUT_DASH,
            "line 6: template 'a' \\(from line 1\\) sets `name` twice; start each template with its own "
            + "`- name:` list item, or keep one `name`$",
        ),
        (
            "- name: c\n  user: '{question}'\n  system: 'Be brief.'\n  user: 'Q: {question}'\n",
            "line 4: template 'c' \\(from line 1\\) sets `user` twice",
        ),
    ],
)
def test_a_template_that_sets_a_field_twice_is_refused_naming_it_and_the_line(tmp_path, body, message):
    path = _write(tmp_path, body)
    with pytest.raises(TemplateError, match=f"^{re.escape(str(path))}: {message}"):
        load_templates(path)


def test_yaml_merge_keys_may_be_overridden_by_the_entrys_own_fields(tmp_path):
    base = "- &base {name: a, system: 'Box it.', user: '{question}'}\n"
    path = _write(tmp_path, base + "- {<<: *base, name: b, user: 'Q: {question}'}\n")
    bank = load_templates(path)
    assert (bank["b"].system, bank["b"].user) == ("Box it.", "Q: {question}")


def test_a_template_that_fails_to_render_says_how_to_get_past_it(tokenizer):
    # A chat template without system turns (Gemma's refuses them) cannot render most of the bank: the
    # refusal names the template and the keys that fix it.
    gemma_like = _chat_templated(
        tokenizer,
        (
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ raise_exception('System role not supported') }}{% endif %}"
            "{{ m['content'] }}{% endfor %}"
        ),
    )
    with pytest.raises(TemplateError) as err:
        check_renders(load_templates().values(), gemma_like)
    message = str(err.value)
    assert message.startswith(
        "template 'abel' failed to render with the tokenizer: System role not supported"
    )
    assert "`chat_template`" in message and "`templates`" in message
    forgetful = _chat_templated(tokenizer, "{% for m in messages %}{{ m['role'] }}{% endfor %}")
    with pytest.raises(TemplateError) as err:
        check_renders(load_templates().values(), forgetful)
    assert str(err.value).startswith("template 'abel': the rendered prompt lost the question")
    assert "`chat_template`" in str(err.value)


def test_a_chat_template_that_opens_think_itself_gets_no_second_one(tokenizer):
    # DeepSeek-R1 distills' chat templates end the generation prompt with "<think>\n": a teacher template's
    # "<think>" prefill is then already there, and the model must not see it twice.
    thinking = _chat_templated(
        tokenizer,
        (
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
        ),
    )
    bank = load_templates()
    for name in ("open-r1-teacher", "deepseek-r1-teacher"):
        text = bank[name].render("What is 1 + 1?", thinking)
        assert text.split("<|assistant|>")[-1] == "<think>\n", (name, text)
    # Another prefill still follows the generation prompt.
    text = bank["reflective-teacher"].render("What is 1 + 1?", thinking)
    assert text.endswith("<|assistant|><think>\n<solution>\n"), text
    plain = _chat_templated(tokenizer, thinking.chat_template.replace("<think>\n", ""))
    assert bank["deepseek-r1-teacher"].render("What is 1 + 1?", plain).endswith("<|assistant|><think>")
    # A question that ends with the prefill keeps it: the chat template's generation prompt did not add it.
    bare = _chat_templated(tokenizer, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    asked = "Solve 2x = 4. Let's think step by step."
    assert bank["abel"].render(asked, bare).endswith(f"{asked}\n{bank['abel'].prefill}")


def test_a_marker_the_chat_template_opens_is_not_asked_of_the_completion(tokenizer):
    """Under a chat template whose generation prompt ends with ``<think>`` (DeepSeek-R1 distills'), the
    completion continues the thought: a completion that follows open-r1 and deepseek-r1 otherwise gets their
    whole format reward, where asking for the marker again would cap it at 3/4 and teach the model to repeat
    it. Without that chat template every marker is asked."""
    from prompt_aug.collator import PromptAugmentationCollator
    from rewards.registry import format_reward

    thinking = _chat_templated(
        tokenizer,
        (
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
        ),
    )
    plain = _chat_templated(tokenizer, thinking.chat_template.replace("<think>\n", ""))
    bank = load_templates()
    followed = {
        "open-r1": "so 1 + 1\n</think>\n<answer>\n\\boxed{2}\n</answer>",
        "deepseek-r1": "so 1 + 1</think><answer>\\boxed{2}</answer>",
    }
    for name, completion in followed.items():
        (row,) = PromptAugmentationCollator([bank[name]], thinking)([{"question": "What is 1 + 1?"}])
        assert row["format_markers"] == list(bank[name].markers[1:]), name
        columns = {key: [row[key]] for key in ("template", "answer_rule", "format_markers")}
        assert format_reward([completion], **columns) == [1.0], name
        (row,) = PromptAugmentationCollator([bank[name]], plain)([{"question": "What is 1 + 1?"}])
        assert row["format_markers"] == list(bank[name].markers), name
        columns = {key: [row[key]] for key in ("template", "answer_rule", "format_markers")}
        assert format_reward([completion], **columns) == [0.75], name


def test_markers_a_generation_prompt_opens_and_closes_are_not_asked_nor_one_alone_kept(tokenizer):
    """Qwen3's chat template with thinking off ends the generation prompt with an empty ``<think>`` block:
    neither of its markers is asked of the completion (not the opening one alone). A question that ends
    with a marker asks for it still (only what the chat template adds counts), and so does a run without
    augmentation whose chat template opens ``<think>`` (TRL renders its prompts)."""
    from datasets import Dataset

    from prompt_aug.collator import PromptAugmentationCollator
    from prompt_aug.data import plain_prompts

    switched = _chat_templated(
        tokenizer,
        (
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not "
            "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
        ),
    )
    bank = load_templates()
    off = PromptAugmentationCollator(
        [bank["open-r1"]], switched, chat_template_kwargs={"enable_thinking": False}
    )
    (row,) = off([{"question": "What is 1 + 1?"}])
    assert row["prompt"].endswith("<|assistant|><think>\n\n</think>\n\n")
    assert row["format_markers"] == ["\n<answer>\n", "\n</answer>"]
    (row,) = PromptAugmentationCollator([bank["open-r1"]], switched)([{"question": "Say <think>\n"}])
    assert row["format_markers"] == list(bank["open-r1"].markers)
    thinking = _chat_templated(
        tokenizer, switched.chat_template.replace("{% if enable_thinking", "<think>\n{% if enable_thinking")
    )
    (row,) = plain_prompts(Dataset.from_list([{"question": "What is 1 + 1?"}]), bank["deepseek-r1"], thinking)
    assert row["format_markers"] == ["</think>", "<answer>", "</answer>"]


def test_an_evaluation_scores_the_format_under_the_markers_training_asks_for(tokenizer):
    """prompt-aug-eval and the evaluation during training grade a completion's format by the markers the
    chat template leaves to it, as training's rewards do: a completion that follows open-r1 after an R1
    distill's generation prompt (``<think>`` already written) has the whole format score."""
    from prompt_aug.evaluation.runner import score_completions
    from prompt_aug.templates import with_opened_markers

    thinking = _chat_templated(
        tokenizer,
        (
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
        ),
    )
    open_r1 = load_templates()["open-r1"]
    followed = "so 1 + 1\n</think>\n<answer>\n\\boxed{2}\n</answer>"
    (verdict,) = score_completions([followed], [["2"]], [with_opened_markers(open_r1, thinking)])
    assert verdict["format_score"] == 1.0 and verdict["correct"]
    (verdict,) = score_completions([followed], [["2"]], [with_opened_markers(open_r1, tokenizer)])
    assert verdict["format_score"] == 0.75  # ChatML opens nothing: <think> was the completion's to write
    broken = _chat_templated(tokenizer, "{{ raise_exception('no') }}")
    assert with_opened_markers(open_r1, broken) is open_r1  # rendering it says why, where it is rendered
