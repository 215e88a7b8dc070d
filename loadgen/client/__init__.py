"""The hot path: clock, transport, runner and recorder; it sends the plan and stamps every token."""
