"""Shared pytest hooks. The site test (tests/test_site.py) leaves a summary to print."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        import site_check
    except ImportError:  # tests/ not on sys.path (another import mode): nothing to print
        return
    lines = config.stash.get(site_check.SUMMARY_KEY, None)
    if lines:
        terminalreporter.section("site test summary")
        for line in lines:
            terminalreporter.write_line(line)
