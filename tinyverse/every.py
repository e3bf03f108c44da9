"""A rate limit for what a loop would say each step: a warning, a progress line."""

import time


class Every:
    """True at most once every ``seconds`` per key: a warning a loop would repeat each step is said
    now and then."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds
        self.last = {}  # key -> when it was last said (monotonic)

    def __call__(self, key: str = "") -> bool:
        if due := time.monotonic() - self.last.get(key, -self.seconds) >= self.seconds:
            self.last[key] = time.monotonic()
        return due
