"""What every asset of the project shares.

One asset group: Dagster's lineage page draws groups collapsed until they are clicked, and draws no
group box at all when there is only one, so a single group opens straight on the pipeline's graph.
The stage of an asset (ingest, tokenize, generate, train, publish) is its `eagle3/stage` tag, which
jobs select by.
"""

import dagster as dg

ASSET_GROUP = "eagle3"
STAGE_TAG = "eagle3/stage"


def stage_assets(stage: str) -> dg.AssetSelection:
    """The assets of one stage (by their `eagle3/stage` tag)."""
    return dg.AssetSelection.tag(STAGE_TAG, stage)
