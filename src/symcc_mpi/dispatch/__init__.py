"""Pure dispatch state machines: compensating transactions, their tables, resources, watchdog."""
