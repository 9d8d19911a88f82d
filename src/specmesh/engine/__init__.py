"""The one engine: sequences, a scheduler over cache rows, the target runner and the step loop."""
