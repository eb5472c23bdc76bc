"""privpipe: shared metadata and the error taxonomy used by every package.

The product's code lives in the top-level packages named in DESIGN.md
(`pipelines`, `transforms`, `anonymity`, `dp`, `attacks`, `reports`); this small
package holds only what all of them share without importing one another.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("privpipe")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
