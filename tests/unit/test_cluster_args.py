"""``orchestra start``'s arguments, ``orchestra status``'s text, the state directory's
records and ``init(address="auto")``'s lookup: no process, no socket."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra._api import local_head
from orchestra._api import session as _session
from orchestra._cli import cluster as cc
from orchestra._cluster import launch as _launch
from orchestra._runtime import cluster_file as cf

pytestmark = pytest.mark.timeout(10)

DEAD_PID = 2 ** 22 + 12345   # above any pid_max of a default kernel


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCHESTRA_TOKEN", "ORCHESTRA_ADDRESS", cf.STATE_DIR_ENV):
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------- arguments

def test_a_usage_error_prints_the_synopsis_and_the_error_not_the_whole_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    """(It printed every paragraph of the help before the error line.)"""
    with pytest.raises(SystemExit) as exc:
        cc.parse_start(["--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: orchestra start --head") and "error:" in err.splitlines()[-1]
    assert "state store" not in err and len(err.splitlines()) <= 10
    with pytest.raises(SystemExit):
        cc.parse_start(["--help"])
    assert "state store" in capsys.readouterr().out   # --help still says it all


def test_a_head_defaults_to_loopback_port_6380_and_no_token() -> None:
    args = cc.parse_start(["--head"])
    assert (args.host, args.port, args.token, args.block) == ("127.0.0.1", 6380, None, False)


def test_a_head_takes_host_port_resources_store_and_block() -> None:
    args = cc.parse_start(["--head", "--host", "0.0.0.0", "--port", "7000", "--num-cpus", "4",
                           "--num-gpus", "1", "--resources", '{"widget": 2}',
                           "--object-store-memory", "1000000", "--token", "t", "--block"])
    assert (args.host, args.port, args.num_cpus, args.num_gpus) == ("0.0.0.0", 7000, 4, 1)
    assert args.resources == {"widget": 2.0}
    assert (args.object_store_memory, args.token, args.block) == (1000000, "t", True)


def test_a_node_takes_its_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_TOKEN", "from-env")
    args = cc.parse_start(["--address", "10.0.0.5:6380"])
    assert (args.address, args.token, args.host) == ("10.0.0.5:6380", "from-env", None)
    assert cc.parse_start(["--address", "10.0.0.5:6380", "--token", "given"]).token == "given"


@pytest.mark.parametrize("argv, says", [
    ([], "one of the arguments --head --address is required"),
    (["--head", "--address", "1.2.3.4:5"], "not allowed with argument"),
    (["--address", "10.0.0.5:6380"], "needs the cluster token"),
    (["--address", "10.0.0.5", "--token", "t"], "is not IP:PORT"),
    (["--address", "10.0.0.5:6380", "--token", "t", "--port", "1"], "--port is the head's"),
    (["--head", "--resources", "{bad"], "--resources takes JSON"),
    (["--head", "--resources", '{"a": "x"}'], "names to numbers"),
    (["--head", "--object-store-memory", "-5"], "positive number of bytes"),
    (["--head", "--port", "70000"], "a port is 0..65535"),
    (["--head", "--num-cpus", "-1"], "--num-cpus must be >= 0"),
])
def test_bad_start_arguments_are_refused_naming_the_fix(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cc.parse_start(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("address, parts", [
    ("10.0.0.5:6380", ("10.0.0.5", 6380)),
    ("[::1]:7000", ("::1", 7000)),
    ("head.example:1", ("head.example", 1)),
])
def test_addresses_split_into_host_and_port(address: str, parts: tuple[str, int]) -> None:
    assert _launch.split_address(address) == parts
    assert _launch.split_address(_launch.join_address(*parts)) == parts


@pytest.mark.parametrize("output, cause", [
    ("AuthenticationError: wrong cluster token: pass ...", "refused the token"),
    ("cannot join the cluster at 1.2.3.4:5: [Errno 111] Connection refused", "unreachable"),
    ("cannot join: timed out", "unreachable"),
    ("version mismatch: the cluster runs orchestra 0.2", "another orchestra version"),
    ("Traceback ... KeyError", "see its output"),
])
def test_a_failed_join_is_explained(output: str, cause: str) -> None:
    assert cause in _launch.join_failure(output, "1.2.3.4:5")


def test_a_node_binds_the_address_on_its_route_to_the_head() -> None:
    cfg = _launch.node_cfg(head_address="127.0.0.1:6380", token="t", host=None,
                           session_dir="/nonexistent", num_cpus=2, num_gpus=0)
    assert cfg["host"] == "127.0.0.1"
    assert (cfg["head_address"], cfg["token"], cfg["num_workers"]) == ("127.0.0.1:6380", "t", 2)
    assert cfg["resources"]["CPU"] == 2
    assert "_spill_root" not in cfg
    assert _launch.node_cfg(head_address="10.1.2.3:6380", token="t", host="10.9.9.9",
                            session_dir="/x", num_gpus=0)["host"] == "10.9.9.9"


def test_the_head_cfg_is_inits_with_listen_token_detached_joinable() -> None:
    _, cfg = _launch.head_cfg(host="10.0.0.5", port=6380, token="t", num_cpus=3, num_gpus=0)
    assert (cfg["listen"], cfg["token"], cfg["detached"], cfg["joinable"]) == \
        ("10.0.0.5:6380", "t", True, True)
    _, plain = local_head.build_cfg(num_cpus=3, num_gpus=0)
    assert {k: v for k, v in cfg.items() if k not in ("listen", "token", "detached",
                                                       "joinable")} == plain


# ---------------------------------------------------------------------------- status text

def test_status_shows_each_node_its_resources_in_use_and_its_store() -> None:
    nodes = [
        {"NodeID": "0" * 16, "Alive": True, "NodeManagerAddress": "10.0.0.1",
         "Resources": {"CPU": 4.0, "widget": 1.0}, "AvailableResources": {"CPU": 1.0,
                                                                         "widget": 1.0},
         "ObjectStoreUsed": 3 << 20, "ObjectStoreCapacity": 1 << 30},
        {"NodeID": "0" * 15 + "2", "Alive": False, "NodeManagerAddress": "10.0.0.2",
         "Resources": {"CPU": 2.0}, "AvailableResources": {"CPU": 2.0},
         "ObjectStoreUsed": 0, "ObjectStoreCapacity": 1 << 30},
    ]
    text = cc.format_status(nodes, {"CPU": 4.0, "widget": 1.0}, {"CPU": 1.0, "widget": 1.0})
    assert text.splitlines() == [
        "2 node(s), 1 alive",
        "node 0000000000000000  10.0.0.1  alive",
        "  resources (in use/total): CPU 3/4, widget 0/1",
        "  object store: 3.0 MiB used of 1.0 GiB",
        "node 0000000000000002  10.0.0.2  dead",
        "  resources (in use/total): CPU 0/2",
        "  object store: 0 B used of 1.0 GiB",
        "cluster resources (in use/total): CPU 3/4, widget 0/1",
    ]


# ---------------------------------------------------------------------------- records

def test_the_state_directory_is_made_private(tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    assert cf.state_dir(path) == path
    assert os.stat(path).st_mode & 0o777 == 0o700


def test_a_state_directory_open_to_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "open"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    with pytest.raises(PermissionError, match="holds cluster tokens"):
        cf.state_dir(str(path))


def test_records_are_read_heads_first_and_are_private(tmp_path: Path) -> None:
    state = cf.state_dir(str(tmp_path / "s"))
    for kind, started in (("node", 1.0), ("head", 2.0), ("node", 0.5)):
        run_dir = cf.new_run_dir(state, kind)
        cf.write_record(run_dir, {"kind": kind, "pid": 1, "started": started})
        assert os.stat(os.path.join(run_dir, cf.RECORD)).st_mode & 0o777 == 0o600
    cf.new_run_dir(state, "node")   # a start in progress: no record yet
    recs = cf.read_records(state)
    assert [(r["kind"], r["started"]) for r in recs] == [("head", 2.0), ("node", 0.5),
                                                         ("node", 1.0)]
    assert len(cf.run_dirs(state)) == 4


def test_local_cluster_is_the_live_heads_else_a_live_nodes(tmp_path: Path) -> None:
    state = cf.state_dir(str(tmp_path / "s"))
    assert cf.local_cluster(state) is None
    node = cf.new_run_dir(state, "node")
    cf.write_record(node, {"kind": "node", "pid": os.getpid(), "address": "10.0.0.1:6380",
                           "token": "tn"})
    assert cf.local_cluster(state) == ("10.0.0.1:6380", "tn")
    dead = cf.new_run_dir(state, "head")
    cf.write_record(dead, {"kind": "head", "pid": DEAD_PID, "address": "127.0.0.1:1",
                           "token": "td"})
    assert cf.local_cluster(state) == ("10.0.0.1:6380", "tn")
    head = cf.new_run_dir(state, "head")
    cf.write_record(head, {"kind": "head", "pid": os.getpid(), "address": "127.0.0.1:6380",
                           "token": "th"})
    assert cf.local_cluster(state) == ("127.0.0.1:6380", "th")


def test_address_auto_resolves_to_the_recorded_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = cf.state_dir(str(tmp_path / "s"))
    monkeypatch.setenv(cf.STATE_DIR_ENV, state)
    with pytest.raises(ConnectionError, match="orchestra start --head"):
        _session.resolve_address("auto", None)
    head = cf.new_run_dir(state, "head")
    cf.write_record(head, {"kind": "head", "pid": os.getpid(), "address": "127.0.0.1:6380",
                           "token": "th"})
    assert _session.resolve_address("auto", None) == ("127.0.0.1:6380", "th")
    assert _session.resolve_address("auto", "mine") == ("127.0.0.1:6380", "mine")
    assert _session.resolve_address(None, None) == (None, None)
    monkeypatch.setenv("ORCHESTRA_ADDRESS", "auto")
    assert _session.resolve_address(None, None) == ("127.0.0.1:6380", "th")
    monkeypatch.setenv("ORCHESTRA_ADDRESS", "10.0.0.9:1")
    assert _session.resolve_address(None, "t") == ("10.0.0.9:1", "t")
