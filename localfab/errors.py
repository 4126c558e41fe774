"""Errors a user can meet, each with the exit code the command line gives it.

Every error that reaches a front end is a `LocalfabError`: its message says what went wrong and
what to do next, and the command line prints it as one line on stderr without a traceback.
"""

from __future__ import annotations

# Exit codes of the `localfab` command (also listed in `localfab --help`).
EXIT_OK = 0
EXIT_ERROR = 1  # anything else that went wrong
EXIT_USAGE = 2  # bad option or argument (click's own code)
EXIT_MODEL = 3  # model missing, not a GGUF file, truncated or corrupt, unknown name
EXIT_CONTEXT = 4  # prompt does not fit in the context window
EXIT_NETWORK = 5  # download or hub failure
EXIT_FIT = 6  # the model does not fit in this machine's memory
EXIT_INTERRUPTED = 130  # Ctrl-C


class LocalfabError(Exception):
    """Base of every error a user can meet; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_ERROR


class UsageError(LocalfabError):
    """A request or option that cannot be honoured as given."""

    exit_code = EXIT_USAGE


class ModelError(LocalfabError):
    """The model file is missing, unreadable, not GGUF, truncated or corrupt."""

    exit_code = EXIT_MODEL


class ModelNotFound(ModelError):
    """A model name that is neither a file nor a registered model."""


class ContextOverflow(LocalfabError):
    """A prompt longer than the context window; carries both token counts."""

    exit_code = EXIT_CONTEXT

    def __init__(self, n_prompt_tokens: int, n_ctx: int, message: str | None = None) -> None:
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            message
            or f"the prompt is {n_prompt_tokens} tokens but the context window holds {n_ctx}: "
            f"shorten the prompt or raise the context with -c"
        )


class HubError(LocalfabError):
    """A download or Hugging Face request failed; the message names the cause and the fix."""

    exit_code = EXIT_NETWORK


class HubUnreachable(HubError):
    """The hub cannot be reached at all (no route, no name resolution, a mirror that is down):
    what needs no network (local models, the catalog's facts) still works."""


class ModelCorrupt(ModelError):
    """A GGUF header that parses but holds wrongly typed or impossible values."""


class LoadCancelled(LocalfabError):
    """A model load stopped on request (its progress callback said stop); nothing stays loaded."""

    exit_code = EXIT_INTERRUPTED
