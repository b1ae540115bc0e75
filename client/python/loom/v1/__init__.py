"""Loom's API messages and stubs (job_pb2, job_pb2_grpc, node_pb2, plan_pb2, rollout_pb2), generated
from proto/loom/v1 when the package is built."""
