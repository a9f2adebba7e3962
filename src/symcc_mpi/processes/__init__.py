"""What a rank needs of its own node to run child processes: node-local scratch directories
and the 4-byte pipe words forkservers speak.

May import: durable, config."""
