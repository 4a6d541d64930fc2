"""What every asset of the project shares: the asset names, the group and the stage tag (the definitions
in defs/ and the run driver both name assets from here).

One asset group: Dagster's lineage page draws groups collapsed until they are clicked, and draws no
group box at all when there is only one, so a single group opens straight on the pipeline's graph.
The stage of an asset (ingest, tokenize, generate, train, publish) is its `eagle3/stage` tag, which
jobs select by.
"""

import dagster as dg

ASSET_GROUP = "eagle3"
STAGE_TAG = "eagle3/stage"


class AssetName:
    """The asset keys of the graph, named once: definitions, jobs, sensors and the run driver use these."""

    PROMPTS = "prompts"
    TOKENIZED_PROMPTS = "tokenized_prompts"
    GENERATIONS = "generations"
    TRAINING_SAMPLES = "training_samples"
    TRAINING_DATASET = "training_dataset"
    DRAFTER_COMPARISON = "drafter_comparison"  # a candidate drafter against production's (defs/drafters.py)


# the per-shard assets, in graph order: one `shard_pipeline` run materializes them for one partition
SHARD_ASSETS = (AssetName.TOKENIZED_PROMPTS, AssetName.GENERATIONS, AssetName.TRAINING_SAMPLES)


def stage_assets(stage: str) -> dg.AssetSelection:
    """The assets of one stage (by their `eagle3/stage` tag)."""
    return dg.AssetSelection.tag(STAGE_TAG, stage)


# the offline HTML quality report, an asset of its own (defs/report.py)
REPORT_ASSET = "quality_report"
