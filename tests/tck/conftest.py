# Prints the per-class rsnet.tck summary (required/optional/stochastic/untested counts) at the
# end of any run that collects this directory. See rsnet/tck/report.py to enable it suite-wide.
from rsnet.tck.report import pytest_collection_modifyitems, pytest_terminal_summary

__all__ = ["pytest_collection_modifyitems", "pytest_terminal_summary"]
