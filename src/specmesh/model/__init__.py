"""The model: a Llama-family decoder, its KV cache, checkpoint loading and the tokenizer."""
