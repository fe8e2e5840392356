"""One namespace for the generated messages of orchestra.proto and types.proto."""
from .._proto.orchestra_pb2 import *  # noqa: F401,F403
from .._proto.types_pb2 import *  # noqa: F401,F403
