"""Token-balanced micro-batches (`prompt_aug.balance`, `regroup(balance=True)`): each micro-batch keeps TRL's
row count, the costs spread less than in TRL's order, and one optimizer step's loss and gradients through
TRL's own loss (`compute_loss` of the trainer, float64 model, packed calls) are those of TRL's grouping for
dapo, grpo and dr_grpo; bnpo's per-micro-batch normaliser is why the trainer keeps TRL's grouping there.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from rows import padded_masks
from transformers import AutoModelForCausalLM, AutoTokenizer

from prompt_aug.balance import balanced_groups, row_cost, shared_cost, spread
from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.padding import long_tailed_lengths, regroup
from prompt_aug.trainer import PromptAugGRPOTrainer


def test_each_micro_batch_gets_its_row_count_and_every_row_goes_once():
    lengths = [50, 3000, 7, 800, 800, 120, 64, 2900, 5, 1]
    groups = balanced_groups(lengths, [4, 3, 3])
    assert [len(g) for g in groups] == [4, 3, 3]
    assert sorted(i for g in groups for i in g) == list(range(10))
    # The two longest rows go to different micro-batches, and the result does not change between calls.
    assert not any({1, 7} <= set(g) for g in groups)
    assert balanced_groups(lengths, [4, 3, 3]) == groups
    with pytest.raises(ValueError, match="10 rows cannot fill micro-batches of \\[4, 4\\] rows"):
        balanced_groups(lengths, [4, 4])
    assert row_cost(10, linear_weight=3) == 3 * 10 + 100
    assert spread([], []) == 1.0
    assert spread([2, 2], [[0, 1], []]) == 2.0


def test_balanced_micro_batches_spread_less_than_trls_on_long_tailed_lengths():
    """The paper's shape per process: 128 rows a round (prompts 100-300 tokens, completions long-tailed to
    3,072), micro-batches of 8, 4 per optimizer step; TRL's micro-batches are consecutive rows of the
    shuffled round. Largest micro-batch cost over the mean, per optimizer step, 5 rounds."""
    trl, balanced = [], []
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        prompts = torch.randint(100, 301, (128,), generator=generator)
        lengths = (prompts + torch.tensor(long_tailed_lengths(128, 3072, generator))).tolist()
        for step in range(4):
            rows = lengths[step * 32 : (step + 1) * 32]
            trl.append(spread(rows, [range(b * 8, (b + 1) * 8) for b in range(4)]))
            balanced.append(spread(rows, balanced_groups(rows, [8, 8, 8, 8])))
    assert all(b <= t + 1e-12 for b, t in zip(balanced, trl, strict=True))
    assert max(balanced) < 1.05 < sum(trl) / len(trl), (max(balanced), trl)


def test_rows_sharing_a_prompt_are_dealt_together_and_a_bundle_too_big_is_split_longest_first():
    # Rows 0-3 share prompt "a" (3 tokens): micro-batch 0 has room for three, its longest; row 3 is dealt
    # again on its own, with the lone rows.
    prompts = [("a", 3)] * 4 + [("b", 1), ("c", 1)]
    groups = balanced_groups([9, 8, 7, 6, 1, 1], [3, 3], linear_weight=0, prompts=prompts)
    assert groups == [[0, 1, 2], [3, 4, 5]]
    assert balanced_groups([9, 8, 7, 6, 1, 1], [3, 3], linear_weight=0) == [[0, 3, 5], [1, 2, 4]]
    # A row after the first of its prompt costs its own tokens, each seeing the whole row.
    assert shared_cost(10, 4, linear_weight=3) == 3 * 7 + 7 * 10
    assert shared_cost(10, 1, linear_weight=3) == row_cost(10, linear_weight=3)


def _tokens_run(groups: list[list[int]], lengths: list[int], prompts: list[tuple[int, int]]) -> int:
    """Tokens the micro-batches' packed calls run when each shares its prompts: a prompt's first P - 1
    tokens once per call, each row's remaining tokens."""
    total = 0
    for group in groups:
        seen: set[int] = set()
        for i in group:
            key, prompt = prompts[i]
            total += lengths[i] - (prompt - 1 if key in seen else 0)
            seen.add(key)
    return total


