"""specmesh: lossless speculative decoding for Llama-family models."""
from specmesh.engine.sequence import Output, Sample
from specmesh.engine.stats import Stats
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "Stats", "Output", "Sample"]
__version__ = "0.1.0"
