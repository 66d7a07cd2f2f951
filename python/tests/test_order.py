"""The sample order (traincoord.order): a permutation per epoch, identical to the C++ one."""

import json
from pathlib import Path

import pytest

from traincoord.order import SampleOrder

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "sample_order.json"


def test_matches_the_shared_vectors_the_cpp_client_checks_too():
    cases = json.loads(VECTORS.read_text())["cases"]
    assert len(cases) > 300
    for i, c in enumerate(cases):
        order = SampleOrder(c["samples"], c["batch_size"], c["seed"], c["set"], c["shuffle"])
        got = order.batch(c["epoch"], c["batch"])[:len(c["expected"])]
        assert got == c["expected"], f"case {i}: {c}"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 65, 1437])
def test_every_epoch_holds_every_sample_exactly_once(n):
    order = SampleOrder(n, 32, 9, "train")
    for epoch in range(3):
        samples = [s for b in range(order.batches) for s in order.batch(epoch, b)]
        assert sorted(samples) == list(range(n))


def test_epoch_shuffle_changes_membership_fixed_keeps_it_none_keeps_the_data_order():
    def epoch(order, e):
        return [order.batch(e, b) for b in range(order.batches)]
    per_epoch = SampleOrder(1000, 10, 1, "train", "epoch")
    fixed = SampleOrder(1000, 10, 1, "train", "fixed")
    assert epoch(per_epoch, 0) != epoch(per_epoch, 1)
    assert epoch(fixed, 0) == epoch(fixed, 5)
    assert SampleOrder(1000, 10, 1, "train", "none").batch(3, 7) == list(range(70, 80))


def test_a_batch_outside_the_set_is_an_error_not_an_empty_batch():
    order = SampleOrder(10, 4, 0, "train")
    assert len(order.batch(0, 2)) == 2
    with pytest.raises(IndexError, match="outside the set's 3 batches"):
        order.batch(0, 3)
    with pytest.raises(ValueError, match="shuffle must be one of"):
        SampleOrder(10, 4, 0, "train", "random")
