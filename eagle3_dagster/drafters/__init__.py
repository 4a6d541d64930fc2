"""Judge a candidate drafter against production's on the probe sets, before it ships (docs/drafter-compare.md).

No Dagster here: plain typed functions the `eagle3 drafters compare` command and the `drafter_comparison`
asset both call.

    rule.py       the promotion rule, expectations/drafter_promotion.json, validated
    stats.py      group acceptance (ratio of sums), the paired stratified bootstrap, verdicts (pure)
    units.py      stored rows -> paired units (prompts, or turns), flagged figures left out
    compare.py    per-source and overall results, too-few-prompts lines, the decision and its reasons (pure)
    candidate.py  what a candidate endpoint serves (drafter, target model) and why it is refused
    baseline.py   production's side: a drafter's stored probe results, completed from its generations rows
    store.py      the candidate's own generations and results, the comparisons' history
    lineage.py    which snapshot trained a drafter (--trained-on, or the record beside its checkpoint)
    run.py        one comparison end to end
    text.py       the printed table and the Markdown table
    cli.py        `eagle3 drafters compare`
"""
