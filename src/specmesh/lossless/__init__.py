"""The lossless core: token trees, the one verifier and the sampling transform."""
