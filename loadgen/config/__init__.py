"""What the user wrote: the workload file, flags, client options and credentials, parsed and checked."""
