"""`specmesh simulate`: the papers' settings on a virtual clock, their token behaviour from the real algorithms
(every output equal to `ar`'s) and their costs from a profile, labelled simulated: pipelines.py (pipedec, pp, stpp
over N stages), split_target.py (easyspec and tree with the target over N devices), cluster.py (cosine and sd
with drafter nodes around a verification server)."""
