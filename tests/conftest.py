"""Fixtures and plugins of the whole suite: ``tests/suite_costs.py`` prints, at the end of every run, each
test file's wall and CPU seconds and how many Gym stacks and Ray heads it started."""

pytest_plugins = ["tests.suite_costs"]
