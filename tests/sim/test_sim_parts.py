"""The simulator's parts in-process (no server): how its modules depend on each other, the server state
that POST /_sim/faults and GET /_sim/stats change and report, and the small rules of the engine and the
/generate route."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import load_profile
from eagle3_dagster.sim import answer as A
from eagle3_dagster.sim import protocol as P
from eagle3_dagster.sim.admin import apply_fault_body, stats_payload
from eagle3_dagster.sim.cli import parse_args
from eagle3_dagster.sim.engine import Progress, decode_step
from eagle3_dagster.sim.generate_route import json_invalid, refused_progress
from eagle3_dagster.sim.state import Sim, reasoning_parser_name

SIM_DIR = PROJECT_ROOT / "eagle3_dagster" / "sim"
MODELS = PROJECT_ROOT / "assets" / "models"
# What the simulator may take from the rest of the package: the base (profiles, settings) and the tokenizer
# loader the pipeline uses, so the simulator reads a tokenizer folder exactly as the tokenize stage does.
OUTSIDE_ALLOWED = {"eagle3_dagster.profiles", "eagle3_dagster.config", "eagle3_dagster.tokenize.loading"}


def sim_imports(sim_dir: Path) -> dict[str, set[str]]:
    """Per module of the simulator package, the eagle3_dagster modules it imports (at any depth of the file)."""
    out: dict[str, set[str]] = {}
    for path in sorted(sim_dir.glob("*.py")):
        here = f"eagle3_dagster.sim.{path.stem}"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = "eagle3_dagster.sim" if node.level == 1 else "eagle3_dagster"
                mod = f"{base}.{node.module}" if node.module else base
                # `from . import protocol`: the names are modules
                found |= {f"{mod}.{a.name}" for a in node.names} if not node.module else {mod}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eagle3_dagster"):
                found.add(str(node.module))
        out[here] = found - {here}
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles among the modules of `graph` (each as the path that closes it)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, set()) & set(graph)):
            if state.get(dep) == 1:  # dep is on the path that led here
                walked = [*path, mod]
                cycles.append(walked[walked.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*path, mod])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    return cycles


def test_the_simulator_modules_import_each_other_without_a_circle():
    graph = sim_imports(SIM_DIR)
    assert {"eagle3_dagster.sim.state", "eagle3_dagster.sim.engine", "eagle3_dagster.sim.server"} <= set(graph)
    assert import_cycles(graph) == []


def test_the_simulator_takes_only_the_base_from_the_rest_of_the_package():
    outside = {
        f"{mod}: {dep}"
        for mod, deps in sim_imports(SIM_DIR).items()
        for dep in deps
        if not dep.startswith("eagle3_dagster.sim") and dep not in OUTSIDE_ALLOWED
    }
    assert outside == set()


def test_the_cycle_finder_finds_a_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) != []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _sim(*flags: str) -> Sim:
    args = parse_args(["--model", "qwen3", *flags])
    args.model_path = "Qwen/Qwen3-8B"
    return Sim(args, load_profile("qwen3", MODELS), tokenizer=None)


def test_a_fault_body_changes_the_faults_and_clear_returns_to_the_flags():
    sim = _sim("--token-latency-ms", "3", "--mode", "drop-think-end")
    sim.faults = apply_fault_body(sim, {"slow_tokens_ms": 50, "queue_full_burst": 2, "stall": 1})
    assert (sim.faults.slow_tokens_ms, sim.faults.queue_full_burst, sim.fleet.stall) == (50.0, 2, 1)
    sim.faults = apply_fault_body(sim, {"clear": True})
    assert (sim.faults.slow_tokens_ms, sim.faults.mode, sim.faults.queue_full_burst) == (3.0, "drop-think-end", 0)
    assert sim.fleet.stall == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"no_such_fault": 1}, "no_such_fault"),
        ({"mode": "bogus"}, "mode"),
        ({"health": "sleepy"}, "health"),
        ([], "object"),
    ],
)
def test_a_bad_fault_body_is_refused_naming_the_field(body, says):
    with pytest.raises(ValueError, match=says):
        apply_fault_body(_sim(), body)


def test_health_ok_ends_the_starting_period():
    sim = _sim("--starting-seconds", "600")
    assert sim.health_state() == "starting"
    sim.faults = apply_fault_body(sim, {"health": "ok"})
    assert sim.health_state() == "ok"


def test_the_stats_report_the_state_and_the_rids_only_when_asked():
    sim = _sim("--max-running-requests", "4")
    sim.stats.bump(sim.stats.rid_counts, "a")
    sim.stats.bump(sim.stats.rid_counts, "a")
    sim.stats.bump(sim.stats.rid_counts, "b")
    d = stats_payload(sim)
    assert (d["model"], d["rids_seen"], d["rids_repeated"], d["max_running_requests"]) == ("qwen3", 2, 1, 4)
    assert d["health"] == "ok" and "rid_counts" not in d
    assert stats_payload(sim, with_rids=True)["rid_counts"] == {"a": 2, "b": 1}


def test_the_reasoning_parser_follows_the_profile_unless_named():
    kimi, qwen = load_profile("kimi-k2.5", MODELS), load_profile("qwen3", MODELS)
    assert (reasoning_parser_name("auto", kimi), reasoning_parser_name("auto", qwen)) == ("kimi_k2", "qwen3")
    assert reasoning_parser_name("none", kimi) is None
    assert reasoning_parser_name("deepseek-r1", qwen) == "deepseek-r1"


def test_decode_steps_follow_the_stream_interval_or_the_token_latency():
    assert decode_step(100, 4, streaming=True, slow=False) == 4
    assert decode_step(100, None, streaming=True, slow=True) == 1
    assert decode_step(100, 4, streaming=False, slow=False) == 100  # one step: no time passes per token
    assert decode_step(640, None, streaming=False, slow=True) == 10  # 64 steps, a weight update can land between
    assert decode_step(10, None, streaming=False, slow=True) == 1
    assert decode_step(0, None, streaming=False, slow=False) == 1


def test_a_body_that_is_not_json_gets_fastapis_pydantic_error():
    e = json_invalid(7, "Expecting value")
    assert (e.status, e.kind) == (400, "pydantic")
    assert e.message == (
        "[{'type': 'json_invalid', 'loc': ('body', 7), 'msg': 'JSON decode error', 'ctx': {'error': 'Expecting value'}}]"
    )


@pytest.mark.parametrize(("status", "err_type"), [(400, "BadRequestError"), (503, None)])
def test_a_refusal_in_a_stream_finishes_the_item_as_an_abort(status, err_type):
    item = P.Item(rid="r1", input_ids=[1, 2, 3], sampling=P.Sampling(), index=0)
    pr = refused_progress(item, P.SimError(status, "The request queue is full.", "scheduler"))
    assert pr.produced == [] and pr.plan is None
    assert pr.finish_reason == {
        "type": "abort",
        "message": "The request queue is full.",
        "status_code": status,
        "err_type": err_type,
    }


def test_a_batch_rid_is_expanded_per_prompt_and_duplicates_are_refused_on_0_5_23():
    batch = {"input_ids": [[1, 2], [3, 4]], "rid": "x", "sampling_params": {"max_new_tokens": 4}}
    assert [it.rid for it in P.parse_generate(batch, P.V0_5_23).items] == ["x_0", "x_1"]
    single = P.parse_generate({"input_ids": [1, 2], "rid": ["y", "z"]}, P.V0_5_23)
    assert single.is_single and [it.rid for it in single.items] == ["y"]
    twice = {"input_ids": [[1], [2]], "rid": ["d", "d"]}
    with pytest.raises(P.SimError, match="Duplicate request IDs"):
        P.parse_generate(twice, P.V0_5_23)
    assert [it.rid for it in P.parse_generate(twice, P.V0_5_9).items] == ["d", "d"]
    with pytest.raises(P.SimError, match="Duplicate request ID detected: q"):
        P.parse_generate({"input_ids": [5], "rid": "q"}, P.V0_5_23, in_flight={"q"})


def test_parallel_samples_get_fresh_rids_and_must_agree_on_n():
    parsed = P.parse_generate({"input_ids": [1, 2], "rid": "r", "sampling_params": {"n": 3}}, P.V0_5_23)
    assert not parsed.is_single and [it.sample_index for it in parsed.items] == [0, 1, 2]
    assert len({it.rid for it in parsed.items}) == 3 and "r" not in {it.rid for it in parsed.items}
    mixed = {"input_ids": [[1], [2]], "sampling_params": [{"n": 1}, {"n": 2}]}
    with pytest.raises(P.SimError, match="parallel_sample_num"):
        P.parse_generate(mixed, P.V0_5_23)


def _progress(produced: list[int], **item_kw) -> Progress:
    item = P.Item(rid="r", input_ids=[7, 8, 9], sampling=P.Sampling(), index=0, **item_kw)
    return Progress(item, None, produced, None, 0, 0.0)


def test_a_delta_chunk_carries_only_the_new_tokens_logprobs():
    sim = _sim()
    pr = _progress([11, 12, 13, 14], return_logprob=True, top_logprobs_num=2)
    whole = A.logprob_fields(sim, pr)
    delta = A.logprob_fields(sim, pr, since=3)
    assert [e[1] for e in whole["output_token_logprobs"]] == [11, 12, 13, 14]
    assert delta["output_token_logprobs"] == whole["output_token_logprobs"][3:]
    assert (
        delta["output_top_logprobs"] == whole["output_top_logprobs"][3:] and len(delta["output_top_logprobs"][0]) == 2
    )
    assert delta["output_token_logprobs_length"] == 4  # a count, not a per-token list


def test_a_request_aborted_in_the_queue_reports_no_prompt_cache_or_retraction_figures_on_0_5_23():
    pr = _progress([])
    pr.queued_abort, pr.finish_reason = True, {"type": "abort", "message": "Abort in waiting queue"}
    m = A.meta(_sim(), pr, final=True, stream=False)
    assert {"id", "finish_reason", "weight_version", "completion_tokens", "e2e_latency"} <= set(m)
    assert not {"prompt_tokens", "cached_tokens", "num_retractions", "reasoning_tokens"} & set(m)
    assert m["weight_versions"] == [{"version": "default", "start": 0, "end": 0}]
