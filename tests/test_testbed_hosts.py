"""The namespace testbed as hosts (``bench_frameworks.py --testbed --hosts``): each worker in a namespace of its own,
named and resolved as a host (``Cluster(iface=...)``), its port shaped (``shaped_loopback.shape_hosts``), and the ssh
shim that starts a command "on the host" owning an address (bench/testbed/ssh_shim/ssh), as horovodrun does over ssh."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

from shaped_loopback import hosts_qdisc, hosts_tx, shape_hosts  # noqa: E402

from dagprof.collect.jobs import netns  # noqa: E402

SHIM = os.path.join(os.path.dirname(__file__), "..", "bench", "testbed", "ssh_shim", "ssh")
why = netns.available()
pytestmark = pytest.mark.skipif(why is not None, reason=f"testbed: {why}")


def test_ranks_as_hosts_share_an_interface_name_and_resolve_their_hostname_to_their_own_address():
    with netns.Cluster(2, tag=f"hst{os.getpid() % 10000}", iface="eth0") as c:
        etc = [os.path.join(netns.NETNS_ETC, c.ns(r)) for r in range(2)]
        for r in range(2):
            shown = subprocess.run(["ip", "-n", c.ns(r), "-br", "addr", "show", "eth0"], capture_output=True, text=True, check=True).stdout
            assert f"{c.addr(r)}/24" in shown
            host = subprocess.run(["ip", "netns", "exec", c.ns(r), "getent", "hosts", socket.gethostname()], capture_output=True, text=True).stdout
            assert host.split()[0] == c.addr(r)  # gloo's device by hostname binds the host's interface, not the loopback
        shape_hosts(c, 200e6, 100e6)
        rates, sent = hosts_qdisc(c)
        assert rates == [200e6, 200e6] and sent >= 0 and hosts_tx(c) >= 0
        burst = subprocess.run(["ip", "netns", "exec", c.ns(1), "tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert int(re.search(r"burst (\d+)b", burst).group(1)) == pytest.approx(12500, rel=0.01)  # 1 ms at the pair's slower rate
    assert not any(os.path.exists(e) for e in etc)


def test_the_ssh_shim_runs_the_command_in_the_namespace_owning_the_address():
    with netns.Cluster(2, tag=f"hss{os.getpid() % 10000}", iface="eth0") as c:
        env = dict(os.environ, DAGPROF_NETNS_HOSTS=",".join(f"{c.addr(r)}={c.ns(r)}" for r in range(2)))
        # as horovodrun calls ssh: options before and after the host, the command one quoted word
        got = subprocess.run([SHIM, "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", c.addr(1), "-o", "ConnectTimeout=5",
                              "cd / > /dev/null 2>&1 ; ip -br addr show eth0 | tr -s ' '"], env=env, capture_output=True, text=True)
        assert got.returncode == 0 and f"{c.addr(1)}/24" in got.stdout
        got = subprocess.run([SHIM, "10.213.0.77", "true"], env=env, capture_output=True, text=True)
        assert got.returncode == 255 and got.stderr.startswith("ssh (testbed shim): no namespace for host '10.213.0.77'")


def test_the_ssh_shim_confines_the_command_to_the_hosts_core():
    """``--hosts`` puts each host's processes on a core of their own (``bench_frameworks.host_cores``): the shim runs a
    rank on the core ``DAGPROF_NETNS_CORES`` names for its host, and leaves a host it names none for free."""
    from bench_frameworks import host_cores  # noqa: PLC0415

    cores = host_cores(2)
    with netns.Cluster(2, tag=f"hsc{os.getpid() % 10000}", iface="eth0") as c:
        env = dict(os.environ, DAGPROF_NETNS_HOSTS=",".join(f"{c.addr(r)}={c.ns(r)}" for r in range(2)),
                   DAGPROF_NETNS_CORES=f"{c.addr(1)}={cores[1]}")
        show = "python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))'"
        got = subprocess.run([SHIM, "-o", "StrictHostKeyChecking=no", c.addr(1), show], env=env, capture_output=True, text=True)
        assert got.returncode == 0 and got.stdout.strip() == f"[{cores[1]}]"
        got = subprocess.run([SHIM, c.addr(0), show], env=env, capture_output=True, text=True)
        assert got.returncode == 0 and got.stdout.strip() == str(sorted(os.sched_getaffinity(0)))


@pytest.mark.frameworks
def test_a_jax_script_runs_on_the_testbed_as_hosts_its_gradients_crossing_the_ports(tmp_path):
    """``bench_workers_testbed.py --hosts`` with a JAX script (``bench_frameworks.launch``): each worker in its host's
    namespace, its ``--coordinator`` host 0's address; JAX's gloo binds the address the hostname resolves to there, so the
    all-reduces cross the shaped ports. Each of 2 ranks sends at least half its gradient a step (any all-reduce of 2
    ranks), so the ports carry at least a whole gradient per step. Opt-in: ``DAGPROF_JAX_PYTHON`` (tests/test_frameworks_integration.py)."""
    python = os.environ.get("DAGPROF_JAX_PYTHON")
    if not python:
        pytest.skip("needs DAGPROF_JAX_PYTHON: a Python with jax (tests/test_frameworks_integration.py)")
    from bench_frameworks import launch  # noqa: PLC0415

    from dagprof.traces.load import load  # noqa: PLC0415

    steps, grad = 16, (5 * 1 * 16 + 5 * 16 * 32 + 32 * 120 * 128 + 128 + 128 * 10) * 4  # jax_shardmap's parameters, float32
    with netns.Cluster(2, tag=f"hsj{os.getpid() % 10000}", iface="eth0") as c:
        shape_hosts(c, 1e9)
        sent0 = hosts_qdisc(c)[1]
        codes = launch("jax_shardmap", python, str(tmp_path), 2, 400, script_args=("--steps", str(steps)), hosts=c)
        sent = hosts_qdisc(c)[1] - sent0
    assert codes == [0, 0], (tmp_path / "log1.txt").read_text()[-3000:]
    assert len(load(str(tmp_path)).ranks) == 2
    assert sent >= steps * grad
