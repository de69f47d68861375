"""oneDNN keeps a kernel per row count a packed linear has run at; unpadded steps run at
ever new counts, so its caches must be bounded (`bound_kernel_caches`), and bounded
from inside the process, after torch is imported: the worker sets them as it packs its
linears. Each side runs in a fresh process (oneDNN reads the bound once)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

ROW_COUNTS = 600

CHILD = textwrap.dedent("""
    import ctypes, sys
    import torch
    from torch import nn
    from shoal.nodes.worker.models.packed_linear import PackedLinear, bound_kernel_caches

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    if sys.argv[1] == "bounded":
        bound_kernel_caches(rows_padded=False)
    torch.set_num_threads(1)
    lin = PackedLinear(nn.Linear(256, 256), 128)
    with torch.no_grad():
        lin(torch.randn(3, 256))
        before = rss_mib()
        for rows in range(1, int(sys.argv[2]) + 1):
            lin(torch.randn(rows, 256))
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what is freed is not what the caches keep
    print(rss_mib() - before)
""")


def kept_mib(mode: str, env_extra: dict | None = None) -> float:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    env.update(env_extra or {})
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(ROW_COUNTS)], capture_output=True, text=True,
                          env=env, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def test_bounded_caches_keep_a_fraction_of_what_the_defaults_keep_unless_the_user_set_them():
    bounded, default = kept_mib("bounded"), kept_mib("default")
    # measured: ~54 MiB bounded at any number of row counts, ~220 MiB at the defaults for 600
    assert bounded < 0.5 * default, f"bounded caches kept {bounded:.0f} MiB, the defaults {default:.0f} MiB"
    users = kept_mib("bounded", {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"})
    assert users > 2 * bounded, f"the user's capacities were overridden: {users:.0f} MiB kept, bounded {bounded:.0f}"
