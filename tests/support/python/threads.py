"""Threads per process for the PyTorch references, set before the first import of torch (OpenMP and OpenBLAS read
these when they load): `--threads N` on the command line (default 1); an explicit setting in the environment wins.
Import this module before torch."""
import os
import sys


def _arg_value(argv, name, default):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _arg_value(sys.argv[1:], "--threads", "1"))
