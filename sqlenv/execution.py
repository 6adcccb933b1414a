"""Execution accuracy (EX): whether a query's result equals the gold query's result.

An episode's EX is that of the agent's last QUERY that ran without error (no such QUERY: no match). It is
scored beside answer success because it is what published Spider results report: the comparison follows the
rules of test-suite-sql-eval's `result_eq` (Zhong et al., EMNLP 2020), with the answer verifier's typing for
the values:

* two empty results are equal, whatever their columns;
* otherwise the row counts and the widths must be equal;
* columns may come in any order: some permutation of the predicted columns must make the results equal;
* rows are compared as a multiset, and in order only when the gold SQL has a top-level ORDER BY;
* values compare as `sqlenv.verifier.cell_equal` compares them (integers exactly, other numbers within 1%,
  text case- and whitespace-insensitively), except that NULL equals only NULL.

The cost is bounded whatever the predicted query: results of different shapes are rejected at once, only
columns whose values match a gold column's are permuted, the search over orders is bounded (`MAX_PERMUTATIONS`),
and results too big for the column search (`MAX_PERMUTED_CELLS`) are compared in their own column order only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator, Sequence

from sqlenv.verifier import cell_equal, multiset_equal

__all__ = ["results_match", "value_equal", "MAX_PERMUTATIONS", "MAX_PERMUTED_CELLS"]

#: Column orders searched (x the width: steps of the search) before a result counts as different (test-suite-sql-eval
#: tries all; a bound keeps a hostile 30-column result from costing 30! comparisons).
MAX_PERMUTATIONS = 256
#: Column pairs x rows above which columns are compared in their own order only (the search over column orders
#: compares every predicted column with every gold column: width^2 x rows values).
MAX_PERMUTED_CELLS = 200_000


def value_equal(pred: Any, gold: Any) -> bool:
    """One predicted value against one gold value: NULL only equals NULL, the rest as `cell_equal`."""
    if pred is None or gold is None:
        return pred is None and gold is None
    return cell_equal(pred, gold)


def _rows_equal(pred: Sequence, gold: Sequence) -> bool:
    return len(pred) == len(gold) and all(value_equal(p, g) for p, g in zip(pred, gold))


def results_match(pred_rows: Sequence[Sequence], gold_rows: Sequence[Sequence], ordered: bool = False, *,
                  pred_count: int | None = None, gold_count: int | None = None) -> bool:
    """Whether a predicted result equals the gold result under test-suite-sql-eval's rules (module docstring).

    Args:
        pred_rows: the predicted query's rows (tuples of SQLite values).
        gold_rows: the gold query's rows.
        ordered: compare rows in order (pass whether the gold SQL has a top-level ORDER BY). Default False.
        pred_count, gold_count: the results' true row counts when the rows given were cut at a cap (the
            sandbox keeps at most `max_scoring_rows`); default the number of rows given.
    """
    n_pred = len(pred_rows) if pred_count is None else pred_count
    n_gold = len(gold_rows) if gold_count is None else gold_count
    if n_pred == 0 and n_gold == 0:
        return True
    if n_pred != n_gold or len(pred_rows) != len(gold_rows):
        return False
    width = len(gold_rows[0])
    if len(pred_rows[0]) != width:  # a result's rows all have its width (ragged rows simply never compare equal)
        return False
    if _identical(pred_rows, gold_rows, ordered):
        return True  # the same values: every query that returns the gold result as the gold SQL does, at C speed
    if multiset_equal(pred_rows, gold_rows, ordered, _rows_equal):
        return True  # the identity order with the verifier's typing
    if width < 2 or width * width * len(gold_rows) > MAX_PERMUTED_CELLS:
        return False
    pred_columns = list(zip(*pred_rows))
    gold_columns = list(zip(*gold_rows))
    # Gold column i may be read from predicted column j only when their values match as multisets.
    candidates = [[j for j, column in enumerate(pred_columns) if multiset_equal(column, gold_column, False, value_equal)]
                  for gold_column in gold_columns]
    identity = tuple(range(width))
    for order in _orders(candidates, MAX_PERMUTATIONS * width):
        if order == identity:
            continue
        moved = [tuple(row[j] for j in order) for row in pred_rows]
        if multiset_equal(moved, gold_rows, ordered, _rows_equal):
            return True
    return False


def _identical(pred_rows: Sequence[Sequence], gold_rows: Sequence[Sequence], ordered: bool) -> bool:
    """Whether the rows hold exactly the same values (in order when `ordered`), compared as Python compares them."""
    if ordered:
        return all(tuple(p) == tuple(g) for p, g in zip(pred_rows, gold_rows))  # same length: checked before
    try:  # SQLite rows are tuples already: hashed as they are
        return Counter(map(tuple, pred_rows)) == Counter(map(tuple, gold_rows))
    except TypeError:  # an unhashable value (not from SQLite): the typed comparison decides
        return False


def _orders(candidates: list[list[int]], budget: int) -> Iterator[tuple[int, ...]]:
    """Assignments of distinct predicted columns to the gold columns allowed by `candidates`, searched depth-first
    over at most `budget` partial assignments (dead ends count too, so no candidate pattern costs more)."""
    if any(not c for c in candidates):
        return
    chosen: list[int] = []
    left = [budget]

    def extend(i: int) -> Iterator[tuple[int, ...]]:
        if i == len(candidates):
            yield tuple(chosen)
            return
        for j in candidates[i]:
            if left[0] <= 0:
                return
            left[0] -= 1
            if j not in chosen:
                chosen.append(j)
                yield from extend(i + 1)
                chosen.pop()

    yield from extend(0)
