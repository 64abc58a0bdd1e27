"""One exception type for every user-facing mistake: the message says what is wrong and how to fix it."""


class FusionLabError(ValueError):
    """Bad input or missing setup, explained; never a silent wrong result."""


class ContextTooLong(FusionLabError):
    """A text does not fit a model's context (or a haystack is too short for the asked length): grid runners
    record such a cell as skipped, with this message, instead of stopping the run."""
