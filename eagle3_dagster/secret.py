"""A secret value (the SGLang API key) that does not print itself.

The settings module (config.py) reads the key from the environment once and hands it over as a
`Secret`; code that needs the value calls `reveal()` at the one place it is used (the Authorization
header). `repr`/`str`/f-strings show `Secret('***')`, so a config, a log line, metadata or run
config that contains the object never contains the key.
"""

from __future__ import annotations


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("a Secret needs a non-empty string")
        self._value = value

    def reveal(self) -> str:
        """The value itself: only where it is sent, never into logs, metadata or data."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))
