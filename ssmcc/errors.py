"""Errors ssmcc raises on purpose. Each message names what is wrong and what to do about it."""


class SSMCCError(Exception):
    """Base class of every error ssmcc raises deliberately."""


class InputError(SSMCCError, ValueError):
    """The caller passed inputs ssmcc cannot use (wrong dtype, rank, size or value range)."""


class OptionError(InputError):
    """An option of ``compile``/``load`` (or its command-line flag) has a value it cannot take."""


class CaptureError(SSMCCError):
    """torch.export could not capture the model; the message says which model and why."""


class LoweringError(SSMCCError):
    """A backend has no emitter for an op in the program."""


class PassError(SSMCCError):
    """A pass failed or left the program invalid; the message names the pass and those before it."""


class StreamingError(SSMCCError):
    """prefill/step/generate were asked of a program that cannot stream; the message says why
    (which node, which module) and what to do."""


class ArtifactError(SSMCCError):
    """An artifact directory is missing, incomplete, corrupt or would be overwritten."""


class ServingError(SSMCCError):
    """A serving repository cannot be written, or a server cannot be started or answered as
    asked; the message says what to do."""
