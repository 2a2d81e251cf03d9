"""Proving findings by rendering synthetic sessions and diffing token ids: measure (tokens,
cache blocks), divergence (the one prompt-diffing core that diff and replay use), replies
(the model's reply carried back), session (the Prover), attribution (which finding a
divergence proves)."""