def test_dealing_prompts_together_runs_fewer_tokens_at_the_paper_shape():
    """128 rows a round in 16 groups of 8 sharing a prompt (100-300 tokens), completions long-tailed to
    3,072, shuffled as TRL shuffles a round, micro-batches of 8, 4 per optimizer step: a step holds about two
    rows of each group. Dealt with their prompts, every step's calls run fewer tokens than dealt by length
    alone, and no micro-batch costs more than 1.5 times the step's mean."""
    ratios = []
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        prompt = torch.randint(100, 301, (16,), generator=generator).repeat_interleave(8)
        lengths = prompt + torch.tensor(long_tailed_lengths(128, 3072, generator))
        order = torch.randperm(128, generator=generator)
        keys = torch.arange(16).repeat_interleave(8)[order].tolist()
        lengths, prompt = lengths[order].tolist(), prompt[order].tolist()
        for step in range(4):
            rows = slice(step * 32, (step + 1) * 32)
            step_lengths, prompts = lengths[rows], list(zip(keys[rows], prompt[rows], strict=True))
            plain = balanced_groups(step_lengths, [8, 8, 8, 8])
            shared = balanced_groups(step_lengths, [8, 8, 8, 8], prompts=prompts)
            ratios.append(
                _tokens_run(shared, step_lengths, prompts) / _tokens_run(plain, step_lengths, prompts)
            )
            costs = []
            for group in shared:
                firsts = {}
                for i in group:
                    firsts.setdefault(prompts[i][0], i)
                costs.append(
                    sum(
                        row_cost(step_lengths[i]) if firsts[prompts[i][0]] == i
                        else shared_cost(step_lengths[i], prompts[i][1])
                        for i in group
                    )
                )  # fmt: skip
            assert max(costs) <= 1.5 * sum(costs) / 4, (seed, step, costs)
    assert max(ratios) < 1 and sum(ratios) / len(ratios) < 0.95, ratios


def _batch(prompt_lengths, completion_lengths, width_p=6, width_c=12, vocab=100, seed=0) -> dict:
    rows = len(prompt_lengths)
    generator = torch.Generator().manual_seed(seed)
    prompt_mask, completion_mask = padded_masks(prompt_lengths, completion_lengths, width_p, width_c)
    return {
        "prompt_ids": torch.randint(5, vocab, (rows, width_p), generator=generator) * prompt_mask,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(5, vocab, (rows, width_c), generator=generator) * completion_mask,
        "completion_mask": completion_mask,
        "old_per_token_logps": (-5.0 + 0.3 * torch.randn(rows, width_c, generator=generator)).double(),
        "advantages": torch.randn(rows, generator=generator).double(),
    }


# One optimizer step of 4 micro-batches of 4 rows: real lengths 3-18, long ones bunched in micro-batch 0.
PROMPTS = [6, 5, 6, 4, 2, 3, 1, 2, 4, 1, 3, 2, 1, 2, 1, 3]
COMPLETIONS = [12, 11, 12, 10, 3, 2, 4, 1, 5, 2, 12, 3, 2, 1, 6, 4]


def _micro_batches(vocab: int) -> list[dict]:
    round_ = _batch(PROMPTS, COMPLETIONS, vocab=vocab)
    total = torch.tensor(float(sum(COMPLETIONS)))
    return [
        {**{k: v[i * 4 : (i + 1) * 4] for k, v in round_.items()}, "num_items_in_batch": total}
        for i in range(4)
    ]


def test_regroup_with_balance_keeps_sizes_and_rows_and_evens_the_tokens():
    batches = _micro_batches(vocab=100)
    out = regroup(batches, [[0, 1, 2, 3]], balance=True)
    assert [len(b["advantages"]) for b in out] == [4, 4, 4, 4]
    before = [int(b["prompt_mask"].sum() + b["completion_mask"].sum()) for b in batches]
    after = [int(b["prompt_mask"].sum() + b["completion_mask"].sum()) for b in out]
    assert sum(after) == sum(before) and max(after) - min(after) < max(before) - min(before)
    assert max(before) == 66 and max(after) <= 1.1 * sum(after) / 4, after  # 136 tokens: 34 a micro-batch
    # Rows carry their values: every (advantage, old log-probs of its real tokens) pair is still there.
    key = lambda b: sorted(
        (a, round(float(o[m.bool()].sum()), 9))
        for a, o, m in zip(
            b["advantages"].tolist(), b["old_per_token_logps"], b["completion_mask"], strict=True
        )
    )
    assert sorted(x for b in out for x in key(b)) == sorted(x for b in batches for x in key(b))
    # Without sort (a loss that depends on the micro-batch), balance moves nothing.
    kept = regroup(batches, [[0, 1, 2, 3]], sort=False, balance=True)
    assert [b["advantages"].tolist() for b in kept] == [b["advantages"].tolist() for b in batches]


