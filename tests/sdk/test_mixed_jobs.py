"""C++ workers (ddprun::init_process_group) and Python workers (torch.distributed, the same
torch version as the SDK's LibTorch) join one job and run collectives together: the SDK uses
the store keys and prefixes Python uses."""
import re

import pytest

from sdkutil import SOURCE_DIR, matching_python, sdk_bin


def write_dispatcher(tmp_path, cpp_ranks):
    """A worker entry point that is the C++ probe on `cpp_ranks` and the Python probe elsewhere."""
    script = tmp_path / "worker.sh"
    ranks = " ".join(str(r) for r in cpp_ranks)
    script.write_text(f"""#!/bin/sh
for r in {ranks}; do
  if [ "$RANK" = "$r" ]; then exec {sdk_bin("sdk_probe")}; fi
done
exec {matching_python()} {SOURCE_DIR / "tests" / "sdk" / "probe.py"}
""")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("cpp_ranks", [(0,), (1,), (0, 2), ()], ids=str)
def test_cpp_and_python_workers_share_a_job(launcher, tmp_path, cpp_ranks):
    world = 3 if 2 in cpp_ranks else 2
    r = launcher.run(world, [write_dispatcher(tmp_path, cpp_ranks)], timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # Workers share the console: match records, not lines.
    lines = re.findall(r"probe impl=(cpp|python) rank=(\d) world=(\d) sum=([0-9.]+) "
                       r"gathered=([0-9,]+) broadcast=([-0-9.]+)", out)
    assert len(lines) == world, out
    expected_sum = world * (world + 1) // 2
    gathered = ",".join(str(10 * r) for r in range(world))
    for impl, rank, w, s, g, b in lines:
        assert impl == ("cpp" if int(rank) in cpp_ranks else "python")
        assert int(w) == world and float(s) == expected_sum and g == gathered and float(b) == 42
