"""eagle3-dagster: the EAGLE-3 drafter training-data factory.

Domain code lives in one subpackage per stage (ingest, tokenize, generate, quality, train, sim)
and imports nothing from Dagster; `defs/` wires it into assets, checks, resources and schedules.
"""

__version__ = "0.1.0"
