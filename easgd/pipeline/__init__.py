"""Pipelined multi-model training: M models move around the devices, the data stays.

programs: the pure per-device functions and their compiled programs. The
pipeline's runtime (easgd.train.runtimes.pipeline) runs them in the loop.
"""
