"""``--fix`` and ``--diff``: options (what a run is asked and which fixes apply by default),
verify (a fix kept only if it renders everything else as the original did), apply (one
template's fixes), files (putting templates back into their files, or the diff)."""
