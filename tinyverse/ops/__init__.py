"""The operator tools: conveniences around the core that start, watch, stop or move what a user
could by hand."""
