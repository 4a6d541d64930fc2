"""The promotion rule, kept as data: `expectations/drafter_promotion.json`.

    {"name": "drafter_promotion", "meta": {"description": ...},
     "rule": {"margin": 0.05, "no_source_worse": true, "min_prompts": 20,
              "confidence": 0.95, "resamples": 2000, "seed": 20240611}}

`load_rule` reads and validates it: every problem is one line naming the file and the field, raised
together as a RuleError (a configuration mistake: `eagle3 drafters compare` exits 2 with them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RULE_FILE = "drafter_promotion.json"
RULE_NAME = "drafter_promotion"

# field -> what it means (docs/reference/gates.md is generated from these and the file's values)
RULE_FIELDS: dict[str, str] = {
    "margin": "tokens per verify step: the overall accept-length difference (candidate - production) must be at "
    "least this, with its interval above 0, to promote; a probe source whose interval is wider than this "
    "(half-width) cannot tell such a difference apart, and says how many prompts it would need",
    "no_source_worse": "true: a probe source whose interval lies below 0 (verdict worse) holds the candidate",
    "min_prompts": "fewest paired prompts (turns) a verdict may rest on: a probe source with fewer is reported as too "
    "few to decide, and so is the whole comparison (which then holds)",
    "confidence": "the interval's coverage, in (0.5, 1): 0.95 gives the 95% interval (`ci95`)",
    "resamples": "bootstrap resamples (100 to 100000)",
    "seed": "the bootstrap's seed (an integer >= 0): the same stored results give the same interval on any machine",
}


class RuleError(ValueError):
    """The promotion rule file is missing or wrong: one line per problem."""


@dataclass(frozen=True)
class PromotionRule:
    margin: float = 0.05
    no_source_worse: bool = True
    min_prompts: int = 20
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 20240611

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RULE_FIELDS}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _field_problems(rule: dict[str, Any]) -> list[str]:
    """One line per wrong value of the `rule` object (names the field and says what it must be)."""
    checks: dict[str, tuple[bool, str]] = {
        "margin": (_is_num(rule.get("margin")) and rule.get("margin", 0) > 0, "a number > 0"),
        "no_source_worse": (isinstance(rule.get("no_source_worse"), bool), "true or false"),
        "min_prompts": (_is_int(rule.get("min_prompts")) and rule.get("min_prompts", 0) >= 2, "an integer >= 2"),
        "confidence": (_is_num(rule.get("confidence")) and 0.5 < rule.get("confidence", 0) < 1, "a number in (0.5, 1)"),
        "resamples": (
            _is_int(rule.get("resamples")) and 100 <= rule.get("resamples", 0) <= 100_000,
            "an integer from 100 to 100000",
        ),
        "seed": (_is_int(rule.get("seed")) and rule.get("seed", -1) >= 0, "an integer >= 0"),
    }
    out = [f"field 'rule.{k}' is missing" for k in RULE_FIELDS if k not in rule]
    out += [
        f"field 'rule.{k}' is not a known field (one of {', '.join(RULE_FIELDS)})" for k in rule if k not in RULE_FIELDS
    ]
    out += [
        f"field 'rule.{k}': must be {what}, got {rule[k]!r}" for k, (ok, what) in checks.items() if k in rule and not ok
    ]
    return out


def parse_rule(raw: Any, *, source: str) -> PromotionRule:
    """The rule of a parsed JSON document; RuleError with one line per problem, each naming `source`."""
    if not isinstance(raw, dict):
        raise RuleError(f"{source}: must be a JSON object with a 'rule' object, got {type(raw).__name__}")
    rule = raw.get("rule")
    if not isinstance(rule, dict):
        raise RuleError(f"{source}: field 'rule' must be an object ({', '.join(RULE_FIELDS)})")
    problems = _field_problems(rule)
    if problems:
        raise RuleError("\n".join(f"{source}: {p}" for p in problems))
    return PromotionRule(**{k: rule[k] for k in RULE_FIELDS})


def load_rule(expectations_dir: Path | str) -> PromotionRule:
    """`<expectations_dir>/drafter_promotion.json`, validated."""
    path = Path(expectations_dir) / RULE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuleError(
            f"{path}: the promotion rule file is missing (EAGLE3_EXPECTATIONS_DIR names its folder)"
        ) from None
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise RuleError(f"{path}: not valid JSON: {e}") from None
    return parse_rule(raw, source=str(path))
