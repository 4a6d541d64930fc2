"""The interval between consecutive drafter versions on the probe sets (the report's per-version table).

Each version the fleet ran is compared with the one before it on the probe prompts both measured, the
way a candidate is (units.pair, compare.judge): the accept-length difference with its paired bootstrap
interval and verdict. Rates are left out (a version may have changed its draft budget).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..storage import PathLike
from .baseline import BaselineError, load_baseline
from .compare import judge
from .rule import PromotionRule
from .units import pair

log = logging.getLogger(__name__)


def consecutive_intervals(
    data: PathLike, drafter_ids: Sequence[str], sources: Sequence[str], rule: PromotionRule | None = None
) -> dict[str, dict[str, Any]]:
    """drafter_id -> its difference with the version before it (oldest first in `drafter_ids`): `difference`,
    `interval`, `verdict`, `prompts` (the prompts both measured); a version with no shared prompt is absent."""
    rule = rule or PromotionRule()
    out: dict[str, dict[str, Any]] = {}
    previous = None
    for drafter in drafter_ids:
        try:
            rows = load_baseline(data, drafter, sources).rows
        except BaselineError as e:
            log.warning("drafter %s: no probe rows to compare with its previous version: %s", drafter, e)
            previous = None
            continue
        if previous is not None:
            paired = pair(previous, rows)
            if paired.table.height:
                overall, _ = judge(paired, rule, rates_compared=False)
                out[drafter] = {
                    "difference": overall.length.difference,
                    "interval": [overall.length.lo, overall.length.hi],
                    "verdict": overall.verdict,
                    "prompts": overall.prompts,
                    "confidence": rule.confidence,
                }
        previous = rows
    return out
