"""Datasets (loaded once on the host) and on-device augmentation."""
