"""The head serves the Scheduler and ObjStore gRPC services on a unix socket."""
from __future__ import annotations

import os
import time

import cloudpickle
import grpc
import pytest

import orchestra
from _probes import wait_until
from orchestra._proto import orchestra_pb2_grpc as rpc
from orchestra._protocol import pb

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def channel():
    info = orchestra.init(num_cpus=2)
    path = os.path.join(info["session_dir"], "grpc.sock")
    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the head did not start its gRPC server"
        time.sleep(0.05)
    ch = grpc.insecure_channel(f"unix:{path}")
    try:
        yield ch
    finally:
        ch.close()
        orchestra.shutdown()


def test_socket_is_private(channel):
    path = channel._channel.target().decode().removeprefix("unix:")
    assert os.stat(path).st_mode & 0o077 == 0


def test_debug_info_lists_workers_objects_and_resources(channel):
    @orchestra.remote
    def one():
        return 1

    ref = one.remote()
    assert orchestra.get(ref) == 1
    info = rpc.SchedulerStub(channel).SchedulerDebugInfo(pb.SchedulerDebugInfoRequest(), timeout=10)
    assert dict(info.total_resources)["CPU"] == 2.0
    assert any(w.pid > 0 for w in info.workers)
    assert ref.binary() in [o.objref for o in info.objects]


def test_register_function_remote_call_request_obj(channel):
    stub = rpc.SchedulerStub(channel)
    fid = os.urandom(16)
    stub.RegisterFunction(pb.RegisterFunctionRequest(
        function_id=fid, fnname="add", pickled=cloudpickle.dumps(lambda a, b: a + b)), timeout=10)
    call = pb.Call(task_id=os.urandom(12), function_id=fid, num_returns=1, resources={"CPU": 1},
                   name="add", args=[pb.Value(inline=cloudpickle.dumps(2)),
                                     pb.Value(inline=cloudpickle.dumps(40))])
    reply = stub.RemoteCall(pb.RemoteCallRequest(call=call), timeout=10)
    data = stub.RequestObj(pb.RequestObjRequest(objref=reply.result[0], timeout_s=10), timeout=20)
    assert cloudpickle.loads(data.inline) == 42
    stub.DecrementCount(pb.ChangeCountRequest(objref=list(reply.result)), timeout=10)
    deadline = time.monotonic() + 10
    while reply.result[0] in [o.objref for o in
                              stub.SchedulerDebugInfo(pb.SchedulerDebugInfoRequest(), timeout=10).objects]:
        assert time.monotonic() < deadline, "the object was not freed after DecrementCount"
        time.sleep(0.05)


def test_remote_call_of_unknown_function_is_refused(channel):
    call = pb.Call(task_id=os.urandom(12), function_id=os.urandom(16), num_returns=1, name="x")
    with pytest.raises(grpc.RpcError) as info:
        rpc.SchedulerStub(channel).RemoteCall(pb.RemoteCallRequest(call=call), timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_objstore_debug_info_lists_large_objects(channel):
    ref = orchestra.put(b"x" * (1 << 20))
    stub = rpc.ObjStoreStub(channel)
    # Another connection than the driver's: it sees the put once the driver's batch of
    # puts reaches the head (its next frame, or its background thread's next round).
    wait_until(lambda: ref.binary() in stub.ObjStoreDebugInfo(
        pb.ObjStoreDebugInfoRequest(), timeout=10, wait_for_ready=True).objref, 5, "the put listed")
    reply = stub.ObjStoreDebugInfo(pb.ObjStoreDebugInfoRequest(), timeout=10)
    assert reply.used >= 1 << 20 and reply.capacity > reply.used
    seg = reply.segment[list(reply.objref).index(ref.binary())]
    assert seg.name and seg.size > 1 << 20 and seg.capacity >= seg.size


def test_an_object_pushed_over_grpc_is_an_argument_and_is_read_back(channel):
    stub = rpc.SchedulerStub(channel)
    oid = os.urandom(16)
    pushed = pb.ObjectData(object_id=oid, inline=cloudpickle.dumps(40))
    assert stub.PushObj(pb.PushObjRequest(obj=pushed), timeout=10).objref == oid
    assert stub.RequestObj(pb.RequestObjRequest(objref=oid, timeout_s=10), timeout=20) == pushed
    fid = os.urandom(16)
    stub.RegisterFunction(pb.RegisterFunctionRequest(
        function_id=fid, fnname="inc", pickled=cloudpickle.dumps(lambda a: a + 2)), timeout=10)
    call = pb.Call(task_id=os.urandom(12), function_id=fid, num_returns=1, resources={"CPU": 1},
                   name="inc", args=[pb.Value(ref=oid)])
    reply = stub.RemoteCall(pb.RemoteCallRequest(call=call), timeout=10)
    data = stub.RequestObj(pb.RequestObjRequest(objref=reply.result[0], timeout_s=10), timeout=20)
    assert cloudpickle.loads(data.inline) == 42
