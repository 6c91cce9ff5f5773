"""The torchvision trainer's data stream (model_code/training/coco_dataset.py, IterationBatchSampler).

What DDP training needs from it, as tests/unit/test_training_detectron2.py asks of detectron2's
sampler: at every iteration the ranks take disjoint shares that together are the global batch
(the images one worker taking the whole batch would see), every epoch shows every image once, and
a sampler started at iteration k (a resumed job) yields what the uninterrupted one yields from k.
The two-host training test cannot see a rank training on the other's share: the gradients are
still averaged, the replicas stay identical and the AP bar is met on half the data.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from model_code.training.coco_dataset import IterationBatchSampler


def batches(size: int, *, global_batch: int, rank: int, world: int, seed: int, start: int = 0,
            stop: int) -> list[list[tuple[int, int]]]:
    sampler = IterationBatchSampler(size, global_batch=global_batch, rank=rank, world_size=world, seed=seed,
                                    start=start, stop=stop)
    out = list(sampler)
    assert len(out) == len(sampler) == stop - start
    return out


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    """(images, world, images per worker, seed, iterations): enough iterations for two or more epochs."""
    size = draw(st.integers(1, 23))
    world = draw(st.integers(1, 5))
    per_worker = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    epochs_worth = -(-2 * size // (world * per_worker))  # ceil: at least two full epochs of positions
    iterations = draw(st.integers(epochs_worth, epochs_worth + 5))
    return size, world, per_worker, seed, iterations


@given(runs())
def test_ranks_take_disjoint_shares_that_make_up_the_global_batch(run: tuple[int, int, int, int, int]) -> None:
    size, world, per_worker, seed, iterations = run
    global_batch = world * per_worker
    shards = [batches(size, global_batch=global_batch, rank=r, world=world, seed=seed, stop=iterations)
              for r in range(world)]
    single = batches(size, global_batch=global_batch, rank=0, world=1, seed=seed, stop=iterations)
    for it in range(iterations):
        assert all(len(shard[it]) == per_worker for shard in shards)
        positions = [p for shard in shards for _, p in shard[it]]
        # no position twice across ranks, and together exactly this iteration's slice of the stream
        assert sorted(positions) == list(range(it * global_batch, (it + 1) * global_batch)), (it, positions)
        # the same images at the same positions as one worker taking the whole batch: the world size
        # does not change what the job trains on (nor the flips, which follow the position)
        assert sorted(pair for shard in shards for pair in shard[it]) == sorted(single[it])
    # rank r takes the r-th contiguous slice of each global batch
    assert [[p for _, p in shard[0]] for shard in shards] == [
        list(range(r * per_worker, (r + 1) * per_worker)) for r in range(world)]


@given(runs())
def test_every_epoch_shows_every_image_once_across_the_ranks(run: tuple[int, int, int, int, int]) -> None:
    size, world, per_worker, seed, iterations = run
    pairs = [pair for r in range(world)
             for batch in batches(size, global_batch=world * per_worker, rank=r, world=world, seed=seed,
                                  stop=iterations)
             for pair in batch]
    image_at = dict((p, image) for image, p in pairs)
    assert len(image_at) == len(pairs)  # each position once, over all ranks and iterations
    full_epochs = len(pairs) // size
    assert full_epochs >= 2
    for epoch in range(full_epochs):
        assert sorted(image_at[p] for p in range(epoch * size, (epoch + 1) * size)) == list(range(size)), epoch


@given(runs(), st.data())
def test_a_sampler_started_at_iteration_k_continues_the_uninterrupted_stream(
        run: tuple[int, int, int, int, int], data: st.DataObject) -> None:
    size, world, per_worker, seed, iterations = run
    start = data.draw(st.integers(0, iterations), label="resume at")
    rank = data.draw(st.integers(0, world - 1), label="rank")
    kw = {"global_batch": world * per_worker, "rank": rank, "world": world, "seed": seed, "stop": iterations}
    whole = batches(size, **kw)
    assert batches(size, start=start, **kw) == whole[start:]


def test_each_epoch_is_shuffled_afresh_and_the_order_follows_the_seed() -> None:
    def epochs(seed: int) -> list[list[int]]:
        stream = batches(12, global_batch=4, rank=0, world=1, seed=seed, stop=9)  # three epochs of 12
        images = [image for batch in stream for image, _ in batch]
        return [images[e * 12:(e + 1) * 12] for e in range(3)]

    first = epochs(0)
    assert all(sorted(epoch) == list(range(12)) for epoch in first)
    assert len({tuple(epoch) for epoch in first}) == 3  # a new order each epoch
    assert first[0] != list(range(12))  # shuffled, not the file order
    assert epochs(0) == first and epochs(1) != first
