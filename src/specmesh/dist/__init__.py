"""Multi-process runtime: links between ranks (`link`) and the worker entry point (`worker`)."""
