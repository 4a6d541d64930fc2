"""Plan vs actual: what the last `eagle3 plan` said next to what the tables now hold.

Actual figures, from the stored tables only:
- prompts: rows of prompts/prompts.parquet; prompt tokens: sum of prompt_len over tokenized_prompts;
- requests generated: generation rows stored since the plan was made (generated_at >= the plan's
  created_at), their output tokens (completion_tokens) and the time they took (from the first
  request's start, generated_at - e2e_latency, to the last answer).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from ..storage import DataPath, parquet_file, parquet_num_rows, scan_parquet


def _prompt_tokens(data: DataPath) -> int | None:
    files = data.joinpath("tokenized_prompts").glob("shard=*/part-*.parquet")
    if not files:
        return None
    return sum(int(parquet_file(f).read(columns=["prompt_len"]).column("prompt_len").to_numpy().sum()) for f in files)


def _generated_since(data: DataPath, since: dt.datetime) -> dict[str, Any] | None:
    files = data.joinpath("generations").glob("shard=*/part-*.parquet")
    if not files:
        return None
    ts = pl.col("generated_at")
    df = (
        scan_parquet(files, columns=["sample_id", "generated_at", "completion_tokens", "e2e_latency"])
        .filter(ts >= pl.lit(since).cast(pl.Datetime("us", "UTC")))
        .unique("sample_id")
        .select(
            pl.len().alias("requests"),
            pl.col("completion_tokens").sum().alias("output_tokens"),
            (ts - pl.duration(milliseconds=(pl.col("e2e_latency").fill_null(0) * 1000).cast(pl.Int64)))
            .min()
            .alias("start"),
            ts.max().alias("end"),
        )
        .collect()
    )
    row = df.row(0, named=True)
    if not row["requests"]:
        return {"requests": 0, "output_tokens": 0, "generate_s": 0.0}
    return {
        "requests": int(row["requests"]),
        "output_tokens": int(row["output_tokens"] or 0),
        "generate_s": (row["end"] - row["start"]).total_seconds(),
    }


def plan_vs_actual(data: DataPath, plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """{created_at, rows: [{metric, planned, actual}]} for the report, or None without a plan."""
    if not plan:
        return None
    try:
        since = dt.datetime.fromisoformat(str(plan["created_at"]))
    except (KeyError, ValueError):
        return None
    prompts_file = data / "prompts" / "prompts.parquet"
    gen = _generated_since(data, since) or {}
    rows = [
        ("prompts", plan.get("prompts"), parquet_num_rows(prompts_file) if prompts_file.exists() else None),
        ("prompt tokens", plan.get("prompt_tokens"), _prompt_tokens(data)),
        ("requests generated", plan.get("requests_to_send"), gen.get("requests")),
        ("output tokens", plan.get("expected_output_tokens"), gen.get("output_tokens")),
        ("generate time (s)", (plan.get("fleet") or {}).get("eta_s"), gen.get("generate_s")),
    ]
    return {
        "created_at": plan["created_at"],
        "output_basis": plan.get("output_basis"),
        "throughput_basis": (plan.get("fleet") or {}).get("throughput_basis"),
        "rows": [{"metric": m, "planned": p, "actual": a} for m, p, a in rows],
    }


PLAN_HEADLINES = (
    "prompts",
    "prompt_tokens",
    "requests_cached",
    "requests_to_send",
    "expected_output_tokens",
    "output_basis",
    "created_at",
)


def plan_headlines(plan: dict[str, Any] | None, prompts: int) -> tuple[dict[str, Any], str | None]:
    """The last plan's headline figures for the `prompts` asset's metadata (plan_*), and a warning when
    the plan counted another number of prompts than ingest produced (sources changed since the plan)."""
    if not plan:
        return {}, None
    fields = {f"plan_{k}": plan.get(k) for k in PLAN_HEADLINES}
    fleet = plan.get("fleet") or {}
    fields.update(plan_eta_s=fleet.get("eta_s"), plan_gpu_hours=fleet.get("gpu_hours"))
    fields["plan_total_disk_bytes"] = (plan.get("disk") or {}).get("total_bytes")
    planned = plan.get("prompts")
    warning = (
        None
        if planned == prompts
        else f"the plan of {plan.get('created_at')} counted {planned} prompts, ingest produced {prompts}: "
        "the sources changed since; run `eagle3 plan` again for a current estimate"
    )
    return {k: v for k, v in fields.items() if v is not None}, warning


def last_measured_throughput(data: DataPath, plan: dict[str, Any] | None) -> tuple[float, int, str] | None:
    """(output tokens/s per server, servers, basis) the last run measured, for a plan no server can probe.

    The generations stored since the last plan, over the time they took and that plan's servers; else
    that plan's own figure when it was probed (never one that was only declared). None: nothing measured.
    """
    if not plan:
        return None
    fleet = plan.get("fleet") or {}
    servers = int(fleet.get("servers") or 0)
    try:
        since = dt.datetime.fromisoformat(str(plan["created_at"]))
    except (KeyError, ValueError):
        return None
    gen = _generated_since(data, since) or {}
    if servers and gen.get("requests") and gen.get("generate_s", 0) > 0 and gen.get("output_tokens"):
        tps = gen["output_tokens"] / gen["generate_s"] / servers
        basis = (
            f"last measured: {gen['requests']:,} request(s), {gen['output_tokens']:,} output tokens in "
            f"{gen['generate_s']:.0f} s on {servers} server(s) since the plan of {plan['created_at']}"
        )
        return tps, servers, basis
    probed = fleet.get("tokens_per_s_per_server")
    if servers and probed and str(fleet.get("throughput_basis", "")).startswith("probe"):
        return float(probed), servers, f"last measured: the probe of the plan of {plan['created_at']}"
    return None
