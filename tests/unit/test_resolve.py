"""The core's resolve step (``bcl_stream/training/resolve.py``): what every trainer gets.

- the fed length is min(``batch.max_seq_len``, the model's limit);
- the reader config follows the collate's layout and the trainer's accumulation (G_c under
  canonical ranks, whose physical accumulation is checked against the trainer's);
- ``max_seq_len`` stays in the config only where it cuts a record; the normalization path is
  ``plan`` (one planning row), ``all_reduce`` (a row per rank) or ``rescale`` (a cut record
  trains part of its tokens);
- ``open_training`` hands the decisions to the reader (config, step counts attached).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sft_records import records, write_sft_mds

from bcl_stream import (
    BatchOptions,
    PlanKnobs,
    ProcessLayout,
    TrainingContext,
    TrainingKnobs,
    open_training,
    resolve,
)
from bcl_stream.errors import DatasetError
from bcl_stream.io.index import read_index
from bcl_stream.records.source import RecordSource
from bcl_stream.training import reader_config
from bcl_stream.training.resolve import collate_processor, fed_max_seq_len

LONGEST = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sft_mds(tmp_path_factory.mktemp("sft") / "mds", records(48, longest=LONGEST))


def context(world: int = 2, per_node: int = 2, **kw: int | None) -> TrainingContext:
    return TrainingContext(
        process=ProcessLayout(rank=0, world_size=world, ranks_per_node=per_node), **kw
    )


def knobs(scope: str = "node", max_seq_len: int | None = None, **kw: object) -> TrainingKnobs:
    return TrainingKnobs(
        plan=PlanKnobs(pack_size=2, window=2, scope=scope),
        batch=BatchOptions(collate="padded", labels="unshifted", max_seq_len=max_seq_len),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("own", "model", "fed"),
    [(None, None, None), (30, None, 30), (None, 20, 20), (30, 20, 20), (10, 20, 10)],
)
def test_records_are_fed_at_most_the_lower_of_the_two_limits(
    own: int | None, model: int | None, fed: int | None
) -> None:
    assert fed_max_seq_len(knobs(max_seq_len=own), context(max_seq_len=model)) == fed


def test_the_reader_config_follows_the_collate_and_the_trainer() -> None:
    config = reader_config(knobs(), context(world=4, per_node=2, grad_accum=3))
    plan = config.plan
    assert (plan.layout, plan.world_size, plan.ranks_per_node, plan.grad_accum) == (
        "padded", 4, 2, 3,
    )  # fmt: skip
    canonical = knobs(canonical_ranks=4, canonical_grad_accum=2)
    assert reader_config(canonical, context(grad_accum=4)).plan.grad_accum == 2  # G_c
    with pytest.raises(ValueError, match=r"set accumulate_grad_batches=4 "):
        reader_config(canonical, context(grad_accum=3))  # G_c x V/R = 2 x 4/2


def test_a_limit_that_cuts_nothing_leaves_the_plan_of_untruncated_data(data: Path) -> None:
    index = read_index(data)
    whole = resolve(knobs(), context(), index)
    uncut = resolve(knobs(max_seq_len=LONGEST + 5), context(), index)
    assert uncut.config == whole.config and uncut.config.max_seq_len is None
    assert uncut.max_seq_len == LONGEST + 5  # the collate still truncates to it
    assert (whole.normalization, uncut.normalization) == ("plan", "plan")


@pytest.mark.parametrize(
    ("scope", "max_seq_len", "path"),
    [("node", None, "plan"), ("rank", None, "all_reduce"), ("node", 24, "rescale")],
)
def test_the_normalization_path(data: Path, scope: str, max_seq_len: int | None, path: str) -> None:
    resolved = resolve(knobs(scope, max_seq_len), context(), read_index(data))
    assert resolved.normalization == path
    assert resolved.step_loss_tokens == (path != "rescale")
    if max_seq_len is not None:  # a cut record trains part of its tokens: the index can't count
        assert resolved.config.max_seq_len == max_seq_len and resolved.truncation.records
        assert resolved.truncation.unknown_trained


def test_open_training_hands_the_decisions_to_the_reader(data: Path) -> None:
    single = context(world=1, per_node=1, grad_accum=2, max_seq_len=LONGEST + 5)
    training = open_training(data, knobs(), single)
    assert training.dataset.config.max_seq_len is None  # nothing cut: dropped
    assert training.dataset.step_loss_tokens and training.resolved.normalization == "plan"
    batch = next(iter(training.loader()))
    assert int(batch["step_loss_tokens"]) > 0
    cut = open_training(data, knobs(max_seq_len=24), single)
    assert cut.dataset.config.max_seq_len == 24 and not cut.dataset.step_loss_tokens
    assert next(iter(cut.loader()))["input_ids"].shape[1] <= 24


def test_a_reader_config_is_decided_before_the_reader_is_built(data: Path) -> None:
    """The reader's config is the one it was built with, fitted to its index: it cannot be
    assigned, and a resume (same layout) leaves the very same object in place. A different
    config is a different reader: only a canonical node size adopted from a cursor is built
    that way, from the same opened data; any other change is refused."""
    single = context(world=1, per_node=1, max_seq_len=LONGEST + 5)
    training = open_training(data, knobs(), single)
    dataset = training.dataset
    built = dataset.config
    assert built.max_seq_len is None  # fitted before construction: nothing is cut
    with pytest.raises(AttributeError):
        dataset.config = replace(built, seed=1)  # type: ignore[misc]
    loader = training.loader()
    next(iter(loader))
    state = loader.state_dict()
    again = training.loader()
    again.load_state_dict(state)
    assert again.plan_dataset is dataset and dataset.config is built
    with pytest.raises(ValueError, match="only canonical_ranks_per_node can be adopted"):
        dataset.with_canonical_layout(replace(built, seed=1))


def test_the_image_collate_takes_the_processor_the_records_are_read_with() -> None:
    """One processor directory is named once: ``batch.processor`` defaults to the records'
    ``tokens.processor``; two different ones are refused naming both."""
    read_with = RecordSource(processor="/models/vl")
    assert collate_processor(TrainingKnobs(tokens=read_with)) == "/models/vl"
    given = TrainingKnobs(tokens=read_with, batch=BatchOptions(processor="/models/vl"))
    assert collate_processor(given) == "/models/vl"
    assert collate_processor(TrainingKnobs(batch=BatchOptions(processor="/p"))) == "/p"
    assert collate_processor(TrainingKnobs()) is None
    other = TrainingKnobs(tokens=read_with, batch=BatchOptions(processor="/models/other"))
    with pytest.raises(
        DatasetError, match=r"batch\.processor='/models/other' but tokens\.processor"
    ):
        collate_processor(other)
