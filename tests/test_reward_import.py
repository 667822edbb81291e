"""A recipe can name a reward of its own by import path (``package.module:function``)."""

from __future__ import annotations

import pytest

from rewards.registry import correctness_reward, get_reward_funcs


def test_registered_names_and_import_paths_resolve():
    funcs = get_reward_funcs(["correctness", "rewards.registry:format_reward", "os.path:basename"])
    assert funcs[0] is correctness_reward
    assert funcs[1](["no tags"], template=["open-r1"]) == [0.0]
    assert funcs[2]("a/b") == "b"


@pytest.mark.parametrize(
    "name, message",
    [("correctnes", "unknown reward_funcs"), ("no_such_module:f", "no_such_module"),
     ("rewards.registry:nope", "nope"), ("rewards.registry:REGISTRY", "not a function")],
)  # fmt: skip
def test_bad_reward_names_are_named(name, message):
    with pytest.raises(ValueError, match=message):
        get_reward_funcs([name])
