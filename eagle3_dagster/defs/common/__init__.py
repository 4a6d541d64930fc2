"""Shared by the definitions: the resources (resources.py)."""
