"""Errors a user can cause that are not config errors (config errors: swe_megatron.config.ConfigError)."""


class UsageError(Exception):
    """A mistake in what the user asked for (bad file, bad argument); printed as one line, exit 2."""
