"""Pure dispatch state machines: compensating transactions, their tables, the object transfer
cache, the watchdog, and the coordinator the master composes them into."""
