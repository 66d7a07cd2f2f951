"""Which samples make up a batch: a permutation of a set's samples, computed, never stored.

The coordinator hands out batch *indices*; a client turns batch b of an epoch into the samples
at positions [b * batch_size, (b + 1) * batch_size) of that epoch's sample order. The order is
one of

- ``"epoch"`` (default): a fresh permutation of the samples every epoch, from (seed, epoch,
  set) — what ``DistributedSampler(shuffle=True)`` with ``set_epoch`` gives, exactly once per
  sample per epoch;
- ``"fixed"``: one permutation for the whole run (batch membership never changes; only the
  batch order does, which the coordinator shuffles);
- ``"none"``: batch b holds the samples [b * batch_size, (b + 1) * batch_size) as they are in
  the data set (length-bucketed speech or text batches: sort the data set, then batch it).

The permutation is a keyed bijection of [0, 2^k) (four rounds of xor with a round key, a
multiplication by an odd constant and a xorshift, all modulo 2^k) restricted to [0, samples)
by cycle walking; 2^k < 2 * samples, so a walk averages under two steps. It is computed per
sample, never stored: O(1) memory whatever the set's size. The C++ client computes the very
same numbers (``traincoord::client::SampleOrder``); tests/vectors/sample_order.json pins both.

Speed: in pure Python one sample costs ~1-2 us (~50 us for a batch of 32), which a training
step of a tiny model notices. With numpy at hand, a set of at most CACHE_SAMPLES samples has
its whole epoch computed at once, vectorised (~0.3 ms for the digits set, ~60 ms for a million
samples), and kept for that epoch only: at most CACHE_SAMPLES * 8 bytes, then 0.1 us a sample.
"""

from __future__ import annotations

from typing import Any

try:
    import numpy
except ImportError:  # the client itself needs only the standard library
    numpy = None

CACHE_SAMPLES = 1 << 20

_M64 = (1 << 64) - 1
_TAG = 0x73616D706C657321  # "samples!": sample orders are independent of the batch order
_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93, 0x9E3779B97F4A7C15)
SHUFFLES = ("epoch", "fixed", "none")
_SETS = {"train": 0, "dev": 1}


def _mix64(x: int) -> int:
    """splitmix64's finaliser, as src/core/batch_order.cc."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class SampleOrder:
    """The sample order of one set: ``batch(epoch, b)`` lists the samples of batch b."""

    def __init__(self, samples: int, batch_size: int, seed: int, set_name: str,
                 shuffle: str = "epoch") -> None:
        if shuffle not in SHUFFLES:
            raise ValueError(f"shuffle must be one of {', '.join(SHUFFLES)}, got {shuffle!r}")
        if set_name not in _SETS:
            raise ValueError(f"set must be \"train\" or \"dev\", got {set_name!r}")
        if samples < 0 or batch_size < 1:
            raise ValueError(f"need samples >= 0 and batch_size >= 1, got {samples} and "
                             f"{batch_size}")
        self.samples, self.batch_size, self.shuffle = samples, batch_size, shuffle
        self._seed, self._set = seed & _M64, _SETS[set_name]
        bits = max(0, samples - 1).bit_length()
        self._mask = (1 << bits) - 1
        self._shift = max(1, (bits + 1) // 2)
        self._epoch: int | None = None
        self._keys: tuple[int, ...] = ()
        self._cached: tuple[int, Any] | None = None  # (epoch, its whole order) when cached

    @property
    def batches(self) -> int:
        return -(-self.samples // self.batch_size)

    def _round_keys(self, epoch: int) -> tuple[int, ...]:
        if self.shuffle == "fixed":
            epoch = 0
        if epoch != self._epoch:
            key = _mix64(_mix64(self._seed ^ _TAG) ^ _mix64((epoch * 2 + self._set) & _M64))
            self._keys = tuple(_mix64((key + r) & _M64) & self._mask for r in range(4))
            self._epoch = epoch
        return self._keys

    def position(self, epoch: int, p: int) -> int:
        """The sample at position p of the epoch's order. REQUIRES: 0 <= p < samples."""
        if self.shuffle == "none":
            return p
        return self._permute(self._round_keys(epoch), p)

    def _permute(self, keys: tuple[int, ...], x: int) -> int:
        mask, shift, n = self._mask, self._shift, self.samples
        while True:  # cycle walking: a bijection of [0, 2^k), restricted to [0, n)
            for key, multiplier in zip(keys, _MULTIPLIERS):
                x = ((x ^ key) * multiplier) & mask
                x ^= x >> shift
            if x < n:
                return x

    def batch(self, epoch: int, b: int) -> list[int]:
        """The samples of batch b in epoch `epoch`. Raises IndexError outside the set: an
        empty batch never reaches a model by accident."""
        if not 0 <= b < self.batches:
            raise IndexError(f"batch {b} is outside the set's {self.batches} batches "
                             f"({self.samples} samples in batches of {self.batch_size})")
        start, end = b * self.batch_size, min(self.samples, (b + 1) * self.batch_size)
        if self.shuffle == "none":
            return list(range(start, end))
        if numpy is not None and 1 < self.samples <= CACHE_SAMPLES:
            return self._epoch_order(epoch)[start:end].tolist()
        keys = self._round_keys(epoch)
        return [self._permute(keys, p) for p in range(start, end)]

    def _epoch_order(self, epoch: int) -> Any:
        """The whole order of the epoch as a numpy array (the same numbers as _permute)."""
        if self.shuffle == "fixed":
            epoch = 0
        cached = self._cached
        if cached is not None and cached[0] == epoch:
            return cached[1]
        keys = [numpy.uint64(k) for k in self._round_keys(epoch)]
        multipliers = [numpy.uint64(m) for m in _MULTIPLIERS]
        mask, shift, n = (numpy.uint64(self._mask), numpy.uint64(self._shift),
                          numpy.uint64(self.samples))
        x = numpy.arange(self.samples, dtype=numpy.uint64)
        todo = numpy.arange(self.samples)  # positions whose walk is not done
        values = x
        while len(todo):
            for key, multiplier in zip(keys, multipliers):
                values = ((values ^ key) * multiplier) & mask  # uint64 arrays wrap mod 2^64
                values ^= values >> shift
            x[todo] = values
            walking = values >= n
            todo, values = todo[walking], values[walking]
        self._cached = (epoch, x)
        return x
