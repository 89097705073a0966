"""LST data platform: backend (settings, data model, services, REST API, CLI)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lstdp")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.1.0"
