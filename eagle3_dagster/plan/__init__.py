"""`eagle3 plan`: a run's prompts, tokens, cached requests, ETA, GPU-hours and disk, before it runs.

count_prompts / tokenize_for_plan / count_cached        counts.py   (the pipeline's own functions)
output_expectation / disk_estimate / fleet_estimate    estimate.py
probe_endpoints                                         probe.py    (a few real POST /generate)
build_plan / plan_table / write_plan / read_plan        build.py
plan_vs_actual                                          actual.py   (the quality report's section)
`eagle3 plan` -> cli.run(args) (app/cli.py parses)       cli.py
"""

from .build import PLAN_FILE, Fleet, Plan, build_plan, plan_table, read_plan, write_plan

__all__ = ["PLAN_FILE", "Fleet", "Plan", "build_plan", "plan_table", "read_plan", "write_plan"]
