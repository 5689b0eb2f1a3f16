"""The suite's machinery: scenario runner, server processes, report and plots."""
