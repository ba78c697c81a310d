"""The one error type users see for bad input: every problem of a setup, each naming its flag."""

from __future__ import annotations


class SetupError(ValueError):
    """A setup that cannot run. `problems` holds one line per problem, each naming the flag or field."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))
