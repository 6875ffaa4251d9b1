"""Protocol definitions of the kubelet APIs the enricher calls.

``api.proto`` is the source; ``api_pb2`` and ``api_pb2_grpc`` are generated from it by the build
(``pip install .`` or ``pip install -e .``) and are not kept in git.
"""
