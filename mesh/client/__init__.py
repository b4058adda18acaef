"""The Python client, shaped like kafka-python: Producer, Consumer, Admin."""
from mesh.client.admin import Admin
from mesh.wire.types import TopicPartition
from mesh.client.consumer import Consumer
from mesh.client.group_admin import GroupAdmin
from mesh.client.producer import Producer, RecordFuture, RecordMetadata
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import Record

__all__ = ["Admin", "Consumer", "GroupAdmin", "Producer", "RecordFuture", "RecordMetadata", "Record",
           "TopicPartition", "ErrorCode", "MeshError"]
