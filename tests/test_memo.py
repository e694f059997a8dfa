"""roofline.memo.IdentityMemo: made once per (objects by identity, key); another object equal
in value, or another key, is made again; the bound starts it afresh."""

from __future__ import annotations

from roofline.memo import IdentityMemo


def test_made_once_per_objects_and_key():
    calls = []
    memo = IdentityMemo(8)
    a, b = [1], [1]  # equal, not the same object

    def make(tag):
        calls.append(tag)
        return tag

    assert memo((a,), "k", lambda: make("a")) == "a"
    assert memo((a,), "k", lambda: make("again")) == "a"  # remembered
    assert memo((b,), "k", lambda: make("b")) == "b"  # by identity, not value
    assert memo((a,), "other", lambda: make("a2")) == "a2"
    assert calls == ["a", "b", "a2"] and len(memo) == 3


def test_the_bound_is_read_at_each_insertion():
    bound = {"n": 2}
    memo = IdentityMemo(lambda: bound["n"])
    objs = [object() for _ in range(3)]
    for o in objs:
        memo((o,), (), lambda: 1)
    assert len(memo) <= 2
    bound["n"] = 10
    for o in objs:
        memo((o,), (), lambda: 1)
    assert len(memo) == 3
    memo.clear()
    assert len(memo) == 0
