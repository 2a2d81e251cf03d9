"""``tmpl-lint replay LOG``: the hit rate a serving engine's prefix cache reports on logged
traffic, and why every prompt token it recomputes is recomputed.

``log`` reads the log (calls in arrival order, grouped into sessions); ``attribution``
renders each session's requests and says why a prompt departs from what its session left
computed (pass 1), and ``tracing`` runs it over the sessions in limited children, spilling the
traces to temporary files; ``simulate`` runs every request through the cache model and counts each
prompt token by cause (pass 2), and writes the text report. The HTML page is ``report.replay``.
"""
