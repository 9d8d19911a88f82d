"""The pipeline methods: pp, stpp, pipedec (and pipedec's one-process schedule, for simulate)."""
