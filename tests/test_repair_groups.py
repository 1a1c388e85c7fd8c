"""The search's chunked shrink and the group-testing split, on a target whose truth is known by construction: a
set meets it exactly when it holds every node of a hidden needed set (monotone, as removing Q/DQ pairs mostly is)."""

from __future__ import annotations

import pytest

from workbench.repair import search as S
from workbench.repair.evaluate import BudgetExhausted
from workbench.repair.qdq_groups import _split


class _Outcome:
    def __init__(self, met: bool):
        self.met = met


class _Oracle:
    """Stands in for the Evaluator: the search only asks it whether a set meets the target, within a budget."""

    width = 1

    def __init__(self, needed: set[str], max_builds: int = 1000):
        self.needed, self.max_builds, self.builds, self.notes = needed, max_builds, 0, []
        self.asked: list[frozenset] = []

    def prefetch(self, sets) -> None:
        pass

    def evaluate(self, kept) -> _Outcome:
        if self.builds >= self.max_builds:
            raise BudgetExhausted
        self.builds += 1
        self.asked.append(frozenset(kept))
        return _Outcome(self.needed <= set(kept))


NAMES = [f"n{i}" for i in range(256)]


@pytest.mark.parametrize("needed", [{"n3"}, {"n3", "n200"}, {"n0", "n1", "n2", "n255"}, set(NAMES[100:140])])
def test_chunked_shrink_returns_exactly_the_needed_set(needed):
    oracle = _Oracle(needed)
    kept, minimal = S.shrink(oracle, list(NAMES))
    assert set(kept) == needed and minimal
    if len(needed) <= 4:  # chunks first: far fewer evaluations than one per node
        assert oracle.builds < len(NAMES) // 2, oracle.builds


def test_chunked_shrink_out_of_budget_keeps_what_it_proved():
    oracle = _Oracle({"n3", "n200"}, max_builds=6)
    kept, minimal = S.shrink(oracle, list(NAMES))
    assert not minimal and {"n3", "n200"} <= set(kept) and len(kept) < len(NAMES)
    assert oracle.needed <= set(kept)  # every set it returns still meets the target
    assert any("budget" in n for n in oracle.notes)


def test_search_grows_then_shrinks_to_the_needed_set():
    from types import SimpleNamespace

    oracle = _Oracle({"n10", "n11", "n90"})
    oracle.use_switch = lambda pool: False
    kept, minimal = S.search(oracle, list(NAMES), SimpleNamespace(met=False))
    assert set(kept) == {"n10", "n11", "n90"} and minimal


@pytest.mark.parametrize("n,parts", [(1, 8), (7, 8), (8, 8), (411, 8), (13, 2)])
def test_split_keeps_graph_order_and_every_node(n, parts):
    items = tuple(NAMES[:n])
    pieces = _split(items, parts)
    assert sum(pieces, ()) == items and all(pieces) and len(pieces) == min(n, parts)
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1


def test_search_starts_with_the_unit_group_testing_kept_whole():
    """``start``: the pool's first nodes are known to matter only together, so the first prefix tried holds them
    all (no builds on prefixes that split them)."""
    from types import SimpleNamespace

    oracle = _Oracle(set(NAMES[:6]))
    oracle.use_switch = lambda pool: False
    kept, minimal = S.search(oracle, list(NAMES), SimpleNamespace(met=False), start=6)
    assert oracle.asked[0] == frozenset(NAMES[:6])
    assert set(kept) == set(NAMES[:6]) and minimal
