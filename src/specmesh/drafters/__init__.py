"""Drafters: what proposes the token trees the target verifies."""
