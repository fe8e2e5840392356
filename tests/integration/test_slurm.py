"""The Slurm batch example (examples/slurm/orchestra.sbatch), run for real: a Slurm
cluster of two nodes on this machine (slurmctld, and a slurmd per node, authenticated by a
munged of the test's own), the example submitted with sbatch and a driver as its
argument. The job's output must show the head and a node started through srun (the
workers under step 0 and step 1), the driver's tasks on both, and the cluster stopped
cleanly; after the job, no process of it is left and no shared memory.

Needs root and Slurm's packages (.ci/run installs slurmctld, slurmd, slurm-client and
munge); skips with the reason otherwise."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from _probes import wait_until

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "slurm" / "orchestra.sbatch"
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel", "munged",
            "mungekey")


def _skip_reason() -> str:
    if os.geteuid() != 0:
        return "needs root: Slurm's daemons run as root here"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing; .ci/run installs "
                "slurmctld slurmd slurm-client munge)")
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Slurm:
    folder: Path
    name: str                    # the cluster's name: SLURM_CLUSTER_NAME of its jobs
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 30) -> str:
        r = subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
        return r.stdout


def _conf(folder: Path, name: str, host: str) -> str:
    ctl, n1, n2 = _free_port(), _free_port(), _free_port()
    return "\n".join([
        f"ClusterName={name}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctl}",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={folder}/munge.sock",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool-%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none", "ReturnToService=2",
        # Two nodes on this machine, each its own slurmd (slurmd -N NAME).
        f"NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1} CPUs=1 State=UNKNOWN",
        f"NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2} CPUs=1 State=UNKNOWN",
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


@pytest.fixture
def slurm() -> Iterator[Slurm]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="orchestra-slurm-"))
    (folder / "state").mkdir()
    name = "orch" + uuid.uuid4().hex[:8]
    conf = folder / "slurm.conf"
    conf.write_text(_conf(folder, name, socket.gethostname()))
    env = {**os.environ, "SLURM_CONF": str(conf),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run(["mungekey", "--create", f"--keyfile={folder}/munge.key"], check=True,
                       capture_output=True, timeout=30)
        procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={folder}/munge.sock",
             f"--key-file={folder}/munge.key", f"--pid-file={folder}/munged.pid",
             f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(lambda: (folder / "munge.sock").exists(), 10, "munged's socket")
        daemons = [["slurmctld", "-D", "-f", str(conf)],
                   ["slurmd", "-D", "-N", "n1", "-f", str(conf)],
                   ["slurmd", "-D", "-N", "n2", "-f", str(conf)]]
        for cmd in daemons:
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        s = Slurm(folder, name, env)

        def idle() -> bool:
            r = subprocess.run(["sinfo", "-h", "-o", "%D %T"], env=env, capture_output=True,
                               text=True, timeout=10)
            return r.stdout.split() == ["2", "idle"]
        wait_until(idle, 30, "two idle Slurm nodes",
                   lambda: (folder / "slurmctld.log").read_text()[-2000:]
                   if (folder / "slurmctld.log").exists() else "no log")
        yield s
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30)
        _stop_left(name)   # a job that failed may outlive its cancel (steps left unkilled)
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


_DRIVER = '''
import json, os, time, orchestra
orchestra.init()   # ORCHESTRA_ADDRESS and ORCHESTRA_TOKEN come from the job's environment

@orchestra.remote(num_cpus=1)
def where(i):
    time.sleep(0.05)
    return (orchestra.get_runtime_context().get_node_id(), os.getpid(),
            os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID"))

# A node joined is in the status before its worker has started: a first batch may all
# run on the other node (2 s of work), so batches go on until both ran some (or 60 s).
deadline = time.monotonic() + 60
while True:
    got = orchestra.get([where.remote(i) for i in range(40)], timeout=60)
    if len({node for node, _, _, _ in got}) > 1 or time.monotonic() > deadline:
        break
print("RESULT " + json.dumps({"tasks": got, "nodes": len(orchestra.nodes())}))
'''


def _job_processes(cluster: str, job: str | None = None) -> list[int]:
    """Processes of Slurm job ``job`` (None: of any job) of cluster ``cluster`` (by their
    environment)."""
    found = []
    want = (f"SLURM_CLUSTER_NAME={cluster}".encode(),
            *([f"SLURM_JOB_ID={job}".encode()] if job is not None else []))
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w in env for w in want):
            found.append(int(pid))
    return found


def _stop_left(cluster: str) -> None:
    """SIGTERM what the cluster's jobs left (an orchestra head stops cleanly on it), then
    SIGKILL what is still there 10 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _job_processes(cluster):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _job_processes(cluster) and time.monotonic() < deadline:
            time.sleep(0.1)


def _dead_heads_shm() -> set[str]:
    """This user's segment directories whose head process is gone."""
    prefix = f"orchestra-{os.geteuid()}-"
    out = set()
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            pid = int(name[len(prefix):].split("-", 1)[0])
            if not Path(f"/proc/{pid}").exists():
                out.add(name)
    return out


def test_the_slurm_example_runs_a_driver_on_a_head_and_a_node_and_leaves_nothing(slurm, tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    out = tmp_path / "job.out"
    leaked_before = _dead_heads_shm()
    env = {**slurm.env, "ORCHESTRA_PORT": str(_free_port())}
    r = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=1",
                        f"--output={out}", str(EXAMPLE), str(driver)],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]

    def finished() -> bool:
        return not slurm.run("squeue", "-h", "-j", job).strip()
    wait_until(finished, 120, f"Slurm job {job} finished",
               lambda: out.read_text() if out.exists() else "no output yet")
    text = out.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"the driver printed no result:\n{text}"
    result = json.loads(lines[-1][len("RESULT "):])
    tasks = result["tasks"]
    assert result["nodes"] == 3, text   # the head's, the node beside it, the other node's
    assert len({node for node, _, _, _ in tasks}) == 2, "the tasks did not run on both nodes"
    assert {j for _, _, j, _ in tasks} == {job}
    # The workers are in the job steps srun started: the head's (0) and the node's (1).
    assert {step for _, _, _, step in tasks} == {"0", "1"}, text
    assert "stopped the head and node (SIGTERM)" in text and \
        "stopped the node (SIGTERM)" in text, text
    wait_until(lambda: not _job_processes(slurm.name, job), 20,
               "no process of the job left", lambda: str(_job_processes(slurm.name, job)))
    assert not _dead_heads_shm() - leaked_before, "the job left shared memory behind"