def test_regroup_with_shared_prompts_deals_a_prompts_rows_into_one_micro_batch():
    batches = _micro_batches(vocab=100)
    # Rows 0 and 5 of the step, and rows 3 and 14, are completions of one prompt each (TRL shuffled them
    # apart: micro-batches 0 and 1, and 0 and 3).
    flat = [(j, r) for j in range(4) for r in range(4)]
    for a, b in ((0, 5), (3, 14)):
        (ja, ra), (jb, rb) = flat[a], flat[b]
        batches[jb]["prompt_ids"][rb] = batches[ja]["prompt_ids"][ra]
        batches[jb]["prompt_mask"][rb] = batches[ja]["prompt_mask"][ra]
    out = regroup(batches, [[0, 1, 2, 3]], balance=True, share_prompts=True)
    assert [len(b["advantages"]) for b in out] == [4, 4, 4, 4]
    where = {
        round(a, 9): j for j, b in enumerate(out) for a in b["advantages"].tolist()
    }  # each row found by its advantage
    advantage = lambda i: round(batches[flat[i][0]]["advantages"][flat[i][1]].item(), 9)
    assert where[advantage(0)] == where[advantage(5)] and where[advantage(3)] == where[advantage(14)]
    assert sorted(where) == sorted(round(a, 9) for b in batches for a in b["advantages"].tolist())
    plain = regroup(batches, [[0, 1, 2, 3]], balance=True)
    where_plain = {round(a, 9): j for j, b in enumerate(plain) for a in b["advantages"].tolist()}
    assert where_plain[advantage(0)] != where_plain[advantage(5)]  # not vacuous: by length alone they part


def _reward(completions, **kwargs):
    return [0.0 for _ in completions]


@pytest.fixture(scope="module")
def step_results(tiny_model_dir, tmp_path_factory):
    """Each loss type's optimizer step (summed loss, gradients) with TRL's grouping and balanced."""

    def run(loss_type: str) -> dict:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
        args = PromptAugGRPOConfig(
            output_dir=str(tmp_path_factory.mktemp(loss_type)), per_device_train_batch_size=4,
            num_generations=4, max_completion_length=12, report_to="none", use_cpu=True, bf16=False,
            loss_type=loss_type, beta=0.0, gradient_accumulation_steps=4, steps_per_generation=4,
            trim_padding="packed",
        )  # fmt: skip
        trainer = PromptAugGRPOTrainer(
            model=model, reward_funcs=_reward, args=args,
            train_dataset=Dataset.from_dict({"prompt": ["What is 1 + 1?"] * 4}),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        )  # fmt: skip
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 4
        batches = _micro_batches(model.config.vocab_size)
        results = {}
        for name, balance in (("trl", False), ("balanced", True)):
            grouped = regroup(batches, [[0, 1, 2, 3]], sort=balance, balance=balance)
            trainer.model.zero_grad(set_to_none=True)
            total = 0.0
            for batch in grouped:
                loss = trainer.compute_loss(trainer.model, batch)
                loss.backward()
                total += loss.item()
            grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
            results[name] = (total, grads, [b["advantages"].tolist() for b in grouped])
        assert trainer.padding_free.mode == "packed"
        return results

    cache: dict[str, dict] = {}
    return lambda loss_type: cache.setdefault(loss_type, run(loss_type))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_a_balanced_step_gets_trls_loss_and_gradients(step_results, loss_type):
    (loss, grads, rows), (want_loss, want_grads, want_rows) = (
        step_results(loss_type)[k] for k in ("balanced", "trl")
    )
    assert rows != want_rows  # not vacuous: rows moved between micro-batches
    # Nor a loss that carries no gradient: both groupings' steps would match at zero.
    assert want_loss != 0 and all(grad.norm() > 0 for grad in want_grads.values()), want_loss
    assert abs(loss - want_loss) <= 1e-6 * abs(want_loss), (loss, want_loss)
    assert grads.keys() == want_grads.keys() and grads
    for name, grad in want_grads.items():
        assert (grads[name] - grad).norm() <= 1e-6 * grad.norm() + 1e-12, name


def test_bnpo_is_why_the_trainer_keeps_trls_grouping_there(step_results):
    (loss, _, _), (want_loss, _, _) = (step_results("bnpo")[k] for k in ("balanced", "trl"))
    assert abs(loss - want_loss) > 1e-3 * abs(want_loss), (loss, want_loss)
