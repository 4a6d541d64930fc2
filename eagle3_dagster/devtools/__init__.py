"""Developer tools beside the app layer: the generated reference pages of the docs site (docs_gen.py) and
the one big shard of `eagle3 demo --samples N` (sample_shard.py). Nothing in the pipeline imports them
except that demo option.
"""
