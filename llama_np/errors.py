"""The project's error types. The CLI turns them into one line on stderr and an exit status."""

from bench.devices import DeviceError
from llama_arch import ConfigError
from quant import QuantError


class LlamaNpError(Exception):
    """Bad data: a file that cannot be loaded, a checkpoint that does not match its config."""

    exit_code = 1


class UsageError(LlamaNpError):
    """Bad usage: a flag out of range, a prompt that does not fit, an unknown name."""

    exit_code = 2


# Everything llama-np reports as one line (ImportError: an optional extra that is missing).
ERRORS = (LlamaNpError, ConfigError, QuantError, DeviceError, ImportError)
