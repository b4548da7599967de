"""The collective pipeline: slice maps per operator, the partitioner, the backend that moves the bytes."""
