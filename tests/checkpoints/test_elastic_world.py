"""The helper's elastic sizing (``elastic_world``): what a trainer resumed on fewer ranks needs to keep
the run's global batch: accumulation steps, its slice of each global batch, its micro-batches."""

from __future__ import annotations

import pytest

from trainops.checkpoints.helper import ElasticSizeError, ElasticWorld, elastic_world


def env(world: int, rank: int = 0, original: int | None = None, **more: str) -> dict[str, str]:
    values = {"WORLD_SIZE": str(world), "RANK": str(rank), **more}
    if original is not None:
        values["TRAINOPS_ORIGINAL_WORLD_SIZE"] = str(original)
    return values


def test_on_the_original_size_nothing_changes():
    world = elastic_world(env(8, rank=5, original=8))
    assert not world.resized
    assert (world.dp_rank, world.dp_size, world.accumulation_steps, world.shard_growth) == (5, 8, 1, 1.0)
    assert world.micro_batches(32) == (32,)
    assert world.samples(0, 256) == range(160, 192)


def test_outside_trainops_the_current_size_is_the_original():
    assert elastic_world({}) == ElasticWorld(rank=0, world_size=1, original_world_size=1)
    assert elastic_world(env(4, rank=2)).accumulation_steps == 1


@pytest.mark.parametrize("original, now, steps", [(8, 4, 2), (8, 2, 4), (8, 1, 8), (6, 3, 2), (4, 4, 1)])
def test_accumulation_keeps_the_global_batch(original, now, steps):
    world = elastic_world(env(now, original=original))
    assert world.accumulation_steps == steps
    assert world.micro_batches(16) == (16,) * steps
    assert now * sum(world.micro_batches(16)) == original * 16  # the global batch is kept
    assert world.shard_growth == original / now


def test_a_size_that_does_not_divide_is_refused_naming_the_variables_and_the_nearest_sizes():
    world = elastic_world(env(6, rank=1, original=8, TRAINOPS_WORLD_SIZE="3", TRAINOPS_ORIGINAL_NODES="4"))
    with pytest.raises(ElasticSizeError) as raised:
        world.accumulation_steps  # noqa: B018
    message = str(raised.value)
    for text in (
        "WORLD_SIZE",
        "TRAINOPS_ORIGINAL_WORLD_SIZE=8",
        "TRAINOPS_WORLD_SIZE=3",
        "TRAINOPS_ORIGINAL_NODES=4",
    ):
        assert text in message
    assert "4 (accumulation 2) or 8" in message and "node counts that divide it: 1, 2, 4" in message
    assert isinstance(raised.value, ValueError)


def test_three_to_two_ranks_keeps_the_global_batch_with_smaller_micro_batches():
    for rank in (0, 1):
        world = elastic_world(env(2, rank=rank, original=3))
        assert world.micro_batches(32) == (24, 24)  # 2 x 48 = 3 x 32
    assert elastic_world(env(2, original=3)).micro_batches(10) == (8, 7)  # 2 x 15 = 3 x 10, none above 10
    with pytest.raises(ElasticSizeError, match="does not split evenly over 2 data-parallel ranks"):
        elastic_world(env(2, original=3)).micro_batches(7)  # 21 samples on 2 ranks


def test_every_sample_of_a_global_batch_goes_to_exactly_one_rank_before_and_after_the_resize():
    offset, batch = 4096, 96

    def taken(size: int, original: int) -> list[int]:
        return sorted(
            i for rank in range(size) for i in elastic_world(env(size, rank, original)).samples(offset, batch)
        )

    assert taken(4, 4) == taken(2, 4) == taken(1, 4) == list(range(offset, offset + batch))
    assert elastic_world(env(2, 1, 4)).samples(offset, batch) == range(offset + 48, offset + 96)


def test_model_parallel_ranks_of_one_replica_share_their_data():
    world = elastic_world(env(8, rank=5, original=16), model_parallel=2)  # 4 replicas of 2 ranks, was 8
    assert (world.dp_rank, world.dp_size, world.original_dp_size, world.accumulation_steps) == (2, 4, 8, 2)
    assert world.samples(0, 64) == elastic_world(env(8, rank=4, original=16), model_parallel=2).samples(0, 64)
    with pytest.raises(ValueError, match="model_parallel=4"):
        elastic_world(env(6, original=8), model_parallel=4)


@pytest.mark.parametrize(
    "values, name",
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "-1"}, "RANK"),
        ({"TRAINOPS_ORIGINAL_WORLD_SIZE": "8 ranks"}, "TRAINOPS_ORIGINAL_WORLD_SIZE"),
        ({"TRAINOPS_ORIGINAL_NODES": "x"}, "TRAINOPS_ORIGINAL_NODES"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "rank"),
    ],
)
def test_a_bad_variable_is_refused_by_name(values, name):
    with pytest.raises(ValueError, match=name):
        elastic_world(values)
