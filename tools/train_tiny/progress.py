"""Timestamped progress lines and the run's global seeding."""

import random
import sys
import time

import numpy as np
import torch

_START = time.monotonic()


def log(message):
    """Prints `[HH:MM:SS +elapsed] message` to stdout, flushed (the run is watched live)."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} +{time.monotonic() - _START:7.1f}s] {message}", flush=True)


def elapsed():
    return time.monotonic() - _START


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fail(message):
    log(f"FAILED: {message}")
    sys.exit(1)
