"""Pipelined multi-model training: M models move around the devices, the data stays.

programs: the pure per-device functions and their compiled programs.
trainer:  the pipeline's part of the training loop (easgd.train.loop).
"""
