"""Processes on torch.distributed: links with bounded waits, worker launch, pipeline stages. Knows no methods."""
