"""``tmpl-lint replay LOG``: the hit rate a serving engine's prefix cache reports on logged
traffic, and why every prompt token it recomputes is recomputed.

``log`` reads the log (calls in arrival order, grouped into sessions); ``attribution``
renders each session's requests and says why a prompt departs from what its session left
computed (pass 1); ``simulate`` runs every request through the cache model and counts each
prompt token by cause (pass 2), and writes the text report; ``chart`` writes the HTML page.
"""

from .attribution import Departure, TokenCause, Tracer, client_change
from .log import Call, ReplayError, Session, read_log, reply_message, sessions
from .simulate import CacheSettings, Summary, replay, text_report

__all__ = [
    "CacheSettings",
    "Call",
    "Departure",
    "ReplayError",
    "Session",
    "Summary",
    "TokenCause",
    "Tracer",
    "client_change",
    "read_log",
    "replay",
    "reply_message",
    "sessions",
    "text_report",
]
