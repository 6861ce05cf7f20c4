"""The launch protocol: how a real job starts under dagprof (``dagprof profile``, ``optimize --verify``, the benchmarks).

``bootstrap/`` goes first on PYTHONPATH, so every Python process of the job loads its ``sitecustomize``, which
installs the zero-code profiler (``hooks.autoprofile``, on with ``DAGPROF_OUT``) and strategy runs
(``deploy.autoapply``, on with ``DAGPROF_STRATEGY`` / ``DAGPROF_TIMES``); ``Bootstrap`` says which. ``cmd`` is
either a launcher command (``torchrun ...``, ``horovodrun ...``) run as it is, or, with ``ranks``, one rank's
command started once per rank with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set (``netns.run_ranks``: on
loopback, or one namespace per rank of an emulated cluster), waited for, and stopped if one rank fails.
"""
from __future__ import annotations

import contextlib
import math
import os
import subprocess
from dataclasses import dataclass

from ...errors import DagprofError
from ..deploy.autoapply import ENV_STRATEGY, ENV_TIMES
from ..hooks.autoprofile import ENV_KINETO, ENV_OUT, ENV_STEPS
from ..hooks.stop_signals import terminate_raises
from .netns import Cluster, run_ranks

STOP_GRACE_S = 15.0  # torchrun's agent waits on its ranks' exits after passing a SIGTERM on
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


@dataclass(frozen=True)
class Bootstrap:
    """What dagprof does inside every process of the job; a part left unset stays off."""
    profile: str | None = None  # profile into this run folder
    steps: range | None = None  # the optimizer steps to profile (``profile`` set)
    kineto: bool = True  # torch.profiler beside the hooks (``profile`` set)
    times: str | None = None  # write each rank's step times into this folder
    strategy: str | None = None  # apply this strategy file to every DDP model

    def env(self) -> dict[str, str]:
        old = os.environ.get("PYTHONPATH")
        env = {"PYTHONPATH": os.pathsep.join([BOOTSTRAP] + ([old] if old else []))}
        if self.profile is not None:
            env[ENV_OUT] = self.profile
            if self.steps is not None:
                env[ENV_STEPS] = f"{self.steps.start}:{self.steps.stop}"
            env[ENV_KINETO] = "1" if self.kineto else "0"
        if self.times is not None:
            env[ENV_TIMES] = self.times
        if self.strategy is not None:
            env[ENV_STRATEGY] = os.path.abspath(self.strategy)
        return env


def launch(cmd: list[str], bootstrap: Bootstrap | None, ranks: int | None = None, cluster: Cluster | None = None,
           log_dir: str | None = None, timeout_s: float | None = None) -> int:
    """Run ``cmd`` under ``bootstrap`` (None: a plain job) and wait for it; return its exit status.

    Without ``ranks`` the command's output goes to ``<log_dir>/job.log`` (else to this process's own).
    With ``ranks`` (``log_dir`` required: ``rank<r>.log`` each) a failing or hanging rank stops the others
    and raises ``DagprofError`` with the last error line of its log. A command that cannot start, or runs
    past ``timeout_s``, raises too.
    """
    env = bootstrap.env() if bootstrap is not None else {}
    if ranks is not None:
        assert log_dir is not None, "launch(ranks=...) needs a log folder"
        try:
            run_ranks(cmd, ranks, log_dir, env=env, cluster=cluster, timeout_s=math.inf if timeout_s is None else timeout_s)
        except RuntimeError as err:
            raise DagprofError(f"the job failed: {last_error_line(str(err))} (logs in {log_dir})") from None
        return 0
    log = None if log_dir is None else os.path.join(log_dir, "job.log")
    with contextlib.ExitStack() as stack:
        out = {}
        if log is not None:
            os.makedirs(log_dir, exist_ok=True)
            out = {"stdout": stack.enter_context(open(log, "w")), "stderr": subprocess.STDOUT}
        try:
            job = subprocess.Popen(cmd, env={**os.environ, **env}, **out)
        except OSError as err:
            raise DagprofError(f"cannot start the command: {err.strerror or err}", cmd[0]) from None
        try:
            with terminate_raises():
                return job.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise DagprofError(f"the job ran past {timeout_s:.0f} s" + (f" (log {log})" if log else "")) from None
        finally:
            _stop(job)


def _stop(job: subprocess.Popen) -> None:
    """The job still running asked to end (torchrun passes it on to its ranks), killed if it has not within
    ``STOP_GRACE_S``, and reaped: no rank left writing into a run folder its caller then tidies."""
    if job.poll() is None:
        job.terminate()
        try:
            job.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()


def last_error_line(text: str) -> str:
    """The line of a job's output that most likely says why it failed (the last error, else the last line). A C++
    abort's ``terminate called after throwing ...`` keeps its ``what():`` line, the next one, which says what was thrown."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith("[W")]
    at = max((i for i, ln in enumerate(lines) if "Error" in ln or "error" in ln), default=len(lines) - 1)
    if at < 0:
        return "(no output)"
    line = lines[at]
    if line.startswith("terminate called after throwing") and at + 1 < len(lines) and lines[at + 1].startswith("what():"):
        line = f"{line} {lines[at + 1]}"
    return line[:300]
