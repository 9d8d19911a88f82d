"""Processes on torch.distributed: links with bounded waits, worker launch, pipeline stages. Knows no methods."""


class PeerError(RuntimeError):
    """Another rank died or did not answer in time (here, not in link.py: the CLI catches it without torch)."""
