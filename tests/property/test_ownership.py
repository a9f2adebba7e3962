"""Rendezvous ownership (F320 §2.1): determinism, spread, minimal remapping; epoch directory."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symcc_mpi.federation import ownership
from symcc_mpi.federation.ownership import lease_directory, new_epoch, owner

DIGESTS = [hashlib.sha256(f"fixed-{i}".encode()).hexdigest() for i in range(600)]

digests = st.binary(min_size=32, max_size=32).map(bytes.hex)
rank_sets = st.sets(st.integers(0, 64), min_size=1, max_size=8)


def test_600_fixed_digests_spread_roughly_evenly_over_three_masters():
    counts = Counter(owner(d, [0, 1, 2]) for d in DIGESTS)
    assert set(counts) == {0, 1, 2}
    assert all(160 <= n <= 240 for n in counts.values()), counts  # 200 ± 3 sigma (σ ≈ 11.5)


def test_the_owner_is_fixed_by_the_spec_formula():
    digest = DIGESTS[0]
    scores = {m: int.from_bytes(hashlib.sha256(b"symcc-work-owner-v1" + bytes.fromhex(digest)
                                               + m.to_bytes(4, "big")).digest()[:16], "big")
              for m in range(5)}
    assert owner(digest, range(5)) == max(scores, key=scores.get)


@settings(max_examples=200, deadline=None)
@given(digest=digests, masters=rank_sets, data=st.data())
def test_deterministic_whatever_the_order_or_repeats(digest, masters, data):
    order = data.draw(st.permutations(sorted(masters)))
    chosen = owner(digest, order)
    assert chosen in masters
    assert owner(digest, [*order, *order]) == chosen == owner(digest, sorted(masters))


@settings(max_examples=200, deadline=None)
@given(digest=digests, masters=rank_sets, newcomer=st.integers(0, 64))
def test_adding_a_master_moves_only_the_keys_it_wins(digest, masters, newcomer):
    before = owner(digest, sorted(masters))
    after = owner(digest, sorted(masters | {newcomer}))
    assert after in (before, newcomer)


@settings(max_examples=200, deadline=None)
@given(digest=digests, masters=rank_sets.filter(lambda s: len(s) > 1), data=st.data())
def test_removing_a_master_moves_only_its_own_keys(digest, masters, data):
    gone = data.draw(st.sampled_from(sorted(masters)))
    before = owner(digest, sorted(masters))
    after = owner(digest, sorted(masters - {gone}))
    if before != gone:
        assert after == before


def test_a_tie_goes_to_the_lower_rank(monkeypatch):
    monkeypatch.setattr(ownership, "_score", lambda digest, master: 7)
    assert owner(DIGESTS[0], [5, 2, 9]) == 2


@pytest.mark.parametrize("bad", ["abc", DIGESTS[0].upper(), DIGESTS[0] + "0", 7])
def test_a_bad_digest_is_refused(bad):
    with pytest.raises(ValueError):
        owner(bad, [0, 1])


def test_bad_master_lists_are_refused():
    for masters in ([], [-1], [2**32], [True]):
        with pytest.raises(ValueError):
            owner(DIGESTS[0], masters)


def test_epoch_and_its_directory(tmp_path):
    first, second = new_epoch(), new_epoch()
    assert len(first) == 32 and first != second
    path = lease_directory(tmp_path, first)
    assert path == tmp_path / f".standalone-work-{first.hex()}"
    for bad in (b"short", first.hex()):
        with pytest.raises(ValueError):
            lease_directory(tmp_path, bad)
