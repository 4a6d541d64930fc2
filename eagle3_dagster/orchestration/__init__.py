"""Helpers that wire domain functions into Dagster steps (kept out of the asset bodies in defs/)."""
