"""The one error type users see for bad input (every problem of a setup, each naming its flag), and the
interruption a signal raises."""

from __future__ import annotations

import signal


class SetupError(ValueError):
    """A setup that cannot run. `problems` holds one line per problem, each naming the flag or field."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the program was (`raise_on_signals`) so that every `with` and `finally`
    on the way out runs: the worker process stopped, its temp folder removed, the lock let go. A
    KeyboardInterrupt, so code that cleans up on Ctrl-C cleans up on SIGTERM too. The command line prints
    `message` and exits with `code`, 128 + the signal (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int = signal.SIGINT, message: str = "interrupted"):
        super().__init__(message)
        self.signum, self.message = int(signum), message

    @property
    def code(self) -> int:
        return 128 + self.signum


def raise_on_signals() -> None:
    """From now on SIGINT and SIGTERM raise `Interrupted` in the main thread. Only the first: a second
    signal while the first unwinds is ignored, so the clean-up it runs is not cut short."""
    caught: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not caught:
            caught.append(signum)
            raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # what was ignored (nohup, a background job) stays so
            signal.signal(signum, handler)
