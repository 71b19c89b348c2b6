"""The libtorch C++ DDP example (c10d TCPStore client + gloo) through ddpctl's store."""
import re

import pytest

from ddptest import BINARY_DIR, launch, torch_examples_built, write_job

EXAMPLE = BINARY_DIR / "bin" / "ddp_cpp_example"


@pytest.mark.skipif(not torch_examples_built(), reason="the build was configured with DDP_WITH_TORCH=OFF")
def test_cpp_ddp_ranks_agree_and_learn(tmp_path):
    assert EXAMPLE.exists(), f"{EXAMPLE} is not built: DDP_WITH_TORCH is on, the build should have made it"
    job = write_job(tmp_path, f"nproc_per_node: 3\ncommand: [{EXAMPLE}, '15']\n")
    r = launch(job, timeout=120)
    assert r.returncode == 0, r.stderr
    sums = {int(m.group(1)): m.group(2) for m in re.finditer(r"rank (\d) parameter checksum (\S+)", r.stdout)}
    assert sorted(sums) == [0, 1, 2]
    assert len(set(sums.values())) == 1, sums
    losses = [float(m.group(1)) for m in re.finditer(r"loss (\S+)", r.stdout)]
    assert losses[-1] < losses[0] / 10
