"""An outsider of a coordinator's group: a local process that calls every RPC without the
group's token. Shared by the coordinator protocol tests and the gang tests."""
from __future__ import annotations

from typing import Any

WRONG_TOKEN = "0" * 64

# How an outsider may present itself; every one must be refused by a coordinator with a token.
CREDENTIALS: dict[str, tuple[tuple[str, str], ...] | None] = {
    "no token": None,
    "wrong token": (("authorization", f"Bearer {WRONG_TOKEN}"),),
}


def outsider_attempts(address: str, session_id: int, node: int,
                      credentials: dict[str, Any] | None = None) -> dict[str, str]:
    """Every RPC of the coordinator, each once per entry of ``credentials`` (default
    ``CREDENTIALS``), claiming ``node``'s id and, as the strongest outsider would, the real
    ``session_id``. Connect tries to join (or re-join) as ``node``, KeyValueGet reads and
    KeyValueSet overwrites gang/torch_master, Heartbeat and Shutdown speak for ``node``.
    Returns ``{"<rpc>/<credentials>": status code name, or "OK"}``."""
    import grpc

    from orchestra._gang.coordinator import PROTOCOL_VERSION
    from orchestra._proto import xla_distributed_runtime_pb2 as xla_pb2
    from orchestra._proto import xla_distributed_runtime_pb2_grpc as xla_pb2_grpc

    requests: dict[str, Any] = {
        "Connect": xla_pb2.ConnectRequest(
            protocol_version=PROTOCOL_VERSION, timeout_milliseconds=300, node_id=node,
            client_id=0xBAD),
        "KeyValueGet": xla_pb2.KeyValueGetRequest(
            session_id=session_id, key=b"gang/torch_master", timeout_milliseconds=0),
        "KeyValueSet": xla_pb2.KeyValueSetRequest(
            session_id=session_id, key=b"gang/torch_master", value=b"10.6.6.6:666"),
        "Heartbeat": xla_pb2.HeartbeatRequest(session_id=session_id, node_id=node),
        "EnumerateDevices": xla_pb2.EnumerateDevicesRequest(
            session_id=session_id, local_topology=xla_pb2.LocalTopologyProto(node_id=node)),
        "Shutdown": xla_pb2.ShutdownRequest(session_id=session_id, node_id=node),
    }
    codes: dict[str, str] = {}
    with grpc.insecure_channel(address) as channel:
        stub = xla_pb2_grpc.DistributedRuntimeServiceStub(channel)
        for method, request in requests.items():
            for name, metadata in (credentials or CREDENTIALS).items():
                try:
                    getattr(stub, method)(request, timeout=5, metadata=metadata)
                    codes[f"{method}/{name}"] = "OK"
                except grpc.RpcError as err:
                    codes[f"{method}/{name}"] = err.code().name
    return codes
