"""Generated protobuf and gRPC code for package pagesift.v1 (make proto; never edit by hand)."""
