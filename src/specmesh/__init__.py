"""specmesh: lossless speculative decoding for Llama-family models."""
from specmesh.generation import Output, Sample
from specmesh.llm import LLM
from specmesh.sampling import SamplingParams
from specmesh.stats import Stats

__all__ = ["LLM", "SamplingParams", "Stats", "Output", "Sample"]
__version__ = "0.1.0"
