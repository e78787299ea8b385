"""Server reflection, ``grpc.reflection.v1`` as well as ``grpc.reflection.v1alpha``.

grpcio-reflection (1.85.1, the newest release) ships only the ``v1alpha`` service,
whose proto is marked deprecated; current tools (grpcurl, grpcui, Postman) ask for
``grpc.reflection.v1.ServerReflection`` first. The v1 proto is v1alpha's with another
package: the same messages with the same field numbers, so the same bytes on the wire.
``enable`` therefore serves v1 with v1alpha's servicer and codecs, and adds the v1
file (v1alpha's descriptor under the v1 package) to the descriptor pool so that
reflection can describe v1 itself. Once grpcio-reflection ships v1, this module
becomes a call of its ``enable_server_reflection``.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1_PACKAGE = "grpc.reflection.v1"
V1 = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def _v1_file() -> None:
    """Add the v1 reflection proto to the default pool (once; kept when already there)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old = f".{fdp.package}."
    fdp.name, fdp.package = V1_FILE, V1_PACKAGE
    fdp.ClearField("options")
    for message in fdp.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, f".{V1_PACKAGE}.")
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, f".{V1_PACKAGE}.")
            method.output_type = method.output_type.replace(old, f".{V1_PACKAGE}.")
    pool.AddSerializedFile(fdp.SerializeToString())


def enable(service_names: Sequence[str], server: grpc.aio.Server) -> tuple[str, ...]:
    """Serve reflection v1 and v1alpha on ``server`` for ``service_names`` (and both
    reflection services); returns every name reflection lists."""
    _v1_file()
    names = (*service_names, V1, V1ALPHA)
    reflection.enable_server_reflection(names, server)  # v1alpha
    servicer = reflection_aio.ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1, {"ServerReflectionInfo": handler}),)
    )
    return names
