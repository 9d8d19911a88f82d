"""`python -m specmesh.cli` (how torchrun starts every rank of a command)."""
from specmesh.cli import run

run()
