"""One exception type for every user-facing mistake: the message says what is wrong and how to fix it."""


class FusionLabError(ValueError):
    """Bad input or missing setup, explained; never a silent wrong result."""
