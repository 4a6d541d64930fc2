"""`eagle3 drafters compare`: judge a candidate drafter on the probe sets (app/cli.py declares the arguments).

Exit status: 0 promote; 1 hold (a comparison was made and the rule holds the candidate); 2 the candidate was
refused (dead, not speculating, the production drafter itself, another target model or sampling, no
baseline to compare with) or a setting, rule or lineage record is wrong: one line per problem on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _say(lines: str, kind: str = "error") -> None:
    for line in lines.splitlines():
        print(f"eagle3 drafters compare: {kind}: {line}", file=sys.stderr)


def _write_json(path: Path, doc: dict) -> None:
    from ..storage import as_data_path

    as_data_path(path.resolve()).write_text(json.dumps(doc, indent=2) + "\n")  # atomic


def run(args: argparse.Namespace) -> int:
    from ..config import settings
    from ..generate.config import generation_config
    from ..generate.endpoint_info import AuthError, EndpointRefusedError, ModelRevisionError, NoEndpointError
    from ..ingest.spec import probe_source_names
    from ..profiles import ProfileError, resolve_profile
    from ..tokenize import PromptRenderer
    from ..urls import parse_endpoint_urls
    from .candidate import CandidateRefused
    from .compare import PROMOTE
    from .lineage import LineageError
    from .rule import RuleError, load_rule
    from .run import CANDIDATE_WAIT_S, CompareInputs, CompareRequest, compare_candidate
    from .text import comparison_table

    s = settings()
    try:
        rule = load_rule(s.storage.expectations_dir)
        urls = parse_endpoint_urls(args.candidate, source="--candidate")
        profile = resolve_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
        names = probe_source_names(s.storage.sources_dir)
        run_fields = {
            "max_new_tokens": args.max_new_tokens,
            "regen_seed": args.regen_seed,
            "probe_seed": args.probe_seed,
            "wait_for_endpoint_s": CANDIDATE_WAIT_S,
        }
        config = generation_config(profile, urls, s, run_fields, probe_sources=names)
    except (RuleError, ProfileError, ValueError) as e:
        _say(str(e))
        return 2
    if not names:
        _say(
            f"no role: probe source in {s.storage.sources_dir} (<EAGLE3_ASSETS_DIR>/sources): there is nothing to compare on"
        )
        return 2
    inputs = CompareInputs(
        data=s.storage.data_dir,
        lock_dir=s.storage.work_dir / "locks",
        rule=rule,
        probe_sources=frozenset(names),
        config=config,
        log=lambda line: print(line, file=sys.stderr),
        profile=profile,
        renderer=lambda: PromptRenderer(profile),  # probe conversations regenerated turn by turn only
    )
    request = CompareRequest(tuple(urls), args.baseline, args.trained_on)
    try:
        outcome = compare_candidate(inputs, request)
    except (CandidateRefused, LineageError, NoEndpointError, EndpointRefusedError, ModelRevisionError, AuthError) as e:
        _say(str(e), "refused")
        return 2
    print(comparison_table(outcome.doc))
    if args.json is not None:
        _write_json(args.json, outcome.doc)
        print(f"json -> {args.json}")
    print(f"stored -> {outcome.path}")
    if outcome.refused:
        _say(outcome.refused, "refused")
        return 2
    return 0 if outcome.decision == PROMOTE else 1
