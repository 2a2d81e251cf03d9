"""Writing results out: text, JSON, SARIF and GitHub annotations of findings, statistics,
where a report goes (output), and the one progress bar of long runs."""
